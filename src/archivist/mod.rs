//! The archivist: novelty-triggered long-term memory from raw logs, exactly
//! once, choosing users by novelty, age and activity (docs/archivist.md).
//!
//! Which users: every raw log takes the next number of its user's sequence
//! (`raw_logs.user_seq`, kept with the user's counters in `archive_marks` by
//! a trigger); a user's high-water mark `archived_seq` says every log up to it
//! is archived, so pending = `logged_seq - archived_seq`, read from one row.
//! A user is a candidate when pending ≥ N or the oldest pending log is older
//! than T, and the user was active within A, and not archived within the
//! cooldown ([`Thresholds`](crate::repo::archive::Thresholds)). Selection reads `archive_marks` through a
//! partial index, never `raw_logs`.
//!
//! What: a user's pending logs, in bounded batches (`batch_logs`), grouped by
//! thread; a thread longer than the archivist model's budget
//! (`chunk_tokens`, counted with [`crate::llm::TokenCounter`]) is split into
//! chunks; each chunk goes to the `Archivist` prompt and its JSON answer
//! (`time_bucket_start`, `time_bucket_end`, `tags`, `summary`) is validated;
//! one `lsm_storage` row per chunk carries the exact `raw_log_ids` it covers.
//!
//! Exactly once: the model is called with no transaction open; the records
//! of a batch and the mark's advance are then written by one statement
//! fenced on the mark the batch started from
//! ([`commit_batch`](crate::repo::archive::commit_batch)).
//! Two runners (two daemons, cron and `maasctl`) can both call the model for
//! the same logs only if one's lease ran out, and then only one commit
//! applies. A crash loses at most the uncommitted batch, which the next run
//! redoes from the mark.
//!
//! Failures follow the LLM layer's retry policy ([`crate::llm::Failure`]):
//! the user gets a durable `retry_after` (exponential backoff, or the
//! provider's `Retry-After`), one user's failure never stops the others, and
//! every run leaves a row in `archive_runs`.
//!
//! Schedule: [`run_scheduled`] runs inside `maasd` on a 6-field UTC cron
//! expression; a tick runs once cluster-wide (a forward-only row per tick,
//! `archive_schedule`) and never overlaps a run still going in this process.
//!
//! Files: `config` (the `[archivist]` section, [`ArchivistConfig`], lives
//! in `crate::config`; `config` here adds its thresholds), `chunking` (logs → model calls), `summary` (the model's answer,
//! validated), `runner` ([`Archivist::run`]), `schedule` ([`run_scheduled`]).
//! The archivist shares the LLM layer with the stages (`crate::llm`), not
//! the stages themselves.

mod chunking;
mod config;
mod runner;
mod schedule;
mod summary;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

pub use crate::config::{ArchivistConfig, cron_schedule};
use crate::db;
use crate::repo::archive::RunTotals;
pub use runner::Archivist;
pub use schedule::{Eligibility, SCHEDULE_NAME, eligibility, run_scheduled};
pub use summary::{ArchiveSummary, INVALID_JSON_ATTEMPTS, parse_summary};

#[derive(Debug, thiserror::Error)]
pub enum ArchivistError {
    #[error(transparent)]
    Db(#[from] db::Error),
    #[error("no active Archivist prompt in system_prompts")]
    NoPrompt,
    #[error("archivist schedule: {0}")]
    Schedule(String),
}

impl From<tokio_postgres::Error> for ArchivistError {
    fn from(e: tokio_postgres::Error) -> Self {
        ArchivistError::Db(e.into())
    }
}

impl From<deadpool_postgres::PoolError> for ArchivistError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        ArchivistError::Db(e.into())
    }
}

/// Who started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The schedule inside `maasd`.
    Cron,
    /// An operator (`maasctl archivist run`).
    Manual,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Cron => "cron",
            Trigger::Manual => "manual",
        }
    }
}

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    pub trigger: Trigger,
    /// Only this user, regardless of thresholds and cooldown.
    pub user: Option<Uuid>,
    /// Select and plan (users, logs, chunks) without calling a model or
    /// writing anything.
    pub dry_run: bool,
    /// The cron tick a scheduled run belongs to.
    pub tick: Option<DateTime<Utc>>,
}

/// What happened to one user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UserOutcome {
    /// Records written and the mark moved.
    Archived,
    /// Nothing pending.
    Nothing,
    /// Another runner holds the user's lease.
    Busy,
    /// Another runner archived these logs first; this run's work was dropped.
    Raced,
    /// A failure; the user backs off (see `archive_marks.retry_after`).
    Failed,
    /// Shutdown came first; nothing of the unfinished batch was written.
    Cancelled,
    /// Dry run: what would be done.
    Planned,
}

impl UserOutcome {
    /// The word of its JSON and of `maas_archivist_users_total{outcome}`.
    pub fn as_str(self) -> &'static str {
        match self {
            UserOutcome::Archived => "archived",
            UserOutcome::Nothing => "nothing",
            UserOutcome::Busy => "busy",
            UserOutcome::Raced => "raced",
            UserOutcome::Failed => "failed",
            UserOutcome::Cancelled => "cancelled",
            UserOutcome::Planned => "planned",
        }
    }
}

/// One user's part of a run.
#[derive(Debug, Clone, Serialize)]
pub struct UserReport {
    pub user_id: Uuid,
    pub outcome: UserOutcome,
    /// Logs covered by the records written (planned, for a dry run).
    pub logs: i64,
    /// Records written (chunks planned, for a dry run).
    pub records: i64,
    /// The memory version after this run's last commit.
    pub memory_version: Option<i64>,
    pub error_class: Option<String>,
    pub error: Option<String>,
}

impl UserReport {
    fn new(user_id: Uuid, outcome: UserOutcome) -> UserReport {
        UserReport {
            user_id,
            outcome,
            logs: 0,
            records: 0,
            memory_version: None,
            error_class: None,
            error: None,
        }
    }
}

/// The result of a run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The `archive_runs` row (none for a dry run); shown as `run_id`.
    #[serde(rename = "run_id")]
    pub archive_run_id: Option<i64>,
    pub dry_run: bool,
    pub users: Vec<UserReport>,
    pub users_archived: i64,
    pub logs: i64,
    pub records: i64,
    pub failures: i64,
    pub duration_ms: u64,
}

impl RunReport {
    /// The report of a run over `users` (its duration still 0).
    fn of(archive_run_id: Option<i64>, dry_run: bool, users: Vec<UserReport>) -> RunReport {
        let count = |outcome| i64::try_from(users.iter().filter(|u| u.outcome == outcome).count()).unwrap_or(i64::MAX);
        RunReport {
            archive_run_id,
            dry_run,
            users_archived: count(UserOutcome::Archived),
            logs: users.iter().map(|u| u.logs).sum(),
            records: users.iter().map(|u| u.records).sum(),
            failures: count(UserOutcome::Failed),
            users,
            duration_ms: 0,
        }
    }

    /// The totals its `archive_runs` row is closed with.
    fn totals(&self) -> RunTotals {
        let errors = self
            .users
            .iter()
            .filter(|u| u.outcome == UserOutcome::Failed)
            .map(|u| serde_json::json!({"user_id": u.user_id, "class": u.error_class, "message": u.error}))
            .collect();
        let small = |n: i64| i32::try_from(n).unwrap_or(i32::MAX);
        RunTotals {
            users: i32::try_from(self.users.len()).unwrap_or(i32::MAX),
            users_archived: small(self.users_archived),
            logs: self.logs,
            records: small(self.records),
            failures: small(self.failures),
            errors: serde_json::Value::Array(errors),
        }
    }
}

/// A run's metrics (`maas_archivist_*`); `report` is none when it failed.
fn count_run(opts: RunOptions, report: Option<&RunReport>, took: std::time::Duration) {
    let users: Vec<&'static str> = report
        .map(|r| r.users.iter().map(|u| u.outcome.as_str()).collect())
        .unwrap_or_default();
    crate::metrics::archive_run(&crate::metrics::ArchiveRun {
        trigger: opts.trigger.as_str(),
        finished: report.is_some(),
        users: &users,
        logs: report.map_or(0, |r| r.logs),
        records: report.map_or(0, |r| r.records),
        failures: report.map_or(0, |r| r.failures),
        took,
    });
}

/// Progress of a run, for a terminal's progress bar or plain lines.
pub trait Progress: Send + Sync {
    /// `n` more users are about to be worked on.
    fn add_users(&self, _n: usize) {}
    /// One user is done.
    fn user_done(&self, _report: &UserReport) {}
}

/// No progress output.
pub struct Quiet;
impl Progress for Quiet {}
