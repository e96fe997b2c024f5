//! Requests (`pipeline_runs`): submitting one, reading them (the API's
//! status, `maasctl requests list|show`), the operator transitions (cancel,
//! continue, retry) and the doorbell. The stage attempts on the same table
//! (claim, finish, leases) are in [`super::attempts`].
//!
//! Three row types, one per column set read: [`Request`] (every column, for
//! one request), [`RequestSummary`] (a list line, the query cut short) and
//! [`RequestStatus`] (what the API shows: status, answer, error — kept narrow
//! because the live push reads it for every terminal notification).
//! Every operator transition is one statement that also writes its
//! `operator_actions` row.

use std::time::Duration;

use super::GenericClient;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::Row;
use uuid::Uuid;

use tokio_postgres::types::ToSql;

use super::{as_limit, secs};
use crate::db::Error;
use crate::model::{StageKind, Status};

super::statements! {
    SUBMIT = "submit_request",
    GET = "show_request",
    LIST = "list_requests",
    STATES = "request_states",
    TENANT_STATE = "request_state_of_tenant",
    OF_TENANT = "request_of_tenant": "SELECT id FROM pipeline_runs WHERE id = $1 AND tenant_id = $2",
    USER_STATES = "user_states",
    CONTEXT = "request_context",
    STATUS = "request_status",
    FAILED_IDS = "failed_ids",
    CANCEL = "cancel_request",
    CONTINUE = "continue_run",
    RETRY_FAILED = "retry_failed",
    COUNT_BACKLOG = "count_backlog",
    COUNT_EXPIRED_LEASES = "count_expired_leases",
    DUE_COUNTS = "due_counts",
    RING_DUE = "ring_due",
    METADATA = "request_metadata",
}

// ---- submit ------------------------------------------------------------

/// A new request as the API received it.
#[derive(Debug, Clone)]
pub struct NewRequest<'a> {
    pub user_id: Uuid,
    pub thread_id: Option<Uuid>,
    pub query: &'a str,
    /// Where the outcome is POSTed (`callbacks`).
    pub callback_url: Option<&'a str>,
    /// Rest between stages until continued.
    pub debug: bool,
    /// Whose request it is ([`super::tenants::DEFAULT`] for the default
    /// tenant); `user_id` is the tenant's own id for its user.
    pub tenant_id: Uuid,
    /// The client's own JSON object (`metadata`), stored as is.
    pub metadata: Option<&'a Value>,
}

/// Inserts a request; returns its id. (With an idempotency key:
/// [`super::idempotency::submit`].)
pub async fn submit_request(client: &impl GenericClient, req: &NewRequest<'_>) -> Result<Uuid, Error> {
    super::query_one_value(
        client,
        SUBMIT,
        &[
            &req.user_id,
            &req.thread_id,
            &req.query,
            &req.callback_url,
            &req.debug,
            &req.tenant_id,
            &req.metadata,
        ],
        "id",
    )
    .await
}

// ---- reads ---------------------------------------------------------------

super::row_struct! {
    /// A request: every column of its `pipeline_runs` row. Serialised (field
    /// names = column names) it is the `request` of `maasctl requests show --json`.
    #[derive(Debug, Clone, Serialize)]
    pub struct Request {
        pub id: Uuid,
        pub user_id: Uuid,
        pub thread_id: Option<Uuid>,
        pub user_query: String,
        pub status: Status,
        pub analysis_result: Option<Value>,
        pub final_context_payload: Option<String>,
        pub final_answer: Option<String>,
        pub error: Option<String>,
        pub debug: bool,
        pub attempt: i32,
        pub run_after: DateTime<Utc>,
        pub lease_owner: Option<String>,
        pub lease_expires_at: Option<DateTime<Utc>>,
        pub lease_token: i64,
        pub created_at: DateTime<Utc>,
        pub updated_at: DateTime<Utc>,
        /// Debug mode: resting until an operator continues it.
        pub held: bool,
        pub callback_url: Option<String>,
        /// The memory its context holds: `[{kind, id, score, why}]`.
        pub context_sources: Option<Value>,
        /// The client's own JSON object given at submit.
        pub metadata: Option<Value>,
    }
}

/// One request, `None` for an unknown id.
pub async fn get(client: &impl GenericClient, id: Uuid) -> Result<Option<Request>, Error> {
    super::query_opt_as(client, GET, &[&id]).await
}

super::row_struct! {
    /// A request's assembled context and the memory it holds.
    #[derive(Debug, Clone, Serialize)]
    pub struct RequestContext {
        pub context = "final_context_payload": Option<String>,
        /// `[{kind, id, score, why}]`, `None` before the assemble stage.
        pub context_sources: Option<Value>,
    }
}

/// One request's context and its sources, `None` for an unknown id or a
/// request of another tenant than `tenant`.
pub async fn context_of(client: &impl GenericClient, id: Uuid, tenant: Uuid) -> Result<Option<RequestContext>, Error> {
    super::query_opt_as(client, CONTEXT, &[&id, &tenant]).await
}

/// True when request `id` exists and is tenant `tenant`'s.
pub async fn is_of_tenant(client: &impl GenericClient, id: Uuid, tenant: Uuid) -> Result<bool, Error> {
    super::query_found(client, OF_TENANT, &[&id, &tenant]).await
}

/// A request's `metadata`: the outer `None` for an unknown id.
pub async fn metadata_of(client: &impl GenericClient, id: Uuid) -> Result<Option<Option<Value>>, Error> {
    super::query_opt_value(client, METADATA, &[&id], "metadata").await
}

/// Filters of `maasctl requests list`; `None` means any.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub statuses: Option<Vec<Status>>,
    pub user_id: Option<Uuid>,
    /// Unchanged for longer than this.
    pub older_than: Option<Duration>,
    pub limit: usize,
}

super::row_struct! {
    /// One line of `maasctl requests list` (its JSON too): the request without
    /// its stage outputs, and the first 120 characters of its query.
    #[derive(Debug, Clone, Serialize)]
    pub struct RequestSummary {
        pub id: Uuid,
        pub status: Status,
        pub user_id: Uuid,
        pub attempt: i32,
        pub debug: bool,
        pub held: bool,
        pub has_callback: bool,
        pub created_at: DateTime<Utc>,
        pub updated_at: DateTime<Utc>,
        pub run_after: DateTime<Utc>,
        pub lease_owner: Option<String>,
        pub error: Option<String>,
        pub query: String,
    }
}

/// Requests matching `f`, most recently changed first.
pub async fn list(client: &impl GenericClient, f: &ListFilter) -> Result<Vec<RequestSummary>, Error> {
    let older: Option<f64> = f.older_than.map(secs);
    let statuses: Option<Vec<&str>> = f.statuses.as_ref().map(|s| s.iter().map(|s| s.as_str()).collect());
    super::query_as(client, LIST, &[&statuses, &f.user_id, &older, &as_limit(f.limit)]).await
}

/// What the API shows of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestStatus {
    pub id: Uuid,
    pub user_id: Uuid,
    pub status: Status,
    pub answer: Option<String>,
    pub error: Option<String>,
}

impl RequestStatus {
    /// A row's state; `None` for a status this program does not know (a row
    /// written by something else), an error for a column of the wrong type.
    fn from_row(r: &Row) -> Result<Option<RequestStatus>, Error> {
        let status: &str = r.try_get("status")?;
        let Ok(status) = status.parse() else { return Ok(None) };
        Ok(Some(RequestStatus {
            id: r.try_get("id")?,
            user_id: r.try_get("user_id")?,
            status,
            answer: r.try_get("final_answer")?,
            error: r.try_get("error")?,
        }))
    }

    /// The known states among the rows of `sql`.
    async fn query(
        client: &impl GenericClient,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<RequestStatus>, Error> {
        let rows = super::rows_of(client, sql, params).await?;
        rows.iter().filter_map(|r| Self::from_row(r).transpose()).collect()
    }
}

/// The states of the given requests (absent ids are left out).
pub async fn request_states(client: &impl GenericClient, ids: &[Uuid]) -> Result<Vec<RequestStatus>, Error> {
    RequestStatus::query(client, STATES, &[&ids]).await
}

/// The state of request `id` if it is tenant `tenant`'s (else none).
pub async fn request_state_of_tenant(
    client: &impl GenericClient,
    id: Uuid,
    tenant: Uuid,
) -> Result<Vec<RequestStatus>, Error> {
    RequestStatus::query(client, TENANT_STATE, &[&id, &tenant]).await
}

/// The requests of `user` that are not terminal, plus those changed since
/// `since` when given; newest first, at most `limit`.
pub async fn user_states(
    client: &impl GenericClient,
    user: Uuid,
    since: Option<DateTime<Utc>>,
    limit: i64,
) -> Result<Vec<RequestStatus>, Error> {
    RequestStatus::query(client, USER_STATES, &[&user, &since, &limit]).await
}

/// The status of a request, `None` for an unknown id.
pub async fn status(client: &impl GenericClient, id: Uuid) -> Result<Option<Status>, Error> {
    super::query_opt_value(client, STATUS, &[&id], "status").await
}

/// Every `FAILED` request's id, oldest failure first.
pub async fn failed_ids(client: &impl GenericClient) -> Result<Vec<Uuid>, Error> {
    super::query_column(client, FAILED_IDS, &[], "id").await
}

// ---- operator transitions ------------------------------------------------

super::row_struct! {
    /// What [`cancel`] found and did.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct CancelResult {
        /// The status before.
        pub status: Status,
        /// False: it was already terminal.
        pub cancelled: bool,
    }
}

/// Cancels a request unless it is terminal, recorded as `actor`'s action:
/// `None` for an unknown id.
pub async fn cancel(
    client: &impl GenericClient,
    id: Uuid,
    actor: &str,
    reason: Option<&str>,
) -> Result<Option<CancelResult>, Error> {
    super::query_opt_as(client, CANCEL, &[&id, &actor, &reason]).await
}

super::row_struct! {
    /// What [`continue_held`] found and did.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct ContinueResult {
        pub status: Status,
        pub debug: bool,
        /// False: it was not resting.
        pub released: bool,
    }
}

/// Releases a held debug request to its next stage and rings the doorbell,
/// recorded as `actor`'s action: `None` for an unknown id.
pub async fn continue_held(
    client: &impl GenericClient,
    id: Uuid,
    actor: &str,
    reason: Option<&str>,
) -> Result<Option<ContinueResult>, Error> {
    super::query_opt_as(client, CONTINUE, &[&id, &actor, &reason]).await
}

super::row_struct! {
    /// A `FAILED` request sent back to a ready status.
    #[derive(Debug, Clone, Serialize)]
    pub struct Retried {
        pub id: Uuid,
        /// The ready status it went back to.
        pub status: Status,
        /// The stage that will run again.
        pub stage: StageKind,
        /// The error it had.
        pub error: Option<String>,
    }
}

/// Retries `FAILED` requests (`ids`, or all when `None`), at most `max` of
/// them, each recorded as `actor`'s action.
pub async fn retry_failed(
    client: &impl GenericClient,
    ids: Option<&[Uuid]>,
    max: usize,
    actor: &str,
    reason: Option<&str>,
) -> Result<Vec<Retried>, Error> {
    let ids: Option<Vec<Uuid>> = ids.map(<[Uuid]>::to_vec);
    super::query_as(client, RETRY_FAILED, &[&ids, &as_limit(max), &actor, &reason]).await
}

// ---- counts and the doorbell ---------------------------------------------

/// Requests by non-terminal status, plus `FAILED`: (status, count).
pub async fn count_backlog(client: &impl GenericClient) -> Result<Vec<(Status, i64)>, Error> {
    super::status_counts(client, COUNT_BACKLOG, &[]).await
}

/// How many leases ran out and are not yet taken back.
pub async fn count_expired_leases(client: &impl GenericClient) -> Result<i64, Error> {
    super::query_one_value(client, COUNT_EXPIRED_LEASES, &[], "expired").await
}

/// Due dispatchable rows by status: (status, count, seconds the oldest waited).
pub async fn due_counts(client: &impl GenericClient) -> Result<Vec<(Status, i64, f64)>, Error> {
    let rows: Vec<DueCount> = super::query_as(client, DUE_COUNTS, &[]).await?;
    Ok(rows.into_iter().map(|r| (r.status, r.due, r.oldest_due_secs)).collect())
}

super::row_struct! {
    /// A row of `due_counts.sql`.
    struct DueCount {
        status: Status,
        due: i64,
        oldest_due_secs: f64,
    }
}

/// Rings the doorbell for every status that has due rows; returns how many
/// notifications were sent.
pub async fn ring_due(client: &impl GenericClient) -> Result<usize, Error> {
    Ok(super::rows_of(client, RING_DUE, &[]).await?.len())
}
