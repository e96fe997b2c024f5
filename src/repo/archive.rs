//! The archivist's statements (`sql/queries/archive_*.sql`): candidate
//! selection, per-user leases, pending logs, the fenced commit, failures,
//! run records and the cluster-wide cron tick.
//!
//! Invariant: a user's logs are archived exactly once. [`commit_batch`]
//! advances the user's high-water mark and inserts the LSM records in one
//! statement, fenced on the mark it started from; the lease taken by
//! [`claim_user`] only saves duplicate model calls.

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde_json::Value;
use tokio_postgres::Row;
use uuid::Uuid;

use super::{FromRow, as_limit, row_as, rows_as, secs};
use crate::db::Error;

const CANDIDATES: &str = include_str!("../../sql/queries/archive_candidates.sql");
const CLAIM: &str = include_str!("../../sql/queries/archive_claim.sql");
const EXTEND: &str = include_str!("../../sql/queries/archive_extend.sql");
const RELEASE: &str = include_str!("../../sql/queries/archive_release.sql");
const PENDING: &str = include_str!("../../sql/queries/archive_pending.sql");
const COMMIT: &str = include_str!("../../sql/queries/archive_commit.sql");
const FAIL: &str = include_str!("../../sql/queries/archive_fail.sql");
const MARK: &str = include_str!("../../sql/queries/archive_mark.sql");
const RUN_START: &str = include_str!("../../sql/queries/archive_run_start.sql");
const RUN_FINISH: &str = include_str!("../../sql/queries/archive_run_finish.sql");
const TICK: &str = include_str!("../../sql/queries/archive_tick.sql");
const SCHEDULE_INIT: &str = include_str!("../../sql/queries/archive_schedule_init.sql");
const TRY_LOCK_RUNS: &str = "SELECT pg_try_advisory_lock($1) AS locked";
const UNLOCK_RUNS: &str = "SELECT pg_advisory_unlock($1) AS unlocked";

/// This file's statements, for [`super::all`].
pub(super) const STATEMENTS: &[(&str, &str)] = &[
    ("archive_candidates", CANDIDATES),
    ("archive_claim", CLAIM),
    ("archive_extend", EXTEND),
    ("archive_release", RELEASE),
    ("archive_pending", PENDING),
    ("archive_commit", COMMIT),
    ("archive_fail", FAIL),
    ("archive_mark", MARK),
    ("archive_run_start", RUN_START),
    ("archive_run_finish", RUN_FINISH),
    ("archive_tick", TICK),
    ("archive_schedule_init", SCHEDULE_INIT),
    ("archive_try_lock_runs", TRY_LOCK_RUNS),
    ("archive_unlock_runs", UNLOCK_RUNS),
];

/// The thresholds of candidate selection (seed 004).
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    /// N: at least this many logs pending…
    pub min_pending: u64,
    /// T: …or the oldest pending log at least this old…
    pub max_pending_age: Duration,
    /// A: …and the user active within this…
    pub active_within: Duration,
    /// …and not archived within this.
    pub cooldown: Duration,
}

/// A user due for archiving and how many logs are pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub user_id: Uuid,
    pub pending: i64,
}

/// Up to `limit` users due for archiving, oldest pending first.
pub async fn select_candidates(
    client: &impl GenericClient,
    t: &Thresholds,
    limit: usize,
) -> Result<Vec<Candidate>, Error> {
    let stmt = client.prepare_cached(CANDIDATES).await?;
    let n = i64::try_from(t.min_pending).unwrap_or(i64::MAX);
    let rows = client
        .query(
            &stmt,
            &[
                &n,
                &secs(t.max_pending_age),
                &secs(t.active_within),
                &secs(t.cooldown),
                &as_limit(limit),
            ],
        )
        .await?;
    rows_as(&rows)
}

impl FromRow for Candidate {
    fn from_row(r: &Row) -> Result<Candidate, Error> {
        Ok(Candidate {
            user_id: r.try_get("user_id")?,
            pending: r.try_get("pending")?,
        })
    }
}

/// The mark and sequence of a claimed user: logs with
/// `archived_seq < user_seq <= logged_seq` are pending and all committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub archived_seq: i64,
    pub logged_seq: i64,
    /// Failed attempts since the last success (for the backoff).
    pub failures: i32,
    pub memory_version: i64,
}

/// Leases `user` to `owner`; `None` when another runner holds a live lease
/// or the user has never logged anything.
pub async fn claim_user(
    client: &impl GenericClient,
    user: Uuid,
    owner: &str,
    lease: Duration,
) -> Result<Option<Claim>, Error> {
    let stmt = client.prepare_cached(CLAIM).await?;
    row_as(client.query_opt(&stmt, &[&user, &owner, &secs(lease)]).await?)
}

impl FromRow for Claim {
    fn from_row(r: &Row) -> Result<Claim, Error> {
        Ok(Claim {
            archived_seq: r.try_get("archived_seq")?,
            logged_seq: r.try_get("logged_seq")?,
            failures: r.try_get("failures")?,
            memory_version: r.try_get("memory_version")?,
        })
    }
}

/// Renews the lease; false when it was lost.
pub async fn extend_user_lease(
    client: &impl GenericClient,
    user: Uuid,
    owner: &str,
    lease: Duration,
) -> Result<bool, Error> {
    let stmt = client.prepare_cached(EXTEND).await?;
    Ok(client.query_opt(&stmt, &[&user, &owner, &secs(lease)]).await?.is_some())
}

pub async fn release_user(client: &impl GenericClient, user: Uuid, owner: &str) -> Result<(), Error> {
    let stmt = client.prepare_cached(RELEASE).await?;
    client.execute(&stmt, &[&user, &owner]).await?;
    Ok(())
}

/// One raw log as the archivist reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingLog {
    pub id: i64,
    pub user_seq: i64,
    pub thread_id: Option<Uuid>,
    pub request_id: Option<Uuid>,
    pub message_type: String,
    pub content: String,
    pub created_at: DateTime<Utc>,
}

/// Up to `limit` pending logs after `after`, up to `through`, in order.
pub async fn pending_logs(
    client: &impl GenericClient,
    user: Uuid,
    after: i64,
    through: i64,
    limit: usize,
) -> Result<Vec<PendingLog>, Error> {
    let stmt = client.prepare_cached(PENDING).await?;
    let rows = client
        .query(&stmt, &[&user, &after, &through, &as_limit(limit)])
        .await?;
    rows_as(&rows)
}

impl FromRow for PendingLog {
    fn from_row(r: &Row) -> Result<PendingLog, Error> {
        Ok(PendingLog {
            id: r.try_get("id")?,
            user_seq: r.try_get("user_seq")?,
            thread_id: r.try_get("thread_id")?,
            request_id: r.try_get("request_id")?,
            message_type: r.try_get("message_type")?,
            content: r.try_get("content")?,
            created_at: r.try_get("created_at")?,
        })
    }
}

/// One LSM record to write.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NewRecord {
    pub time_bucket_start: DateTime<Utc>,
    pub time_bucket_end: DateTime<Utc>,
    pub tags: Vec<String>,
    pub summary: String,
    pub raw_log_ids: Vec<i64>,
}

/// What a fenced commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// The mark moved and the records were written.
    Applied { memory_version: i64, records: i64 },
    /// The mark had moved: another runner archived these logs; nothing written.
    Fenced,
}

/// Inserts `records` for `user` and moves the mark from `from` to `to`, in
/// one statement; nothing at all unless the mark is still `from`.
pub async fn commit_batch(
    client: &impl GenericClient,
    user: Uuid,
    from: i64,
    to: i64,
    records: &[NewRecord],
) -> Result<Committed, Error> {
    let stmt = client.prepare_cached(COMMIT).await?;
    let json = serde_json::to_value(records).unwrap_or(Value::Array(Vec::new()));
    Ok(match client.query_opt(&stmt, &[&user, &from, &to, &json]).await? {
        Some(r) => Committed::Applied {
            memory_version: r.try_get("memory_version")?,
            records: r.try_get("records")?,
        },
        None => Committed::Fenced,
    })
}

/// Records a failed attempt and gives up the lease; the user is not selected
/// again before `retry_in`. `counts` is false for local throttling.
pub async fn fail_user(
    client: &impl GenericClient,
    user: Uuid,
    owner: &str,
    error: &str,
    retry_in: Duration,
    counts: bool,
) -> Result<Option<i32>, Error> {
    let stmt = client.prepare_cached(FAIL).await?;
    let ms = i64::try_from(retry_in.as_millis()).unwrap_or(i64::MAX);
    let row = client.query_opt(&stmt, &[&user, &owner, &error, &ms, &counts]).await?;
    Ok(row.map(|r| r.try_get("failures")).transpose()?)
}

/// One user's archive state: what `maasctl archivist show` prints and what
/// the status API serves (`memory_version` lets clients drop caches).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MarkView {
    pub user_id: Uuid,
    pub logged_seq: i64,
    pub archived_seq: i64,
    pub pending: i64,
    pub pending_since: Option<DateTime<Utc>>,
    pub last_active_at: Option<DateTime<Utc>>,
    pub last_archived_at: Option<DateTime<Utc>>,
    pub memory_version: i64,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub failures: i32,
    pub retry_after: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
}

/// The archive state of `user`; `None` if the user never logged anything.
pub async fn show_mark(client: &impl GenericClient, user: Uuid) -> Result<Option<MarkView>, Error> {
    let stmt = client.prepare_cached(MARK).await?;
    row_as(client.query_opt(&stmt, &[&user]).await?)
}

impl FromRow for MarkView {
    fn from_row(r: &Row) -> Result<MarkView, Error> {
        Ok(MarkView {
            user_id: r.try_get("user_id")?,
            logged_seq: r.try_get("logged_seq")?,
            archived_seq: r.try_get("archived_seq")?,
            pending: r.try_get("pending")?,
            pending_since: r.try_get("pending_since")?,
            last_active_at: r.try_get("last_active_at")?,
            last_archived_at: r.try_get("last_archived_at")?,
            memory_version: r.try_get("memory_version")?,
            lease_owner: r.try_get("lease_owner")?,
            lease_expires_at: r.try_get("lease_expires_at")?,
            failures: r.try_get("failures")?,
            retry_after: r.try_get("retry_after")?,
            last_error: r.try_get("last_error")?,
        })
    }
}

/// The memory version of `user` (0 when the user has no records yet): a
/// client that cached anything derived from the user's memory drops it when
/// this changes.
pub async fn memory_version(client: &impl GenericClient, user: Uuid) -> Result<i64, Error> {
    Ok(show_mark(client, user).await?.map_or(0, |m| m.memory_version))
}

/// Opens a run record; returns its id.
pub async fn start_run(
    client: &impl GenericClient,
    trigger: &str,
    worker: &str,
    only_user: Option<Uuid>,
    tick: Option<DateTime<Utc>>,
) -> Result<i64, Error> {
    let stmt = client.prepare_cached(RUN_START).await?;
    Ok(client
        .query_one(&stmt, &[&trigger, &worker, &only_user, &tick])
        .await?
        .try_get("id")?)
}

/// The totals of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunTotals {
    pub users: i32,
    pub users_archived: i32,
    pub logs: i64,
    pub records: i32,
    pub failures: i32,
    /// `[{user_id, class, message}]`.
    pub errors: Value,
}

super::statement_params! {
    /// The inputs of `archive_run_finish.sql`, `$1` to `$7` in field order.
    struct RunFinishParams<'a> {
        id: i64,
        users: i32,
        users_archived: i32,
        logs: i64,
        records: i32,
        failures: i32,
        errors: &'a Value,
    }
}

/// Closes run record `id` with its totals.
pub async fn finish_run(client: &impl GenericClient, id: i64, t: &RunTotals) -> Result<(), Error> {
    let stmt = client.prepare_cached(RUN_FINISH).await?;
    let params = RunFinishParams {
        id,
        users: t.users,
        users_archived: t.users_archived,
        logs: t.logs,
        records: t.records,
        failures: t.failures,
        errors: &t.errors,
    };
    client.execute(&stmt, &params.params()).await?;
    Ok(())
}

/// Claims cron tick `tick` of `schedule`; true for exactly one caller per tick.
pub async fn claim_tick(client: &impl GenericClient, schedule: &str, tick: DateTime<Utc>) -> Result<bool, Error> {
    let stmt = client.prepare_cached(TICK).await?;
    Ok(client.query_opt(&stmt, &[&schedule, &tick]).await?.is_some())
}

/// Records `tick` as the schedule's last tick if the schedule has no row
/// yet; true when it did (a fresh install has missed no tick).
pub async fn init_schedule(client: &impl GenericClient, schedule: &str, tick: DateTime<Utc>) -> Result<bool, Error> {
    let stmt = client.prepare_cached(SCHEDULE_INIT).await?;
    Ok(client.query_opt(&stmt, &[&schedule, &tick]).await?.is_some())
}

/// Takes the cluster-wide archive-run lock for this session (released by
/// [`unlock_runs`] or when the session ends, e.g. the daemon dies); false
/// when another session holds it. Needs a direct or session-pooled
/// connection, not PgBouncer in transaction mode.
pub async fn try_lock_runs(client: &impl GenericClient) -> Result<bool, Error> {
    let stmt = client.prepare_cached(TRY_LOCK_RUNS).await?;
    Ok(client.query_one(&stmt, &[&RUN_LOCK_KEY]).await?.try_get("locked")?)
}

pub async fn unlock_runs(client: &impl GenericClient) -> Result<(), Error> {
    let stmt = client.prepare_cached(UNLOCK_RUNS).await?;
    client.execute(&stmt, &[&RUN_LOCK_KEY]).await?;
    Ok(())
}

/// Advisory lock key of scheduled archive runs ("arch" in ASCII).
const RUN_LOCK_KEY: i64 = 0x6172_6368;

#[cfg(test)]
mod tests {
    use super::super::params_check::check;
    use super::*;

    #[test]
    fn run_finish_params_are_in_the_order_the_sql_documents() {
        check(RUN_FINISH, RunFinishParams::NAMES);
    }
}
