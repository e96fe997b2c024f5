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
//!
//! One file for the statements on requests, as for every table; the
//! operator console's two reads (recently finished, a page by filter) close
//! it.

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
    RECENTLY_FINISHED = "requests_recently_finished",
    PAGE = "requests_page",
    OF_TENANT = "request_of_tenant": "SELECT id FROM pipeline_runs WHERE id = $1 AND tenant_id = $2",
    TENANT_OF = "request_tenant": "SELECT tenant_id FROM pipeline_runs WHERE id = $1",
    USER_STATES = "user_states",
    CONTEXT = "request_context",
    USAGE = "request_usage",
    STATUS = "request_status",
    FAILED_IDS = "failed_ids",
    CANCEL = "cancel_request",
    CONTINUE = "continue_request",
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
    /// Send the answer's pieces while the model writes (`stream`).
    pub stream: bool,
    /// May the analyzer ask the user a question (`clarify`)? `None`: as
    /// the tenant's `hitl_clarify` says.
    pub clarify: Option<bool>,
    /// An operator reviews the answer before the user gets it (`review`;
    /// false leaves it to the tenant's `hitl_review`).
    pub review: bool,
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
            &req.stream,
            &req.clarify,
            &req.review,
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
        /// The question it waits on (WAITING_USER_INPUT).
        pub question: Option<String>,
        /// When its wait for a person ends by itself.
        pub wait_expires_at: Option<DateTime<Utc>>,
        /// The reviews of its answer (`app::review`), oldest first; `None`
        /// when it had none.
        pub reviews: Option<Value>,
    }
}

/// The tenant of request `id`, `None` for an unknown id.
pub async fn tenant_of(client: &impl GenericClient, id: Uuid) -> Result<Option<Uuid>, Error> {
    super::query_opt_value(client, TENANT_OF, &[&id], "tenant_id").await
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

super::row_struct! {
    /// The model tokens a request used, over every attempt of every stage.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Usage {
        pub prompt_tokens: i64,
        pub completion_tokens: i64,
    }
}

/// The tokens request `id` of `tenant` used (none for another tenant's).
pub async fn usage_of(client: &impl GenericClient, id: Uuid, tenant: Uuid) -> Result<Usage, Error> {
    super::query_one_as(client, USAGE, &[&id, &tenant]).await
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
    super::query_as(client, LIST, &[&f.statuses, &f.user_id, &older, &as_limit(f.limit)]).await
}

/// What the API shows of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestStatus {
    pub id: Uuid,
    pub user_id: Uuid,
    pub status: Status,
    pub answer: Option<String>,
    pub error: Option<String>,
    /// The question it waits on (WAITING_USER_INPUT only).
    pub question: Option<String>,
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
            question: r.try_get("question")?,
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

// ---- the operator console's reads: recently finished requests, a page of
// requests by filter -------------------------------------------------------

super::row_struct! {
    /// A recently finished request.
    #[derive(Debug, Clone, Serialize)]
    pub struct RecentlyFinished {
        pub id: Uuid,
        pub status: Status,
        pub user_id: Uuid,
        pub updated_at: DateTime<Utc>,
        pub error: Option<String>,
        pub query: String,
    }
}

/// The `limit` most recently finished requests (index-only on the finished index).
pub async fn recently_finished(client: &impl GenericClient, limit: usize) -> Result<Vec<RecentlyFinished>, Error> {
    super::query_as(client, RECENTLY_FINISHED, &[&as_limit(limit)]).await
}

/// Rows a text search reads at most for one [`page`] (`requests_page.sql`):
/// bounds its cost on a table of any size; the page says how far it got.
pub const PAGE_TEXT_SCAN: usize = 2_000;

/// Filters of a [`page`] of requests; `None` means any.
#[derive(Debug, Clone, Default)]
pub struct PageFilter {
    pub statuses: Option<Vec<String>>,
    pub user_id: Option<Uuid>,
    pub thread_id: Option<Uuid>,
    /// A substring of the query, case-insensitive.
    pub text: Option<String>,
    /// Created at or after this.
    pub since: Option<DateTime<Utc>>,
    /// Created before this.
    pub until: Option<DateTime<Utc>>,
    /// The page starts after this (created_at, id).
    pub before: Option<(DateTime<Utc>, Uuid)>,
    pub limit: usize,
    /// Only this tenant's requests, each with the user id the tenant uses
    /// (`user_id` is then the stored id of the tenant's user); `None`:
    /// every tenant's, with stored user ids.
    pub tenant: Option<Uuid>,
}

super::statement_params! {
    struct PageParams<'a> {
        statuses: &'a Option<Vec<String>>,
        user_id: &'a Option<Uuid>,
        thread_id: &'a Option<Uuid>,
        text: &'a Option<String>,
        before_created: Option<DateTime<Utc>>,
        before_id: Option<Uuid>,
        since: Option<DateTime<Utc>>,
        until: Option<DateTime<Utc>>,
        limit: i64,
        scan: i64,
        tenant: Option<Uuid>,
    }
}

super::row_struct! {
    /// One line of a [`page`] of requests.
    #[derive(Debug, Clone, Serialize)]
    pub struct PageLine {
        pub id: Uuid,
        pub status: Status,
        pub user_id: Uuid,
        pub thread_id: Option<Uuid>,
        pub attempt: i32,
        pub debug: bool,
        pub held: bool,
        pub created_at: DateTime<Utc>,
        pub updated_at: DateTime<Utc>,
        pub error: Option<String>,
        pub query: String,
    }
}

super::row_struct! {
    /// A row of `requests_page.sql`: a line, or the edge of a text search.
    struct PageRow {
        id: Uuid,
        status: Status,
        user_id: Uuid,
        thread_id: Option<Uuid>,
        attempt: i32,
        debug: bool,
        held: bool,
        created_at: DateTime<Utc>,
        updated_at: DateTime<Utc>,
        error: Option<String>,
        query: String,
        edge: bool,
        scanned: i64,
    }
}

/// One page of requests, newest first.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Page {
    pub lines: Vec<PageLine>,
    /// Where the next page starts, `None` when this is the last.
    pub next: Option<(DateTime<Utc>, Uuid)>,
    /// A text search that stopped before the end: how many requests it
    /// read and the creation time of the oldest (the page may show fewer
    /// than `limit` lines and still have a next one).
    pub searched: Option<(usize, DateTime<Utc>)>,
}

/// One page of requests matching `f`, newest first, paged by keyset (one
/// statement, one snapshot): the operator console's request list.
pub async fn page(client: &impl GenericClient, f: &PageFilter) -> Result<Page, Error> {
    let p = PageParams {
        statuses: &f.statuses,
        user_id: &f.user_id,
        thread_id: &f.thread_id,
        text: &f.text,
        before_created: f.before.map(|b| b.0),
        before_id: f.before.map(|b| b.1),
        since: f.since,
        until: f.until,
        limit: as_limit(f.limit),
        scan: as_limit(PAGE_TEXT_SCAN.max(f.limit)),
        tenant: f.tenant,
    };
    let mut rows: Vec<PageRow> = super::query_as(client, PAGE, &p.params()).await?;
    // Matches come in the order read (`scanned` is the row's place in the
    // window); the SQL does not sort them.
    rows.sort_by_key(|r| (r.edge, r.scanned));
    let mut page = Page::default();
    let mut edge = None;
    for r in rows {
        if r.edge {
            edge = Some((r.created_at, r.id, r.scanned));
            continue;
        }
        page.lines.push(PageLine {
            id: r.id,
            status: r.status,
            user_id: r.user_id,
            thread_id: r.thread_id,
            attempt: r.attempt,
            debug: r.debug,
            held: r.held,
            created_at: r.created_at,
            updated_at: r.updated_at,
            error: r.error,
            query: r.query,
        });
    }
    let full = page.lines.len() >= f.limit;
    let last = page.lines.last().map(|l| (l.created_at, l.id));
    page.next = match edge {
        // A text search: the edge row says how far it read.
        Some((created, id, scanned)) => {
            let scanned = usize::try_from(scanned).unwrap_or(usize::MAX);
            if full {
                last
            } else if scanned >= PAGE_TEXT_SCAN.max(f.limit) {
                page.searched = Some((scanned, created));
                Some((created, id))
            } else {
                None
            }
        }
        None => {
            if full {
                last
            } else {
                None
            }
        }
    };
    Ok(page)
}

#[cfg(test)]
mod page_tests {
    #[test]
    fn page_params_match_the_sql() {
        super::super::params_check::check(super::PAGE, super::PageParams::NAMES);
    }
}
