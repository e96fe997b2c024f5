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

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::Row;
use uuid::Uuid;

use super::{FromRow, as_limit, row_as, rows_as, secs};
use crate::db::Error;
use crate::model::Status;

const SUBMIT: &str = include_str!("../../sql/queries/submit_request.sql");
const GET: &str = include_str!("../../sql/queries/show_run.sql");
const CONTEXT: &str = include_str!("../../sql/queries/run_context.sql");
const LIST: &str = include_str!("../../sql/queries/list_runs.sql");
const STATES: &str = include_str!("../../sql/queries/request_states.sql");
const USER_STATES: &str = include_str!("../../sql/queries/user_states.sql");
const STATUS: &str = include_str!("../../sql/queries/run_status.sql");
const FAILED_IDS: &str = include_str!("../../sql/queries/failed_ids.sql");
const CANCEL: &str = include_str!("../../sql/queries/cancel_run.sql");
const CONTINUE: &str = include_str!("../../sql/queries/continue_run.sql");
const RETRY_FAILED: &str = include_str!("../../sql/queries/retry_failed.sql");
const COUNT_BACKLOG: &str = include_str!("../../sql/queries/count_backlog.sql");
const COUNT_EXPIRED_LEASES: &str = include_str!("../../sql/queries/count_expired_leases.sql");
const DUE_COUNTS: &str = include_str!("../../sql/queries/due_counts.sql");
const RING_DUE: &str = include_str!("../../sql/queries/ring_due.sql");

/// This file's statements, for [`super::all`].
pub(super) const STATEMENTS: &[(&str, &str)] = &[
    ("submit_request", SUBMIT),
    ("show_run", GET),
    ("run_context", CONTEXT),
    ("list_runs", LIST),
    ("request_states", STATES),
    ("user_states", USER_STATES),
    ("run_status", STATUS),
    ("failed_ids", FAILED_IDS),
    ("cancel_run", CANCEL),
    ("continue_run", CONTINUE),
    ("retry_failed", RETRY_FAILED),
    ("count_backlog", COUNT_BACKLOG),
    ("count_expired_leases", COUNT_EXPIRED_LEASES),
    ("due_counts", DUE_COUNTS),
    ("ring_due", RING_DUE),
];

// ---- submit ------------------------------------------------------------

/// A new request as the API received it.
#[derive(Debug, Clone)]
pub struct NewRequest<'a> {
    pub user_id: Uuid,
    pub thread_id: Option<Uuid>,
    pub query: &'a str,
}

/// Inserts a request; returns its id. (With an idempotency key:
/// [`super::idempotency::submit`].)
pub async fn submit_request(client: &impl GenericClient, req: &NewRequest<'_>) -> Result<Uuid, Error> {
    let stmt = client.prepare_cached(SUBMIT).await?;
    let row = client
        .query_one(&stmt, &[&req.user_id, &req.thread_id, &req.query])
        .await?;
    Ok(row.try_get("id")?)
}

// ---- reads ---------------------------------------------------------------

/// A request: every column of its `pipeline_runs` row. Serialised (field
/// names = column names) it is the `request` of `maasctl requests show --json`.
#[derive(Debug, Clone, Serialize)]
pub struct Request {
    pub id: Uuid,
    pub user_id: Uuid,
    pub thread_id: Option<Uuid>,
    pub user_query: String,
    pub status: String,
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
}

impl FromRow for Request {
    fn from_row(r: &Row) -> Result<Request, Error> {
        Ok(Request {
            id: r.try_get("id")?,
            user_id: r.try_get("user_id")?,
            thread_id: r.try_get("thread_id")?,
            user_query: r.try_get("user_query")?,
            status: r.try_get("status")?,
            analysis_result: r.try_get("analysis_result")?,
            final_context_payload: r.try_get("final_context_payload")?,
            final_answer: r.try_get("final_answer")?,
            error: r.try_get("error")?,
            debug: r.try_get("debug")?,
            attempt: r.try_get("attempt")?,
            run_after: r.try_get("run_after")?,
            lease_owner: r.try_get("lease_owner")?,
            lease_expires_at: r.try_get("lease_expires_at")?,
            lease_token: r.try_get("lease_token")?,
            created_at: r.try_get("created_at")?,
            updated_at: r.try_get("updated_at")?,
            held: r.try_get("held")?,
            callback_url: r.try_get("callback_url")?,
            context_sources: r.try_get("context_sources")?,
        })
    }
}

/// One request, `None` for an unknown id.
pub async fn get(client: &impl GenericClient, id: Uuid) -> Result<Option<Request>, Error> {
    let stmt = client.prepare_cached(GET).await?;
    row_as(client.query_opt(&stmt, &[&id]).await?)
}

/// A run's assembled context and the memory it holds.
#[derive(Debug, Clone, Serialize)]
pub struct RunContext {
    pub context: Option<String>,
    /// `[{kind, id, score, why}]`, `None` before the assemble stage.
    pub context_sources: Option<Value>,
}

impl FromRow for RunContext {
    fn from_row(r: &Row) -> Result<RunContext, Error> {
        Ok(RunContext {
            context: r.try_get("final_context_payload")?,
            context_sources: r.try_get("context_sources")?,
        })
    }
}

/// One run's context and its sources, `None` for an unknown id.
pub async fn context_of(client: &impl GenericClient, id: Uuid) -> Result<Option<RunContext>, Error> {
    let stmt = client.prepare_cached(CONTEXT).await?;
    row_as(client.query_opt(&stmt, &[&id]).await?)
}

/// Filters of `maasctl requests list`; `None` means any.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub statuses: Option<Vec<String>>,
    pub user_id: Option<Uuid>,
    /// Unchanged for longer than this.
    pub older_than: Option<Duration>,
    pub limit: usize,
}

/// One line of `maasctl requests list` (its JSON too): the request without
/// its stage outputs, and the first 120 characters of its query.
#[derive(Debug, Clone, Serialize)]
pub struct RequestSummary {
    pub id: Uuid,
    pub status: String,
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

impl FromRow for RequestSummary {
    fn from_row(r: &Row) -> Result<RequestSummary, Error> {
        Ok(RequestSummary {
            id: r.try_get("id")?,
            status: r.try_get("status")?,
            user_id: r.try_get("user_id")?,
            attempt: r.try_get("attempt")?,
            debug: r.try_get("debug")?,
            held: r.try_get("held")?,
            has_callback: r.try_get("has_callback")?,
            created_at: r.try_get("created_at")?,
            updated_at: r.try_get("updated_at")?,
            run_after: r.try_get("run_after")?,
            lease_owner: r.try_get("lease_owner")?,
            error: r.try_get("error")?,
            query: r.try_get("query")?,
        })
    }
}

/// Requests matching `f`, most recently changed first.
pub async fn list(client: &impl GenericClient, f: &ListFilter) -> Result<Vec<RequestSummary>, Error> {
    let stmt = client.prepare_cached(LIST).await?;
    let older: Option<f64> = f.older_than.map(secs);
    let rows = client
        .query(&stmt, &[&f.statuses, &f.user_id, &older, &as_limit(f.limit)])
        .await?;
    rows_as(&rows)
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

    fn from_rows(rows: &[Row]) -> Result<Vec<RequestStatus>, Error> {
        rows.iter().filter_map(|r| Self::from_row(r).transpose()).collect()
    }
}

/// The states of the given requests (absent ids are left out).
pub async fn request_states(client: &impl GenericClient, ids: &[Uuid]) -> Result<Vec<RequestStatus>, Error> {
    let stmt = client.prepare_cached(STATES).await?;
    let rows = client.query(&stmt, &[&ids]).await?;
    RequestStatus::from_rows(&rows)
}

/// The requests of `user` that are not terminal, plus those changed since
/// `since` when given; newest first, at most `limit`.
pub async fn user_states(
    client: &impl GenericClient,
    user: Uuid,
    since: Option<DateTime<Utc>>,
    limit: i64,
) -> Result<Vec<RequestStatus>, Error> {
    let stmt = client.prepare_cached(USER_STATES).await?;
    let rows = client.query(&stmt, &[&user, &since, &limit]).await?;
    RequestStatus::from_rows(&rows)
}

/// The status of a request, `None` for an unknown id.
pub async fn status(client: &impl GenericClient, id: Uuid) -> Result<Option<String>, Error> {
    let stmt = client.prepare_cached(STATUS).await?;
    Ok(client
        .query_opt(&stmt, &[&id])
        .await?
        .map(|r| r.try_get("status"))
        .transpose()?)
}

/// Every `FAILED` request's id, oldest failure first.
pub async fn failed_ids(client: &impl GenericClient) -> Result<Vec<Uuid>, Error> {
    let stmt = client.prepare_cached(FAILED_IDS).await?;
    let rows = client.query(&stmt, &[]).await?;
    rows.iter().map(|r| Ok(r.try_get("id")?)).collect()
}

// ---- operator transitions ------------------------------------------------

/// What [`cancel`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelResult {
    /// The status before.
    pub status: String,
    /// False: it was already terminal.
    pub cancelled: bool,
}

/// Cancels a request unless it is terminal, recorded as `actor`'s action:
/// `None` for an unknown id.
pub async fn cancel(
    client: &impl GenericClient,
    id: Uuid,
    actor: &str,
    reason: Option<&str>,
) -> Result<Option<CancelResult>, Error> {
    let stmt = client.prepare_cached(CANCEL).await?;
    let Some(r) = client.query_opt(&stmt, &[&id, &actor, &reason]).await? else {
        return Ok(None);
    };
    Ok(Some(CancelResult {
        status: r.try_get("status")?,
        cancelled: r.try_get("cancelled")?,
    }))
}

/// What [`continue_held`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContinueResult {
    pub status: String,
    pub debug: bool,
    /// False: it was not resting.
    pub released: bool,
}

/// Releases a held debug request to its next stage and rings the doorbell,
/// recorded as `actor`'s action: `None` for an unknown id.
pub async fn continue_held(
    client: &impl GenericClient,
    id: Uuid,
    actor: &str,
    reason: Option<&str>,
) -> Result<Option<ContinueResult>, Error> {
    let stmt = client.prepare_cached(CONTINUE).await?;
    let Some(r) = client.query_opt(&stmt, &[&id, &actor, &reason]).await? else {
        return Ok(None);
    };
    Ok(Some(ContinueResult {
        status: r.try_get("status")?,
        debug: r.try_get("debug")?,
        released: r.try_get("released")?,
    }))
}

/// A `FAILED` request sent back to a ready status.
#[derive(Debug, Clone, Serialize)]
pub struct Retried {
    pub id: Uuid,
    /// The ready status it went back to.
    pub status: String,
    /// The stage that will run again.
    pub stage: String,
    /// The error it had.
    pub error: Option<String>,
}

impl FromRow for Retried {
    fn from_row(r: &Row) -> Result<Retried, Error> {
        Ok(Retried {
            id: r.try_get("id")?,
            status: r.try_get("status")?,
            stage: r.try_get("stage")?,
            error: r.try_get("error")?,
        })
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
    let stmt = client.prepare_cached(RETRY_FAILED).await?;
    let ids: Option<Vec<Uuid>> = ids.map(<[Uuid]>::to_vec);
    let rows = client.query(&stmt, &[&ids, &as_limit(max), &actor, &reason]).await?;
    rows_as(&rows)
}

// ---- counts and the doorbell ---------------------------------------------

/// Requests by non-terminal status, plus `FAILED`: (status, count).
pub async fn count_backlog(client: &impl GenericClient) -> Result<Vec<(String, i64)>, Error> {
    let stmt = client.prepare_cached(COUNT_BACKLOG).await?;
    let rows = client.query(&stmt, &[]).await?;
    rows.iter()
        .map(|r| Ok((r.try_get("status")?, r.try_get("n")?)))
        .collect()
}

/// How many leases ran out and are not yet taken back.
pub async fn count_expired_leases(client: &impl GenericClient) -> Result<i64, Error> {
    let stmt = client.prepare_cached(COUNT_EXPIRED_LEASES).await?;
    Ok(client.query_one(&stmt, &[]).await?.try_get("expired")?)
}

/// Due dispatchable rows by status: (status, count, seconds the oldest waited).
pub async fn due_counts(client: &impl GenericClient) -> Result<Vec<(String, i64, f64)>, Error> {
    let stmt = client.prepare_cached(DUE_COUNTS).await?;
    let rows = client.query(&stmt, &[]).await?;
    rows.iter()
        .map(|r| Ok((r.try_get("status")?, r.try_get("due")?, r.try_get("oldest_due_secs")?)))
        .collect()
}

/// Rings the doorbell for every status that has due rows; returns how many
/// notifications were sent.
pub async fn ring_due(client: &impl GenericClient) -> Result<usize, Error> {
    let stmt = client.prepare_cached(RING_DUE).await?;
    Ok(client.query(&stmt, &[]).await?.len())
}
