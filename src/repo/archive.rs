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
use uuid::Uuid;

use crate::db::Error;

pub const CANDIDATES: &str = include_str!("../../sql/queries/archive_candidates.sql");
pub const CLAIM: &str = include_str!("../../sql/queries/archive_claim.sql");
pub const EXTEND: &str = include_str!("../../sql/queries/archive_extend.sql");
pub const RELEASE: &str = include_str!("../../sql/queries/archive_release.sql");
pub const PENDING: &str = include_str!("../../sql/queries/archive_pending.sql");
pub const COMMIT: &str = include_str!("../../sql/queries/archive_commit.sql");
pub const FAIL: &str = include_str!("../../sql/queries/archive_fail.sql");
pub const MARK: &str = include_str!("../../sql/queries/archive_mark.sql");
pub const RUN_START: &str = include_str!("../../sql/queries/archive_run_start.sql");
pub const RUN_FINISH: &str = include_str!("../../sql/queries/archive_run_finish.sql");
pub const TICK: &str = include_str!("../../sql/queries/archive_tick.sql");
pub const SCHEDULE_INIT: &str = include_str!("../../sql/queries/archive_schedule_init.sql");

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

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
                &to_i64(limit),
            ],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Candidate {
                user_id: r.try_get(0)?,
                pending: r.try_get(1)?,
            })
        })
        .collect()
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
    let Some(r) = client.query_opt(&stmt, &[&user, &owner, &secs(lease)]).await? else {
        return Ok(None);
    };
    Ok(Some(Claim {
        archived_seq: r.try_get(0)?,
        logged_seq: r.try_get(1)?,
        failures: r.try_get(2)?,
        memory_version: r.try_get(3)?,
    }))
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
    let rows = client.query(&stmt, &[&user, &after, &through, &to_i64(limit)]).await?;
    rows.iter()
        .map(|r| {
            Ok(PendingLog {
                id: r.try_get(0)?,
                user_seq: r.try_get(1)?,
                thread_id: r.try_get(2)?,
                request_id: r.try_get(3)?,
                message_type: r.try_get(4)?,
                content: r.try_get(5)?,
                created_at: r.try_get(6)?,
            })
        })
        .collect()
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
            memory_version: r.try_get(0)?,
            records: r.try_get(1)?,
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
    Ok(row.map(|r| r.try_get(0)).transpose()?)
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
    let Some(r) = client.query_opt(&stmt, &[&user]).await? else {
        return Ok(None);
    };
    Ok(Some(MarkView {
        user_id: r.try_get(0)?,
        logged_seq: r.try_get(1)?,
        archived_seq: r.try_get(2)?,
        pending: r.try_get(3)?,
        pending_since: r.try_get(4)?,
        last_active_at: r.try_get(5)?,
        last_archived_at: r.try_get(6)?,
        memory_version: r.try_get(7)?,
        lease_owner: r.try_get(8)?,
        lease_expires_at: r.try_get(9)?,
        failures: r.try_get(10)?,
        retry_after: r.try_get(11)?,
        last_error: r.try_get(12)?,
    }))
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
        .try_get(0)?)
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

pub async fn finish_run(client: &impl GenericClient, id: i64, t: &RunTotals) -> Result<(), Error> {
    let stmt = client.prepare_cached(RUN_FINISH).await?;
    client
        .execute(
            &stmt,
            &[
                &id,
                &t.users,
                &t.users_archived,
                &t.logs,
                &t.records,
                &t.failures,
                &t.errors,
            ],
        )
        .await?;
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
    Ok(client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&RUN_LOCK_KEY])
        .await?
        .try_get(0)?)
}

pub async fn unlock_runs(client: &impl GenericClient) -> Result<(), Error> {
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&RUN_LOCK_KEY])
        .await?;
    Ok(())
}

/// Advisory lock key of scheduled archive runs ("arch" in ASCII).
const RUN_LOCK_KEY: i64 = 0x6172_6368;
