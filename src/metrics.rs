//! Prometheus metrics of one `maasd` process, prefixed `maas_`.
//!
//! Built on the `metrics` facade: any module records a series with one macro
//! call (or one of the typed hooks below) and no handle to pass around; the
//! process-wide recorder ([`install`]) renders classic Prometheus text
//! (format 0.0.4) on the HTTP server's `/metrics`.
//!
//! Where each series comes from:
//! - **Engine counters** ([`observe_engine`], at every scrape): the
//!   dispatcher's [`Stats`] atomics — claims, successes, retries, failures,
//!   leases lost/reclaimed/released, sweep recoveries, notifications, junk
//!   payloads, listener reconnects. These count what *this* process did, so
//!   a sum over daemons is the cluster's total.
//! - **Backlog** ([`observe_backlog`], every `http.metrics_refresh_secs`):
//!   one cheap query over partial indexes, requests by non-terminal status and
//!   the number of `FAILED` requests (database-wide: the same in every daemon).
//! - **Latency histograms** ([`observe_result`], [`observe_stage`]): fed by
//!   the dispatcher as each result is written, so they never lag.
//! - **LLM calls**: recorded by the LLM layer itself, once per `Llm::chat`
//!   ([`crate::llm::metrics`]); [`register_llm_provider`] makes the zero
//!   series of the configured provider appear before any call. This module
//!   only describes them; it does not depend on the LLM types.
//! - **HTTP** ([`http_request`], [`StreamGauge`]): requests by route and code,
//!   open streams, waiting long-polls.
//! - **Waits for a person** (`waits.rs`): requests waiting by kind, waits
//!   past their limit, how long waits lasted, expiries.
//! - **On-call series** (`oncall.rs`): table sizes, the claim loop's polls,
//!   failures by class, memory found, context size, callbacks, archivist
//!   runs, and the database-wide gauges the alert rules use.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use chrono::{DateTime, Utc};

use crate::model::{Outcome, StageKind, Status};
use crate::repo::Finished;

mod oncall;
mod waits;
pub use oncall::*;
pub use waits::{observe_expiry, observe_review, observe_waiting, wait_kind};

/// Content type of [`PrometheusHandle::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets of every `_seconds` histogram: 5 ms to 5 min.
const SECONDS_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

static HANDLE: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

#[derive(Debug, thiserror::Error)]
#[error("metrics: {0}")]
pub struct MetricsError(String);

/// Installs the process-wide recorder (once; later calls return the same
/// handle). Call `run_upkeep` on the handle periodically.
pub fn install() -> Result<PrometheusHandle, MetricsError> {
    let mut slot = HANDLE
        .lock()
        .map_err(|_| MetricsError("recorder lock poisoned".into()))?;
    if let Some(h) = slot.as_ref() {
        return Ok(h.clone());
    }
    let handle = PrometheusBuilder::new()
        // (a full name's buckets win over a suffix's)
        .set_buckets_for_metric(Matcher::Full("maas_wait_seconds".into()), waits::WAIT_BUCKETS)
        .map_err(|e| MetricsError(e.to_string()))?
        .set_buckets_for_metric(
            Matcher::Full("maas_memory_search_duration_seconds".into()),
            oncall::MEMORY_SEARCH_BUCKETS,
        )
        .map_err(|e| MetricsError(e.to_string()))?
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .map_err(|e| MetricsError(e.to_string()))?
        .set_buckets_for_metric(Matcher::Suffix("_tokens".into()), oncall::TOKEN_BUCKETS)
        .map_err(|e| MetricsError(e.to_string()))?
        .install_recorder()
        .map_err(|e| MetricsError(e.to_string()))?;
    describe();
    oncall::register();
    waits::register();
    *slot = Some(handle.clone());
    Ok(handle)
}

/// What a described series is.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    /// A histogram of seconds.
    Seconds,
    /// A histogram of tokens.
    Tokens,
}

/// Every series this process exports: (kind, name, help).
const DESCRIPTIONS: &[(Kind, &str, &str)] = &[
    (
        Kind::Gauge,
        "maas_backlog_requests",
        "Requests not yet terminal, by status (database-wide)",
    ),
    (
        Kind::Gauge,
        "maas_failed_requests",
        "Requests in status FAILED (database-wide)",
    ),
    (
        Kind::Seconds,
        "maas_request_duration_seconds",
        "End to end: submitted to completed or failed, for requests this daemon finished",
    ),
    (
        Kind::Seconds,
        "maas_stage_duration_seconds",
        "One stage attempt, by stage and outcome (this daemon)",
    ),
    (
        Kind::Counter,
        "maas_requests_completed_total",
        "Requests this daemon completed (throughput: rate() of it)",
    ),
    (
        Kind::Counter,
        "maas_requests_failed_total",
        "Requests this daemon moved to FAILED",
    ),
    (
        Kind::Counter,
        "maas_stage_claims_total",
        "Stage attempts claimed, by stage",
    ),
    (
        Kind::Counter,
        "maas_stage_succeeded_total",
        "Stage attempts that succeeded, by stage",
    ),
    (
        Kind::Counter,
        "maas_stage_retries_total",
        "Stage attempts that failed or were deferred and were scheduled again, by stage",
    ),
    (
        Kind::Counter,
        "maas_leases_lost_total",
        "Results discarded because the lease was lost",
    ),
    (
        Kind::Counter,
        "maas_leases_reclaimed_total",
        "Expired leases the sweep took back",
    ),
    (
        Kind::Counter,
        "maas_leases_released_total",
        "Leases given back at shutdown",
    ),
    (
        Kind::Counter,
        "maas_sweep_recovered_total",
        "Rows the sweep found due that no notification had delivered",
    ),
    (
        Kind::Counter,
        "maas_listener_notifications_total",
        "Valid notifications received",
    ),
    (
        Kind::Counter,
        "maas_listener_junk_total",
        "Notifications skipped as junk",
    ),
    (
        Kind::Counter,
        "maas_listener_reconnects_total",
        "Reconnects of the LISTEN session",
    ),
    (
        Kind::Gauge,
        "maas_listener_connected",
        "1 while the LISTEN session is up",
    ),
    (
        Kind::Counter,
        "maas_llm_calls_total",
        "LLM calls by provider, role and outcome (ok or error class)",
    ),
    (
        Kind::Counter,
        "maas_llm_tokens_total",
        "LLM tokens by provider, role and kind (prompt, completion)",
    ),
    (
        Kind::Counter,
        "maas_llm_tenant_tokens_total",
        "LLM tokens by tenant (name) and kind (prompt, completion)",
    ),
    (
        Kind::Counter,
        "maas_llm_rate_limited_total",
        "LLM calls refused by a rate limit",
    ),
    (Kind::Counter, "maas_llm_timeouts_total", "LLM calls that timed out"),
    (
        Kind::Seconds,
        "maas_llm_call_duration_seconds",
        "Latency of successful LLM calls",
    ),
    (
        Kind::Counter,
        "maas_http_requests_total",
        "HTTP requests by route and status code",
    ),
    (
        Kind::Seconds,
        "maas_http_request_duration_seconds",
        "Time to produce an HTTP response (streams: until their headers)",
    ),
    (
        Kind::Gauge,
        "maas_http_open_streams",
        "Open live streams by kind (websocket, sse)",
    ),
    (
        Kind::Gauge,
        "maas_http_waiting_long_polls",
        "Long-polls waiting for their request",
    ),
    (
        Kind::Counter,
        "maas_poison_total",
        "Bad values in stage results by kind (nul, oversize, nesting: sanitised; refused, unwritable: that request failed)",
    ),
    (
        Kind::Counter,
        "maas_live_resyncs_total",
        "Live subscribers re-read from the database (lag, listener reconnect)",
    ),
];

fn describe() {
    for &(kind, name, help) in DESCRIPTIONS
        .iter()
        .chain(oncall::DESCRIPTIONS)
        .chain(waits::DESCRIPTIONS)
    {
        match kind {
            Kind::Counter => describe_counter!(name, help),
            Kind::Gauge => describe_gauge!(name, help),
            Kind::Seconds => describe_histogram!(name, metrics::Unit::Seconds, help),
            Kind::Tokens => describe_histogram!(name, help),
        }
    }
}

/// Makes the HTTP gauges visible (at zero) before any stream opens.
pub fn register_http() {
    gauge!("maas_http_waiting_long_polls").set(0.0);
    for kind in ["websocket", "sse"] {
        gauge!("maas_http_open_streams", "kind" => kind).set(0.0);
    }
}

/// Counters of one daemon (the engine's and its LISTEN session's), read by
/// tests, logs and [`observe_engine`]. Defined here, not in the dispatcher,
/// so dependencies go one way: the dispatcher and the listener feed
/// metrics, metrics knows neither.
#[derive(Debug, Default)]
pub struct Stats {
    pub claimed: [AtomicU64; 3],
    pub succeeded: [AtomicU64; 3],
    /// By stage, like `claimed`.
    pub retried: [AtomicU64; 3],
    pub failed: AtomicU64,
    pub released: AtomicU64,
    pub lease_lost: AtomicU64,
    pub reclaimed: AtomicU64,
    pub sweep_recovered: AtomicU64,
    pub notifications: AtomicU64,
    pub junk_payloads: AtomicU64,
    pub listener_connects: AtomicU64,
    pub listener_reconnects: AtomicU64,
}

/// Copies the dispatcher's counters into their series.
pub fn observe_engine(stats: &Stats, listening: bool) {
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    for stage in StageKind::ALL {
        let i = stage.index();
        counter!("maas_stage_claims_total", "stage" => stage.as_str()).absolute(get(&stats.claimed[i]));
        counter!("maas_stage_succeeded_total", "stage" => stage.as_str()).absolute(get(&stats.succeeded[i]));
        counter!("maas_stage_retries_total", "stage" => stage.as_str()).absolute(get(&stats.retried[i]));
    }
    let totals: [(&'static str, &AtomicU64); 9] = [
        (
            "maas_requests_completed_total",
            &stats.succeeded[StageKind::Respond.index()],
        ),
        ("maas_requests_failed_total", &stats.failed),
        ("maas_leases_lost_total", &stats.lease_lost),
        ("maas_leases_reclaimed_total", &stats.reclaimed),
        ("maas_leases_released_total", &stats.released),
        ("maas_sweep_recovered_total", &stats.sweep_recovered),
        ("maas_listener_notifications_total", &stats.notifications),
        ("maas_listener_junk_total", &stats.junk_payloads),
        ("maas_listener_reconnects_total", &stats.listener_reconnects),
    ];
    for (name, c) in totals {
        counter!(name).absolute(get(c));
    }
    gauge!("maas_listener_connected").set(if listening { 1.0 } else { 0.0 });
}

/// Sets the backlog gauges from `count_backlog` rows; statuses absent from
/// the rows are zero.
pub fn observe_backlog(rows: &[(Status, i64)]) {
    #[allow(
        clippy::cast_precision_loss,
        reason = "a gauge is a float; counts stay far below 2^52"
    )]
    let count = |st: Status| rows.iter().filter(|(s, _)| *s == st).map(|(_, n)| *n).sum::<i64>() as f64;
    for st in Status::ALL {
        // (waits have their own series: `maas_requests_waiting`)
        if st.is_terminal() || st.is_waiting() {
            continue;
        }
        gauge!("maas_backlog_requests", "status" => st.as_str()).set(count(st));
    }
    gauge!("maas_failed_requests").set(count(Status::Failed));
}

/// Records one applied stage result in the latency histograms: how long the
/// stage ran (the measured latency, else start to `now`) and, for a
/// request's last step, how long since it was submitted.
pub fn observe_result(f: &Finished, created_at: DateTime<Utc>, now: DateTime<Utc>) {
    let secs = |from: DateTime<Utc>| (now - from).as_seconds_f64().max(0.0);
    let stage_secs = f
        .latency_ms
        .map_or_else(|| secs(f.started_at), |ms| f64::from(ms.max(0)) / 1000.0);
    record_stage(f.stage, f.outcome(), stage_secs);
    let outcome = match (f.stage, f.outcome()) {
        // (an answer that awaits review completes when it is approved)
        (StageKind::Respond, Outcome::Succeeded) if f.new_status() == Status::AwaitingReview => None,
        (StageKind::Respond, Outcome::Succeeded) => Some("completed"),
        (_, Outcome::Failed) => Some("failed"),
        _ => None,
    };
    if let Some(outcome) = outcome {
        histogram!("maas_request_duration_seconds", "outcome" => outcome).record(secs(created_at));
    }
}

/// Records a request completed by a result of another stage (the respond
/// stage fused with its analyze, see `Engine::respond_early`).
pub fn observe_completed(created_at: DateTime<Utc>, now: DateTime<Utc>) {
    let secs = (now - created_at).as_seconds_f64().max(0.0);
    histogram!("maas_request_duration_seconds", "outcome" => "completed").record(secs);
}

/// Records a stage that ran without a result of its own (the assemble
/// stage fused with its analyze, see `Engine::fuse`).
pub fn observe_stage(stage: StageKind, outcome: Outcome, latency_ms: i32) {
    record_stage(stage, outcome, f64::from(latency_ms.max(0)) / 1000.0);
}

fn record_stage(stage: StageKind, outcome: Outcome, secs: f64) {
    histogram!("maas_stage_duration_seconds", "stage" => stage.as_str(), "outcome" => outcome.as_str()).record(secs);
}

/// Makes the LLM series of `provider` visible (at zero) before any call;
/// the LLM layer owns its series ([`crate::llm::metrics`]).
pub use crate::llm::metrics::register_provider as register_llm_provider;

/// One HTTP request, by matched route and status code.
pub fn http_request(route: &str, code: u16, secs: f64) {
    counter!("maas_http_requests_total", "route" => route.to_owned(), "code" => code.to_string()).increment(1);
    histogram!("maas_http_request_duration_seconds", "route" => route.to_owned()).record(secs);
}

/// A live stream or waiting long-poll, counted while this guard lives.
pub struct StreamGauge(metrics::Gauge);

impl StreamGauge {
    /// An open stream of `kind` (`websocket`, `sse`).
    pub fn stream(kind: &'static str) -> StreamGauge {
        let g = gauge!("maas_http_open_streams", "kind" => kind);
        g.increment(1.0);
        StreamGauge(g)
    }

    /// A long-poll waiting for its request.
    pub fn long_poll() -> StreamGauge {
        let g = gauge!("maas_http_waiting_long_polls");
        g.increment(1.0);
        StreamGauge(g)
    }
}

impl Drop for StreamGauge {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// LLM tokens one attempt spent for a tenant.
pub fn tenant_llm_tokens(tenant: &str, prompt: u64, completion: u64) {
    let t = tenant.to_owned();
    counter!("maas_llm_tenant_tokens_total", "tenant" => t.clone(), "kind" => "prompt").increment(prompt);
    counter!("maas_llm_tenant_tokens_total", "tenant" => t, "kind" => "completion").increment(completion);
}

/// Whether a sample line carries a `tenant` label.
fn has_tenant_label(line: &str) -> bool {
    line.split_once('{')
        .is_some_and(|(_, labels)| labels.starts_with("tenant=\"") || labels.contains(",tenant=\""))
}

/// The rendered exposition without the series labelled with a tenant (and
/// the `# HELP` / `# TYPE` lines of a family left with no sample by that):
/// what an unauthenticated scrape sees unless `metrics.public_tenants` is
/// set.
pub fn without_tenants(text: &str) -> String {
    let name = |l: &str| l.split(['{', ' ']).next().unwrap_or_default().to_owned();
    let samples = text.lines().filter(|l| !l.starts_with('#'));
    let (removed, kept): (Vec<&str>, Vec<&str>) = samples.partition(|l| has_tenant_label(l));
    let removed: Vec<String> = removed.into_iter().map(name).collect();
    let kept: Vec<String> = kept.into_iter().map(name).collect();
    let emptied =
        |family: &str| removed.iter().any(|n| n.starts_with(family)) && !kept.iter().any(|n| n.starts_with(family));
    let mut out = String::with_capacity(text.len());
    for line in text.lines().filter(|l| !has_tenant_label(l)) {
        let family = line
            .strip_prefix("# HELP ")
            .or_else(|| line.strip_prefix("# TYPE "))
            .and_then(|rest| rest.split(' ').next());
        if family.is_some_and(emptied) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// A live subscriber re-read its state from the database.
pub fn live_resync(reason: &'static str) {
    counter!("maas_live_resyncs_total", "reason" => reason).increment(1);
}

/// A stage result carried a bad value of `kind` (`crate::sanitize::Poison`).
pub fn poison(kind: &'static str) {
    counter!("maas_poison_total", "kind" => kind).increment(1);
}

/// Makes `maas_poison_total{kind}` visible at zero for each of `kinds`.
pub fn register_poison(kinds: impl IntoIterator<Item = &'static str>) {
    for kind in kinds {
        counter!("maas_poison_total", "kind" => kind).increment(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_series_and_their_empty_families_are_left_out() {
        let text = "# HELP maas_llm_tenant_tokens_total LLM tokens by tenant\n\
                    # TYPE maas_llm_tenant_tokens_total counter\n\
                    maas_llm_tenant_tokens_total{tenant=\"acme\",kind=\"prompt\"} 3\n\
                    maas_llm_tenant_tokens_total{kind=\"completion\",tenant=\"acme\"} 1\n\
                    # HELP maas_http_requests_total HTTP requests\n\
                    # TYPE maas_http_requests_total counter\n\
                    maas_http_requests_total{route=\"/api/query\",code=\"202\"} 5\n\
                    maas_x{not_tenant=\"a\"} 1\n";
        let out = without_tenants(text);
        assert!(!out.contains("acme") && !out.contains("tenant_tokens"), "{out}");
        assert!(out.contains("# TYPE maas_http_requests_total counter\nmaas_http_requests_total{"));
        assert!(out.contains("maas_x{not_tenant=\"a\"} 1\n"));
    }
}
