//! The archivist's statements (`sql/queries/archive_*.sql`): candidate
//! selection, per-user leases, pending logs, the fenced commit, failures,
//! run records and the cluster-wide cron tick.
//!
//! Invariant: a user's logs are archived exactly once. [`commit_batch`]
//! advances the user's high-water mark and inserts the LSM records in one
//! statement, fenced on the mark it started from; the lease taken by
//! [`claim_user`] only saves duplicate model calls.

use std::time::Duration;

use super::GenericClient;
use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use tokio_postgres::types::ToSql;

use super::{as_limit, secs};
use crate::db::Error;

super::statements! {
    CANDIDATES = "archive_candidates",
    NEWCOMERS = "archive_newcomers",
    CLAIM = "archive_claim",
    EXTEND = "archive_extend",
    RELEASE = "archive_release",
    PENDING = "archive_pending",
    COMMIT = "archive_commit",
    FAIL = "archive_fail",
    MARK = "archive_mark",
    RUN_START = "archive_run_start",
    RUN_FINISH = "archive_run_finish",
    TICK = "archive_tick",
    SCHEDULE_INIT = "archive_schedule_init",
    RUN_LEASE = "archive_run_lease",
    RUN_RELEASE = "archive_run_release",
}

/// The thresholds of candidate selection (novelty, age, activity, cooldown).
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

super::row_struct! {
    /// A user due for archiving and how many logs are pending.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Candidate {
        pub user_id: Uuid,
        pub pending: i64,
    }
}

/// Up to `limit` users never archived with at least `min_pending` logs
/// pending, oldest pending first (`archive_newcomers.sql`).
pub async fn select_newcomers(
    client: &impl GenericClient,
    min_pending: u64,
    limit: usize,
) -> Result<Vec<Candidate>, Error> {
    let n = i64::try_from(min_pending).unwrap_or(i64::MAX);
    super::query_as(client, NEWCOMERS, &[&n, &as_limit(limit)]).await
}

/// Up to `limit` users due for archiving, oldest pending first.
pub async fn select_candidates(
    client: &impl GenericClient,
    t: &Thresholds,
    limit: usize,
) -> Result<Vec<Candidate>, Error> {
    let n = i64::try_from(t.min_pending).unwrap_or(i64::MAX);
    let params: [&(dyn ToSql + Sync); 5] = [
        &n,
        &secs(t.max_pending_age),
        &secs(t.active_within),
        &secs(t.cooldown),
        &as_limit(limit),
    ];
    super::query_as(client, CANDIDATES, &params).await
}

super::row_struct! {
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
}

/// Leases `user` to `owner`; `None` when another runner holds a live lease
/// or the user has never logged anything.
pub async fn claim_user(
    client: &impl GenericClient,
    user: Uuid,
    owner: &str,
    lease: Duration,
) -> Result<Option<Claim>, Error> {
    super::query_opt_as(client, CLAIM, &[&user, &owner, &secs(lease)]).await
}

/// Renews the lease; false when it was lost.
pub async fn extend_user_lease(
    client: &impl GenericClient,
    user: Uuid,
    owner: &str,
    lease: Duration,
) -> Result<bool, Error> {
    super::query_found(client, EXTEND, &[&user, &owner, &secs(lease)]).await
}

pub async fn release_user(client: &impl GenericClient, user: Uuid, owner: &str) -> Result<(), Error> {
    super::execute(client, RELEASE, &[&user, &owner]).await?;
    Ok(())
}

super::row_struct! {
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
}

/// Up to `limit` pending logs after `after`, up to `through`, in order.
pub async fn pending_logs(
    client: &impl GenericClient,
    user: Uuid,
    after: i64,
    through: i64,
    limit: usize,
) -> Result<Vec<PendingLog>, Error> {
    super::query_as(client, PENDING, &[&user, &after, &through, &as_limit(limit)]).await
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
    let json = serde_json::to_value(records).unwrap_or(Value::Array(Vec::new()));
    Ok(
        match super::row_of(client, COMMIT, &[&user, &from, &to, &json]).await? {
            Some(r) => Committed::Applied {
                memory_version: r.try_get("memory_version")?,
                records: r.try_get("records")?,
            },
            None => Committed::Fenced,
        },
    )
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
    let ms = i64::try_from(retry_in.as_millis()).unwrap_or(i64::MAX);
    super::query_opt_value(client, FAIL, &[&user, &owner, &error, &ms, &counts], "failures").await
}

super::row_struct! {
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
}

/// The archive state of `user`; `None` if the user never logged anything.
pub async fn show_mark(client: &impl GenericClient, user: Uuid) -> Result<Option<MarkView>, Error> {
    super::query_opt_as(client, MARK, &[&user]).await
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
    super::query_one_value(client, RUN_START, &[&trigger, &worker, &only_user, &tick], "id").await
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
    let params = RunFinishParams {
        id,
        users: t.users,
        users_archived: t.users_archived,
        logs: t.logs,
        records: t.records,
        failures: t.failures,
        errors: &t.errors,
    };
    super::execute(client, RUN_FINISH, &params.params()).await?;
    Ok(())
}

/// Claims cron tick `tick` of `schedule`; true for exactly one caller per tick.
pub async fn claim_tick(client: &impl GenericClient, schedule: &str, tick: DateTime<Utc>) -> Result<bool, Error> {
    super::query_found(client, TICK, &[&schedule, &tick]).await
}

/// Records `tick` as the schedule's last tick if the schedule has no row
/// yet; true when it did (a fresh install has missed no tick).
pub async fn init_schedule(client: &impl GenericClient, schedule: &str, tick: DateTime<Utc>) -> Result<bool, Error> {
    super::query_found(client, SCHEDULE_INIT, &[&schedule, &tick]).await
}

/// Takes or renews the cluster-wide run lease of `schedule` for `owner`,
/// for `ttl`: true when `owner` holds it now, false while another owner's
/// lease runs. One statement in its own transaction, so it works through a
/// transaction-mode pooler; a daemon that dies leaves a lease that runs out
/// after `ttl`.
pub async fn lease_runs(
    client: &impl GenericClient,
    schedule: &str,
    owner: &str,
    ttl: Duration,
) -> Result<bool, Error> {
    super::query_found(client, RUN_LEASE, &[&schedule, &owner, &secs(ttl)]).await
}

/// Gives up `owner`'s run lease of `schedule` (nothing if it ran out and
/// another owner took it).
pub async fn release_runs(client: &impl GenericClient, schedule: &str, owner: &str) -> Result<(), Error> {
    super::execute(client, RUN_RELEASE, &[&schedule, &owner]).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::params_check::check;
    use super::*;

    #[test]
    fn run_finish_params_are_in_the_order_the_sql_documents() {
        check(RUN_FINISH, RunFinishParams::NAMES);
    }
}
