//! A user's data (`lsm_storage`, `raw_logs`, `archive_marks`,
//! `forgotten_users`, and every table that holds the user's requests): the
//! user's view, corrections, and the erase batches of forgetting.
//!
//! Guarantees:
//! - Every statement takes the user as [`UserKey`] and filters by it first,
//!   so a record or turn of another user is "not found" (invariant 7). A
//!   tenant's user is a stored user id of its own ([`UserKey`]).
//! - A correction is one statement: the change, the memory version bump and
//!   the `operator_actions` row commit together. The audit detail names
//!   rows, never the text that was removed.
//! - An erase batch deletes at most `batch` rows in one short statement;
//!   the caller loops until a batch comes back short.

use super::GenericClient;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::as_limit;
use crate::db::Error;

super::statements! {
    STATE = "users_state",
    RECORDS = "users_records",
    PENDING_TURNS = "users_pending_turns",
    DELETE_RECORD = "users_delete_record",
    DELETE_TURN = "users_delete_turn",
    REPLACE_SUMMARY = "users_replace_summary",
    FORGET_BEGIN = "users_forget_begin",
    FORGET_BARRIER = "users_forget_barrier",
    FORGET_FINISH = "users_forget_finish",
    UNFINISHED = "users_unfinished",
    ERASE_REQUESTS = "users_erase_requests",
    ERASE_TURNS = "users_erase_turns",
    ERASE_RECORDS = "users_erase_records",
    ERASE_KEYS = "users_erase_keys",
    ERASE_ACTIONS = "users_erase_actions",
    ERASE_MARK = "users_erase_mark",
    EXPORT_REQUESTS = "users_export_requests",
    EXPORT_STEPS = "users_export_steps",
    EXPORT_TURNS = "users_export_turns",
    EXPORT_RECORDS = "users_export_records",
    REMEMBER = "users_remember",
    LOG_CONVERSATION = "users_log_conversation",
    THREADS = "users_threads",
}

/// Whose data a statement reads or changes: the stored user id (a
/// tenant's user id mapped by `maas_tenant_user`, sql/0012_tenants.sql, so
/// a tenant reaches only its own users) and the id the caller knows the
/// user by, which answers show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UserKey {
    /// As stored; every statement filters by it.
    pub user_id: Uuid,
    /// As the caller named it (equal for the default tenant).
    pub shown: Uuid,
}

impl UserKey {
    /// A user of the default tenant (stored and shown ids are one).
    pub fn new(user_id: Uuid) -> UserKey {
        UserKey {
            user_id,
            shown: user_id,
        }
    }

    /// A tenant's user `shown`, stored as `user_id`.
    pub fn of_tenant(user_id: Uuid, shown: Uuid) -> UserKey {
        UserKey { user_id, shown }
    }
}

impl Serialize for UserKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.shown.serialize(s)
    }
}

impl std::fmt::Display for UserKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shown.fmt(f)
    }
}

super::row_struct! {
    /// What is held about a user at a glance (one row, NULLs where nothing).
    #[derive(Debug, Clone, Serialize)]
    pub struct UserState {
        pub user_id: Uuid,
        pub logged_seq: Option<i64>,
        pub archived_seq: Option<i64>,
        pub memory_version: Option<i64>,
        pub pending_since: Option<DateTime<Utc>>,
        pub last_archived_at: Option<DateTime<Utc>>,
        pub has_requests: bool,
        pub has_records: bool,
        pub forgotten_at: Option<DateTime<Utc>>,
        pub erase_finished_at: Option<DateTime<Utc>>,
        pub forgotten_by: Option<String>,
        pub forgotten_reason: Option<String>,
    }
}

impl UserState {
    /// Anything held: an archive mark, a request or a record.
    pub fn is_known(&self) -> bool {
        self.logged_seq.is_some() || self.has_requests || self.has_records
    }
}

/// What is held about `user` at a glance. One round trip.
pub async fn state(client: &impl GenericClient, user: UserKey) -> Result<UserState, Error> {
    super::query_one_as(client, STATE, &[&user.user_id]).await
}

super::row_struct! {
    /// One record as the user's view shows it.
    #[derive(Debug, Clone, Serialize)]
    pub struct RecordView {
        pub id: i64,
        pub time_bucket_start: DateTime<Utc>,
        pub time_bucket_end: DateTime<Utc>,
        pub tags: Vec<String>,
        pub summary: String,
        /// How many turns it covers.
        pub turns: i64,
        pub created_at: DateTime<Utc>,
    }
}

/// Up to `limit` records of `user` with an id below `before` (all when
/// `None`), newest first.
pub async fn records(
    client: &impl GenericClient,
    user: UserKey,
    before: Option<i64>,
    limit: usize,
) -> Result<Vec<RecordView>, Error> {
    user_page(client, RECORDS, user, &before, limit).await
}

super::row_struct! {
    /// One turn as the user's view and the export show it.
    #[derive(Debug, Clone, Serialize)]
    pub struct TurnView {
        pub id: i64,
        pub user_seq: i64,
        pub request_id: Option<Uuid>,
        pub thread_id: Option<Uuid>,
        pub message_type: String,
        pub content: String,
        pub created_at: DateTime<Utc>,
    }
}

/// Up to `limit` turns of `user` not archived yet, with a `user_seq` below
/// `before` (all when `None`), newest first.
pub async fn pending_turns(
    client: &impl GenericClient,
    user: UserKey,
    before: Option<i64>,
    limit: usize,
) -> Result<Vec<TurnView>, Error> {
    user_page(client, PENDING_TURNS, user, &before, limit).await
}

/// Runs `sql`, a page of `user`'s rows: `$1` the user, `$2` where the page
/// starts (`bound`), `$3` the limit.
async fn user_page<T: super::FromRow>(
    client: &impl GenericClient,
    sql: &str,
    user: UserKey,
    bound: &(dyn ToSql + Sync),
    limit: usize,
) -> Result<Vec<T>, Error> {
    super::query_as(client, sql, &[&user.user_id, bound, &as_limit(limit)]).await
}

super::row_struct! {
    /// A correction that was applied: the row and the new memory version.
    #[derive(Debug, Clone, Copy, Serialize)]
    pub struct Corrected {
        pub id: i64,
        pub memory_version: i64,
    }
}

/// Who corrects, and why (for `operator_actions`).
#[derive(Debug, Clone, Copy)]
pub struct Why<'a> {
    pub actor: &'a str,
    pub reason: Option<&'a str>,
}

/// Deletes record `record` of `user`; `None` when the user has no such record.
pub async fn delete_record(
    client: &impl GenericClient,
    user: UserKey,
    record: i64,
    why: Why<'_>,
) -> Result<Option<Corrected>, Error> {
    super::query_opt_as(
        client,
        DELETE_RECORD,
        &[&user.user_id, &record, &why.actor, &why.reason],
    )
    .await
}

/// Deletes turn `turn` of `user` (and its id from the records covering it);
/// `None` when the user has no such turn.
pub async fn delete_turn(
    client: &impl GenericClient,
    user: UserKey,
    turn: i64,
    why: Why<'_>,
) -> Result<Option<Corrected>, Error> {
    super::query_opt_as(client, DELETE_TURN, &[&user.user_id, &turn, &why.actor, &why.reason]).await
}

/// Replaces the summary of record `record` of `user`; `None` when the user
/// has no such record.
pub async fn replace_summary(
    client: &impl GenericClient,
    user: UserKey,
    record: i64,
    summary: &str,
    why: Why<'_>,
) -> Result<Option<Corrected>, Error> {
    super::query_opt_as(
        client,
        REPLACE_SUMMARY,
        &[&user.user_id, &record, &summary, &why.actor, &why.reason],
    )
    .await
}

/// Writes the tombstone of `user`; false when one exists already.
pub async fn forget_begin(client: &impl GenericClient, user: UserKey, why: Why<'_>) -> Result<bool, Error> {
    super::query_found(client, FORGET_BEGIN, &[&user.user_id, &why.actor, &why.reason]).await
}

/// Waits until every transaction that passed the guard of `user`'s bucket
/// before the tombstone has ended (their rows are then visible to the
/// erase batches). Run it in its own transaction after the tombstone
/// committed; the lock is released when that transaction ends.
pub async fn forget_barrier(client: &impl GenericClient, user: UserKey) -> Result<(), Error> {
    super::query_one_value::<bool>(client, FORGET_BARRIER, &[&user.user_id], "waited").await?;
    Ok(())
}

/// Marks the erase of `user` finished with what it deleted.
pub async fn forget_finish(client: &impl GenericClient, user: UserKey, erased: &Value) -> Result<(), Error> {
    super::execute(client, FORGET_FINISH, &[&user.user_id, erased]).await?;
    Ok(())
}

/// Users whose erase began more than `older_than` ago and has not finished
/// (at most 100, oldest first).
pub async fn unfinished(client: &impl GenericClient, older_than: std::time::Duration) -> Result<Vec<Uuid>, Error> {
    super::query_column(client, UNFINISHED, &[&super::secs(older_than)], "user_id").await
}

/// The tables an erase deletes from, in the order it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EraseTable {
    /// `pipeline_runs` with steps, keys, callbacks and actions of each.
    Requests,
    /// `raw_logs`.
    Turns,
    /// `lsm_storage`.
    Records,
    /// `http_idempotency_keys` left without a request.
    Keys,
    /// `operator_actions` about the user's memory.
    Actions,
    /// `archive_marks`, and the user's name in `archive_runs`.
    Mark,
}

impl EraseTable {
    pub const ALL: [EraseTable; 6] = [
        EraseTable::Requests,
        EraseTable::Turns,
        EraseTable::Records,
        EraseTable::Keys,
        EraseTable::Actions,
        EraseTable::Mark,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EraseTable::Requests => "requests",
            EraseTable::Turns => "turns",
            EraseTable::Records => "records",
            EraseTable::Keys => "idempotency_keys",
            EraseTable::Actions => "operator_actions",
            EraseTable::Mark => "archive_state",
        }
    }
}

/// Deletes up to `batch` rows of `user` from `table`; returns how many.
pub async fn erase_batch(
    client: &impl GenericClient,
    user: UserKey,
    table: EraseTable,
    batch: usize,
) -> Result<i64, Error> {
    let sql = match table {
        EraseTable::Requests => ERASE_REQUESTS,
        EraseTable::Turns => ERASE_TURNS,
        EraseTable::Records => ERASE_RECORDS,
        EraseTable::Keys => ERASE_KEYS,
        EraseTable::Actions => ERASE_ACTIONS,
        EraseTable::Mark => ERASE_MARK,
    };
    super::query_one_value(client, sql, &[&user.user_id, &as_limit(batch)], "deleted").await
}

// ---- export ----------------------------------------------------------------

/// Up to `limit` requests of `user` after `after` (`(created_at, id)` of
/// the last one of the previous page; `None`: from the first), oldest first.
pub async fn export_requests(
    client: &impl GenericClient,
    user: UserKey,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: usize,
) -> Result<Vec<super::requests::Request>, Error> {
    let (at, id) = (after.map(|a| a.0), after.map(|a| a.1));
    super::query_as(client, EXPORT_REQUESTS, &[&user.user_id, &at, &id, &as_limit(limit)]).await
}

/// One stage attempt of an exported request: the request's id (not
/// exported: the step is written inside its request) and the step as
/// `maasctl requests show` reads it.
#[derive(Debug, Clone, Serialize)]
pub struct ExportStep {
    #[serde(skip)]
    pub request_id: Uuid,
    #[serde(flatten)]
    pub step: super::steps::Step,
}

impl super::FromRow for ExportStep {
    fn from_row(r: &tokio_postgres::Row) -> Result<ExportStep, Error> {
        Ok(ExportStep {
            request_id: r.try_get("run_id")?,
            step: super::steps::Step::from_row(r)?,
        })
    }
}

/// The steps of `requests` (requests of `user`), by request and in order.
pub async fn export_steps(
    client: &impl GenericClient,
    user: UserKey,
    requests: &[Uuid],
) -> Result<Vec<ExportStep>, Error> {
    super::query_as(client, EXPORT_STEPS, &[&user.user_id, &requests]).await
}

/// Up to `limit` turns of `user` with `user_seq` above `after`, in order.
pub async fn export_turns(
    client: &impl GenericClient,
    user: UserKey,
    after: i64,
    limit: usize,
) -> Result<Vec<TurnView>, Error> {
    user_page(client, EXPORT_TURNS, user, &after, limit).await
}

super::row_struct! {
    /// One record in the export.
    #[derive(Debug, Clone, Serialize)]
    pub struct ExportRecord {
        pub id: i64,
        pub time_bucket_start: DateTime<Utc>,
        pub time_bucket_end: DateTime<Utc>,
        pub tags: Vec<String>,
        pub summary: String,
        pub raw_log_ids: Vec<i64>,
        pub created_at: DateTime<Utc>,
    }
}

/// Up to `limit` records of `user` with an id above `after`, oldest first.
pub async fn export_records(
    client: &impl GenericClient,
    user: UserKey,
    after: i64,
    limit: usize,
) -> Result<Vec<ExportRecord>, Error> {
    user_page(client, EXPORT_RECORDS, user, &after, limit).await
}

super::row_struct! {
    /// A turn stored by [`remember`].
    #[derive(Debug, Clone, Serialize)]
    pub struct Remembered {
        pub id: i64,
        pub thread_id: Uuid,
        pub created_at: DateTime<Utc>,
    }
}

/// Stores `content` as what `user` said in `thread` (a `user_query` turn);
/// `None` when the guard dropped it (the user was forgotten).
pub async fn remember(
    client: &impl GenericClient,
    user: UserKey,
    thread: Uuid,
    content: &str,
) -> Result<Option<Remembered>, Error> {
    super::query_opt_as(client, REMEMBER, &[&user.user_id, &thread, &content]).await
}

/// Logs the turns of a conversation a client sent (`(message_type,
/// content)`, in order) that `thread` of `user` does not hold yet; a turn
/// already there is recognised, not logged twice. How many were logged.
pub async fn log_conversation(
    client: &impl GenericClient,
    user: UserKey,
    thread: Uuid,
    turns: &[(&str, &str)],
) -> Result<i64, Error> {
    let (types, contents): (Vec<&str>, Vec<&str>) = turns.iter().copied().unzip();
    super::query_one_value(
        client,
        LOG_CONVERSATION,
        &[&user.user_id, &thread, &types, &contents],
        "logged",
    )
    .await
}

super::row_struct! {
    /// One of a user's recent threads.
    #[derive(Debug, Clone, Serialize)]
    pub struct ThreadView {
        pub thread_id: Uuid,
        pub turns: i64,
        pub started_at: DateTime<Utc>,
        pub last_at: DateTime<Utc>,
        pub last_turn: String,
    }
}

/// `user`'s most recent threads, newest first, at most `limit`.
pub async fn threads(client: &impl GenericClient, user: UserKey, limit: usize) -> Result<Vec<ThreadView>, Error> {
    super::query_as(client, THREADS, &[&user.user_id, &super::as_limit(limit)]).await
}
