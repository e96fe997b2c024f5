//! The series an on-call engineer alerts on (table sizes, the claim loop's
//! polls, the outbox, archive runs), beside the engine's in the parent module.
//!
//! Guarantees:
//! - Every label is bounded: stages, statuses, three tables, fixed outcome
//!   words, and error classes folded into [`failure_class`]'s list (any
//!   other class is `unknown`: the "unknown error" an alert watches).
//! - Per-process series are fed where the event happens (the claim loop,
//!   the completer, the callback worker, the archivist); a sum over daemons
//!   is the cluster's total.
//! - Database-wide gauges ([`observe_database`]) come from the statistics
//!   views and partial indexes on the metrics refresh's schedule, never from
//!   a `count(*)` over a big table at scrape time; every daemon exports the
//!   same value, so a dashboard takes their `max`.
//! - The stage layer records its own series (`maas_analyses_total`,
//!   `maas_context_tokens`, `maas_contexts_total`) through the facade, like
//!   the LLM layer; they are only described here.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

use super::Kind;
use crate::model::{Outcome, StageKind, Status};

/// Buckets of the `_tokens` histograms: 16 to 64k tokens.
pub(super) const TOKEN_BUCKETS: &[f64] = &[
    16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0,
];

/// Buckets of `maas_memory_search_duration_seconds`: 1 ms to 5 s (a
/// search takes a few milliseconds; the `_seconds` default starts at 5).
pub(super) const MEMORY_SEARCH_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

/// Outcomes of one memory read (the `result` label of its duration).
pub const MEMORY_SEARCH_RESULTS: [&str; 3] = ["ok", "error", "timeout"];

/// The tables whose size is exported (`maas_table_rows`, `maas_table_bytes`).
pub const TABLES: [&str; 3] = ["pipeline_runs", "raw_logs", "lsm_storage"];

/// Outcomes of one claim statement (the `result` label of the poll series).
pub const POLL_RESULTS: [&str; 3] = ["processed", "empty", "error"];

/// Outcomes of one callback delivery attempt.
pub const DELIVERY_OUTCOMES: [&str; 3] = ["delivered", "failed", "dead"];

/// Error classes kept as they are in `maas_stage_failures_total`; any
/// other is counted as `unknown`. `internal` and `panic` are bugs, not
/// weather: the unknown-error alert counts them with `unknown`.
pub const KNOWN_CLASSES: &[&str] = &[
    // The LLM layer (`LlmError::class`).
    "timeout",
    "connect",
    "server",
    "overloaded",
    "rate_limited",
    "throttled",
    "quota_exhausted",
    "token_limit",
    "bad_request",
    "auth",
    "invalid_response",
    // The stages and the dispatcher.
    "no_prompt",
    "invalid_json",
    "memory_search",
    "stage_timeout",
    "internal",
    "panic",
];

/// The series of this file: (kind, name, help).
pub(super) const DESCRIPTIONS: &[(Kind, &str, &str)] = &[
    (
        Kind::Gauge,
        "maas_table_rows",
        "Live rows of pipeline_runs (requests), raw_logs (turns) and lsm_storage (records), from pg_stat_user_tables (database-wide)",
    ),
    (
        Kind::Gauge,
        "maas_table_bytes",
        "Size on disk of the same tables, indexes and TOAST included (database-wide)",
    ),
    (
        Kind::Gauge,
        "maas_backlog_oldest_due_seconds",
        "How long the oldest due request of each ready status has waited (database-wide)",
    ),
    (
        Kind::Gauge,
        "maas_leases_expired",
        "Leases that ran out and were not yet taken back by a sweep (database-wide)",
    ),
    (
        Kind::Gauge,
        "maas_notification_queue_usage",
        "How full the server's NOTIFY queue is, 0 to 1 (pg_notification_queue_usage)",
    ),
    (
        Kind::Counter,
        "maas_claim_polls_total",
        "Claim statements of the dispatch loop by stage and result (processed, empty, error)",
    ),
    (
        Kind::Seconds,
        "maas_claim_poll_duration_seconds",
        "Time of one claim statement (prompts and connection included), by stage and result",
    ),
    (
        Kind::Seconds,
        "maas_memory_search_duration_seconds",
        "Time of the memory an assemble stage reads (the query's search and its sub-queries', connection included), by result (ok, error, timeout)",
    ),
    (
        Kind::Counter,
        "maas_stage_failures_total",
        "Failed stage attempts by stage, error class and outcome (retrying, failed)",
    ),
    (
        Kind::Counter,
        "maas_analyses_total",
        "Analyses by whether the query needs context and whether the analyzer found a record",
    ),
    (
        Kind::Tokens,
        "maas_context_tokens",
        "Assembled contexts in tokens: the whole context (part=total) and its memory block (part=memory)",
    ),
    (
        Kind::Counter,
        "maas_contexts_total",
        "Assembled contexts by whether they hold memory (memory=found, none)",
    ),
    (
        Kind::Counter,
        "maas_callback_deliveries_total",
        "Callback delivery attempts by outcome (delivered, failed and retried, dead: attempts exhausted)",
    ),
    (
        Kind::Seconds,
        "maas_callback_delivery_duration_seconds",
        "Time of one callback delivery attempt",
    ),
    (
        Kind::Gauge,
        "maas_callbacks_pending",
        "Callback deliveries waiting in the outbox (database-wide)",
    ),
    (
        Kind::Gauge,
        "maas_callbacks_dead",
        "Callback deliveries given up after their attempts (the dead-letter queue, database-wide)",
    ),
    (
        Kind::Gauge,
        "maas_callbacks_oldest_pending_seconds",
        "Age of the oldest pending callback delivery (database-wide)",
    ),
    (
        Kind::Counter,
        "maas_archivist_runs_total",
        "Archive runs by trigger and outcome (ok, failures: some users failed, error: the run stopped)",
    ),
    (
        Kind::Seconds,
        "maas_archivist_run_duration_seconds",
        "Duration of an archive run, by trigger",
    ),
    (
        Kind::Counter,
        "maas_archivist_users_total",
        "Users an archive run worked on, by outcome",
    ),
    (
        Kind::Counter,
        "maas_archivist_logs_total",
        "Turns (raw_logs rows) archived into records",
    ),
    (
        Kind::Counter,
        "maas_archivist_records_total",
        "Records (lsm_storage rows) the archivist wrote",
    ),
    (
        Kind::Counter,
        "maas_archivist_failures_total",
        "Users whose archiving failed in a run",
    ),
    (
        Kind::Gauge,
        "maas_archivist_last_run_timestamp_seconds",
        "Unix time the last archive run of any daemon or maasctl finished (database-wide; absent before the first)",
    ),
    (
        Kind::Gauge,
        "maas_archivist_last_run_failures",
        "Users that failed in the last finished archive run (database-wide)",
    ),
    (
        Kind::Gauge,
        "maas_archivist_enabled",
        "1 when this daemon runs the archivist schedule",
    ),
    (
        Kind::Counter,
        "maas_embedder_turns_total",
        "Turn embeddings the embedder stored (a turn embedded again with its next turn counts again)",
    ),
    (
        Kind::Counter,
        "maas_embedder_refused_total",
        "Turns left without an embedding because the provider refused their text",
    ),
    (
        Kind::Counter,
        "maas_embedder_failures_total",
        "Embedder passes ended by a failure (provider down, database), by where",
    ),
];

/// Makes the zero series of this file visible before their first event, so
/// `increase()` and `absent()` in the alert rules see them from the start.
pub(super) fn register() {
    for stage in StageKind::ALL {
        counter!("maas_stage_retries_total", "stage" => stage.as_str()).increment(0);
        for result in POLL_RESULTS {
            counter!("maas_claim_polls_total", "stage" => stage.as_str(), "result" => result).increment(0);
        }
    }
    for outcome in DELIVERY_OUTCOMES {
        counter!("maas_callback_deliveries_total", "outcome" => outcome).increment(0);
    }
    for outcome in ["ok", "failures", "error"] {
        for trigger in ["cron", "manual"] {
            counter!("maas_archivist_runs_total", "trigger" => trigger, "outcome" => outcome).increment(0);
        }
    }
    counter!("maas_archivist_logs_total").increment(0);
    counter!("maas_archivist_records_total").increment(0);
    counter!("maas_archivist_failures_total").increment(0);
    for (needs, found) in [
        ("true", "true"),
        ("true", "false"),
        ("false", "true"),
        ("false", "false"),
    ] {
        counter!("maas_analyses_total", "needs_context" => needs, "found" => found).increment(0);
    }
    for memory in ["found", "none"] {
        counter!("maas_contexts_total", "memory" => memory).increment(0);
    }
}

/// `class` if it is one of [`KNOWN_CLASSES`], else `unknown`.
pub fn failure_class(class: &str) -> &'static str {
    KNOWN_CLASSES
        .iter()
        .find(|k| **k == class)
        .copied()
        .unwrap_or("unknown")
}

/// One claim statement of `stage`'s dispatch loop: `rows` claimed, or an
/// error (`None`), in `took`.
pub fn claim_poll(stage: StageKind, rows: Option<usize>, took: Duration) {
    let result = match rows {
        Some(0) => "empty",
        Some(_) => "processed",
        None => "error",
    };
    counter!("maas_claim_polls_total", "stage" => stage.as_str(), "result" => result).increment(1);
    histogram!("maas_claim_poll_duration_seconds", "stage" => stage.as_str(), "result" => result)
        .record(took.as_secs_f64());
}

/// The memory one assemble stage read: `result` one of
/// [`MEMORY_SEARCH_RESULTS`], in `took`.
pub fn memory_search(result: &'static str, took: Duration) {
    histogram!("maas_memory_search_duration_seconds", "result" => result).record(took.as_secs_f64());
}

/// A written stage result that was a failure: retried (or failed for
/// good), by its error class. Deferrals and releases are not failures.
pub fn stage_failure(stage: StageKind, outcome: Outcome, class: Option<&str>) {
    let outcome = match outcome {
        Outcome::Retrying => "retrying",
        Outcome::Failed => "failed",
        _ => return,
    };
    let class = class.map_or("unknown", failure_class);
    counter!("maas_stage_failures_total", "stage" => stage.as_str(), "class" => class, "outcome" => outcome)
        .increment(1);
}

/// One callback delivery attempt: `delivered`, `failed` (retried) or `dead`.
pub fn callback_delivery(outcome: &'static str, took: Duration) {
    counter!("maas_callback_deliveries_total", "outcome" => outcome).increment(1);
    histogram!("maas_callback_delivery_duration_seconds").record(took.as_secs_f64());
}

/// What an archive run did (not for dry runs).
#[derive(Debug, Clone, Copy, Default)]
pub struct ArchiveRun<'a> {
    /// `cron` or `manual`.
    pub trigger: &'static str,
    /// False when the run stopped with an error.
    pub finished: bool,
    /// Users by outcome word (`archived`, `nothing`, `failed`, ...).
    pub users: &'a [&'static str],
    pub logs: i64,
    pub records: i64,
    pub failures: i64,
    pub took: Duration,
}

/// Records what one embedder pass stored and left out.
pub fn embedder_pass(stored: i64, refused: usize) {
    counter!("maas_embedder_turns_total").increment(u64::try_from(stored).unwrap_or(0));
    counter!("maas_embedder_refused_total").increment(u64::try_from(refused).unwrap_or(u64::MAX));
}

/// Records an embedder pass that ended in a failure at `place` (`provider`
/// or `database`).
pub fn embedder_failure(place: &'static str) {
    counter!("maas_embedder_failures_total", "place" => place).increment(1);
}

/// Records one archive run.
pub fn archive_run(run: &ArchiveRun<'_>) {
    let outcome = if !run.finished {
        "error"
    } else if run.failures > 0 {
        "failures"
    } else {
        "ok"
    };
    counter!("maas_archivist_runs_total", "trigger" => run.trigger, "outcome" => outcome).increment(1);
    histogram!("maas_archivist_run_duration_seconds", "trigger" => run.trigger).record(run.took.as_secs_f64());
    for user in run.users {
        counter!("maas_archivist_users_total", "outcome" => *user).increment(1);
    }
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    counter!("maas_archivist_logs_total").increment(n(run.logs));
    counter!("maas_archivist_records_total").increment(n(run.records));
    counter!("maas_archivist_failures_total").increment(n(run.failures));
}

/// Database-wide figures read on the metrics refresh's schedule; `None`
/// where the read failed (the gauge keeps its last value).
#[derive(Debug, Clone, Default)]
pub struct DatabaseFigures {
    /// (table, live rows, bytes) for [`TABLES`].
    pub tables: Option<Vec<(String, i64, i64)>>,
    /// (ready status, seconds the oldest due row waited).
    pub oldest_due: Option<Vec<(Status, f64)>>,
    pub leases_expired: Option<i64>,
    pub notification_queue_usage: Option<f64>,
    /// (pending, dead, oldest pending seconds).
    pub callbacks: Option<(i64, i64, Option<f64>)>,
    /// The last finished archive run: (finished, unix seconds; failures).
    pub last_archive_run: Option<Option<(f64, i64)>>,
    /// (waiting status, requests, past their limit).
    pub waiting: Option<Vec<(Status, i64, i64)>>,
}

#[allow(
    clippy::cast_precision_loss,
    reason = "a gauge is a float; counts stay far below 2^52"
)]
pub(super) fn float(n: i64) -> f64 {
    n as f64
}

/// Sets the database-wide gauges from `figures`, and whether this daemon
/// runs the archivist.
pub fn observe_database(figures: &DatabaseFigures, archivist_enabled: bool) {
    gauge!("maas_archivist_enabled").set(if archivist_enabled { 1.0 } else { 0.0 });
    if let Some(tables) = &figures.tables {
        for name in TABLES {
            let (rows, bytes) = tables
                .iter()
                .find(|(t, _, _)| t == name)
                .map_or((0, 0), |(_, r, b)| (*r, *b));
            gauge!("maas_table_rows", "table" => name).set(float(rows));
            gauge!("maas_table_bytes", "table" => name).set(float(bytes));
        }
    }
    if let Some(rows) = &figures.oldest_due {
        for st in StageKind::ALL.map(StageKind::ready_status) {
            let secs = rows.iter().find(|(s, _)| *s == st).map_or(0.0, |(_, v)| *v);
            gauge!("maas_backlog_oldest_due_seconds", "status" => st.as_str()).set(secs);
        }
    }
    if let Some(n) = figures.leases_expired {
        gauge!("maas_leases_expired").set(float(n));
    }
    if let Some(u) = figures.notification_queue_usage {
        gauge!("maas_notification_queue_usage").set(u);
    }
    if let Some((pending, dead, oldest)) = figures.callbacks {
        gauge!("maas_callbacks_pending").set(float(pending));
        gauge!("maas_callbacks_dead").set(float(dead));
        gauge!("maas_callbacks_oldest_pending_seconds").set(oldest.unwrap_or(0.0));
    }
    if let Some(Some((at, failures))) = figures.last_archive_run {
        gauge!("maas_archivist_last_run_timestamp_seconds").set(at);
        gauge!("maas_archivist_last_run_failures").set(float(failures));
    }
    if let Some(rows) = &figures.waiting {
        super::observe_waiting(rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_classes_fold_into_one_label() {
        assert_eq!(failure_class("rate_limited"), "rate_limited");
        assert_eq!(failure_class("panic"), "panic");
        assert_eq!(failure_class("something new"), "unknown");
        assert_eq!(failure_class(""), "unknown");
    }

    #[test]
    fn every_series_is_prefixed_and_described_once() {
        let mut names: Vec<&str> = DESCRIPTIONS.iter().map(|(_, n, _)| *n).collect();
        names.extend(super::super::DESCRIPTIONS.iter().map(|(_, n, _)| *n));
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "a series is described twice");
        assert!(names.iter().all(|n| n.starts_with("maas_")));
    }
}
