//! The HTTP side's background upkeep, as two daemon services.
//!
//! - [`MetricsRefresh`]: every `http.metrics_refresh_secs`, the exporter's
//!   upkeep, the engine counters, the backlog gauges and the on-call gauges
//!   (table sizes from the statistics views, the oldest due request, expired
//!   leases, the notification queue, the callback outbox, the last archive
//!   run; the latency histograms are fed as results are written). A
//!   database that cannot be read skips the gauges until the next tick; the
//!   counters still update.
//! - [`IdempotencyExpiry`]: every minute, deletes idempotency keys older
//!   than `http.idempotency_ttl_secs`, at most 10,000 per pass.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::db::Pool;
use crate::listener::Notifier;
use crate::metrics::Stats;
use crate::service::{self, Service};

/// How often expired idempotency keys are deleted.
const EXPIRY_INTERVAL: Duration = Duration::from_secs(60);

/// Keys deleted per pass at most.
const EXPIRY_BATCH: i64 = 10_000;

/// Backlog gauges, engine counters and the exporter's upkeep.
pub struct MetricsRefresh {
    pool: Pool,
    cfg: Arc<Config>,
    stats: Arc<Stats>,
    notifier: Arc<Notifier>,
    handle: PrometheusHandle,
}

impl MetricsRefresh {
    pub fn new(
        pool: Pool,
        cfg: Arc<Config>,
        stats: Arc<Stats>,
        notifier: Arc<Notifier>,
        handle: PrometheusHandle,
    ) -> MetricsRefresh {
        MetricsRefresh {
            pool,
            cfg,
            stats,
            notifier,
            handle,
        }
    }

    async fn run_loop(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.cfg.http.metrics_refresh());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if !service::next_tick(&mut tick, &shutdown).await {
                return;
            }
            self.handle.run_upkeep();
            crate::metrics::observe_engine(&self.stats, self.notifier.is_listening());
            let Some(client) = service::connection(&self.pool, self.name()).await else {
                continue;
            };
            match crate::repo::requests::count_backlog(&client).await {
                Ok(rows) => crate::metrics::observe_backlog(&rows),
                Err(e) => tracing::debug!(error = %e, "metrics: backlog query failed"),
            }
            let figures = database_figures(&client).await;
            crate::metrics::observe_database(&figures, self.cfg.archivist.enabled);
        }
    }
}

/// The on-call gauges' database-wide figures: statistics views, partial
/// indexes and one-row reads only. A failed read leaves its gauge as it was.
async fn database_figures(client: &deadpool_postgres::Object) -> crate::metrics::DatabaseFigures {
    use crate::repo::{gauges, requests, stats};
    fn ok<T>(r: Result<T, crate::db::Error>, what: &str) -> Option<T> {
        r.map_err(|e| tracing::debug!(error = %e, "metrics: {what} query failed"))
            .ok()
    }
    let tables = ok(gauges::table_sizes(client).await, "table size")
        .map(|rows| rows.into_iter().map(|t| (t.table_name, t.live_rows, t.bytes)).collect());
    let oldest_due = ok(requests::due_counts(client).await, "due count")
        .map(|rows| rows.into_iter().map(|(status, _, secs)| (status, secs)).collect());
    let callbacks = ok(stats::callbacks(client).await, "callback").map(|c| (c.pending, c.dead, c.oldest_pending_secs));
    crate::metrics::DatabaseFigures {
        tables,
        oldest_due,
        leases_expired: ok(requests::count_expired_leases(client).await, "expired lease"),
        notification_queue_usage: ok(stats::notification_queue_usage(client).await, "notification queue"),
        callbacks,
        last_archive_run: ok(gauges::last_archive_run(client).await, "archive run")
            .map(|r| r.map(|r| (r.finished_at, r.failures))),
        waiting: ok(gauges::waiting(client).await, "waiting")
            .map(|rows| rows.into_iter().map(|w| (w.status, w.n, w.overdue)).collect()),
    }
}

impl Service for MetricsRefresh {
    fn name(&self) -> &'static str {
        "metrics-refresh"
    }

    fn run(self: Arc<Self>, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        self.run_loop(shutdown).boxed()
    }
}

/// Deletes expired idempotency keys.
pub struct IdempotencyExpiry {
    pool: Pool,
    cfg: Arc<Config>,
}

impl IdempotencyExpiry {
    pub fn new(pool: Pool, cfg: Arc<Config>) -> IdempotencyExpiry {
        IdempotencyExpiry { pool, cfg }
    }

    async fn run_loop(self: Arc<Self>, shutdown: CancellationToken) {
        let start = tokio::time::Instant::now() + EXPIRY_INTERVAL;
        let mut tick = tokio::time::interval_at(start, EXPIRY_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if !service::next_tick(&mut tick, &shutdown).await {
                return;
            }
            let Some(client) = service::connection(&self.pool, self.name()).await else {
                continue;
            };
            let ttl = self.cfg.http.idempotency_ttl();
            match crate::repo::idempotency::expire(&client, ttl, EXPIRY_BATCH).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(keys = n, "http: expired idempotency keys deleted"),
                Err(e) => tracing::debug!(error = %e, "http: could not delete expired idempotency keys"),
            }
        }
    }
}

impl Service for IdempotencyExpiry {
    fn name(&self) -> &'static str {
        "idempotency-expiry"
    }

    fn run(self: Arc<Self>, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        self.run_loop(shutdown).boxed()
    }
}
