//! Retention: terminal runs that finished more than
//! `retention.keep_days` ago are deleted with their step history, callback
//! deliveries and operator actions (`ON DELETE CASCADE`), in batches of
//! `retention.batch`, every `retention.interval_secs`, by every daemon.
//!
//! Each batch is one short statement with `FOR UPDATE SKIP LOCKED`, so
//! daemons running it at once split the work instead of waiting, and no
//! long transaction holds back vacuum. Unfinished runs are never touched.
//! `raw_logs` and `lsm_storage` are the users' memory, not history: they stay
//! unless `retention.logs_keep_days` (turns by age) or
//! `retention.memory_keep_days` (records by the end of their period) is set,
//! with the same batching; each batch bumps the memory version of the users
//! it touched. It runs as the daemon service [`Retention`].

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::db::{self, Pool};
use crate::repo;
use crate::service::Service;

/// Pause between batches, so a large backlog is deleted without hogging I/O.
const BETWEEN_BATCHES: Duration = Duration::from_millis(20);

/// What one pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Removed {
    pub runs: i64,
    pub actions: i64,
    pub turns: i64,
    pub records: i64,
}

/// The age limits of one pass; `None`: that table is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Keep {
    pub runs: Option<Duration>,
    pub turns: Option<Duration>,
    pub records: Option<Duration>,
}

impl Keep {
    pub fn from_config(cfg: &Config) -> Keep {
        Keep {
            runs: cfg.retention.keep(),
            turns: cfg.retention.logs_keep(),
            records: cfg.retention.memory_keep(),
        }
    }
}

/// Retention passes as a daemon service.
pub struct Retention {
    pool: Pool,
    cfg: Arc<Config>,
}

impl Retention {
    pub fn new(pool: Pool, cfg: Arc<Config>) -> Retention {
        Retention { pool, cfg }
    }
}

impl Service for Retention {
    fn name(&self) -> &'static str {
        "retention"
    }

    fn run(self: Arc<Self>, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        run(self.pool.clone(), self.cfg.clone(), shutdown).boxed()
    }
}

/// Runs retention passes until `shutdown`.
pub async fn run(pool: Pool, cfg: Arc<Config>, shutdown: CancellationToken) {
    let keep = Keep::from_config(&cfg);
    if keep == Keep::default() {
        tracing::info!(
            "retention: off (retention.keep_days, logs_keep_days and memory_keep_days are 0); everything is kept"
        );
        return;
    }
    let interval = Duration::from_secs(cfg.retention.interval_secs);
    // The first pass comes after a random part of the interval, so daemons
    // started together do not delete in lockstep.
    let mut wait = interval.mul_f64(rand::random_range(0.1..=1.0));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        match pass(&pool, keep, cfg.retention.batch, &shutdown).await {
            Ok(r) if r.runs > 0 || r.actions > 0 || r.turns > 0 || r.records > 0 => {
                tracing::info!(
                    runs = r.runs,
                    actions = r.actions,
                    turns = r.turns,
                    records = r.records,
                    keep_days = cfg.retention.keep_days,
                    logs_keep_days = cfg.retention.logs_keep_days,
                    memory_keep_days = cfg.retention.memory_keep_days,
                    "retention: deleted finished runs past their age"
                );
            }
            Ok(_) => tracing::trace!("retention: nothing to delete"),
            Err(e) => tracing::warn!(error = %e, "retention pass failed; trying again next interval"),
        }
        wait = interval.mul_f64(rand::random_range(0.9..=1.1));
    }
}

/// One pass: deletes batches until none is full (or `stop` fires).
pub async fn pass(pool: &Pool, keep: Keep, batch: usize, stop: &CancellationToken) -> Result<Removed, db::Error> {
    let client = pool.get().await?;
    let mut removed = Removed::default();
    if let Some(k) = keep.runs {
        removed.runs = drain(&client, Table::Requests, k, batch, stop).await?;
        removed.actions = drain(&client, Table::Actions, k, batch, stop).await?;
    }
    if let Some(k) = keep.turns {
        removed.turns = drain(&client, Table::Turns, k, batch, stop).await?;
    }
    if let Some(k) = keep.records {
        removed.records = drain(&client, Table::Records, k, batch, stop).await?;
    }
    Ok(removed)
}

/// The tables a pass deletes from, in this order.
#[derive(Debug, Clone, Copy)]
enum Table {
    Requests,
    Actions,
    Turns,
    Records,
}

/// Deletes batches from one table until one is not full (or `stop` fires);
/// returns how many rows went.
async fn drain(
    client: &deadpool_postgres::Client,
    table: Table,
    keep: Duration,
    batch: usize,
    stop: &CancellationToken,
) -> Result<i64, db::Error> {
    let full = i64::try_from(batch).unwrap_or(i64::MAX);
    let mut removed = 0;
    loop {
        let n = match table {
            Table::Requests => repo::retention::delete_requests(client, keep, batch).await?,
            Table::Actions => repo::retention::delete_actions(client, keep, batch).await?,
            Table::Turns => repo::retention::delete_turns(client, keep, batch).await?,
            Table::Records => repo::retention::delete_records(client, keep, batch).await?,
        };
        removed += n;
        if n < full || stop.is_cancelled() {
            return Ok(removed);
        }
        tokio::time::sleep(BETWEEN_BATCHES).await;
    }
}
