//! The statements of the HTTP API and its metrics (`sql/queries/`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::db::Error;
use crate::model::Status;

pub const SUBMIT_REQUEST: &str = include_str!("../../sql/queries/submit_request.sql");
pub const SUBMIT_IDEMPOTENT: &str = include_str!("../../sql/queries/submit_idempotent.sql");
pub const FIND_IDEMPOTENT: &str = include_str!("../../sql/queries/find_idempotent.sql");
pub const EXPIRE_IDEMPOTENCY_KEYS: &str = include_str!("../../sql/queries/expire_idempotency_keys.sql");
pub const REQUEST_STATES: &str = include_str!("../../sql/queries/request_states.sql");
pub const USER_STATES: &str = include_str!("../../sql/queries/user_states.sql");
pub const COUNT_BACKLOG: &str = include_str!("../../sql/queries/count_backlog.sql");

/// A new request as the API received it.
#[derive(Debug, Clone)]
pub struct NewRequest<'a> {
    pub user_id: Uuid,
    pub thread_id: Option<Uuid>,
    pub query: &'a str,
}

/// Inserts a request; returns its id.
pub async fn submit_request(client: &impl GenericClient, req: &NewRequest<'_>) -> Result<Uuid, Error> {
    let stmt = client.prepare_cached(SUBMIT_REQUEST).await?;
    let row = client
        .query_one(&stmt, &[&req.user_id, &req.thread_id, &req.query])
        .await?;
    Ok(row.try_get(0)?)
}

/// Inserts a request under an idempotency key. `None` when the key is
/// already taken (and fresh): read its first request with [`find_idempotent`].
pub async fn submit_idempotent(
    client: &impl GenericClient,
    req: &NewRequest<'_>,
    key: &str,
    fingerprint: &str,
    ttl: Duration,
) -> Result<Option<Uuid>, Error> {
    let stmt = client.prepare_cached(SUBMIT_IDEMPOTENT).await?;
    let row = client
        .query_opt(
            &stmt,
            &[
                &req.user_id,
                &req.thread_id,
                &req.query,
                &key,
                &fingerprint,
                &ttl.as_secs_f64(),
            ],
        )
        .await?;
    Ok(row.map(|r| r.try_get(0)).transpose()?)
}

/// The first request of a key and its fingerprint.
pub async fn find_idempotent(
    client: &impl GenericClient,
    user_id: Uuid,
    key: &str,
) -> Result<Option<(Uuid, String)>, Error> {
    let stmt = client.prepare_cached(FIND_IDEMPOTENT).await?;
    let row = client.query_opt(&stmt, &[&user_id, &key]).await?;
    let Some(r) = row else { return Ok(None) };
    Ok(Some((r.try_get(0)?, r.try_get(1)?)))
}

/// Deletes up to `limit` expired idempotency keys; returns how many.
pub async fn expire_idempotency_keys(client: &impl GenericClient, ttl: Duration, limit: i64) -> Result<u64, Error> {
    let stmt = client.prepare_cached(EXPIRE_IDEMPOTENCY_KEYS).await?;
    Ok(client.execute(&stmt, &[&ttl.as_secs_f64(), &limit]).await?)
}

/// What the API shows of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunState {
    pub id: Uuid,
    pub user_id: Uuid,
    pub status: Status,
    pub answer: Option<String>,
    pub error: Option<String>,
}

/// A row's state; `None` for a status this program does not know (a row
/// written by something else), an error for a column of the wrong type.
fn run_state(r: &tokio_postgres::Row) -> Result<Option<RunState>, Error> {
    let status: String = r.try_get(2)?;
    let Ok(status) = status.parse() else { return Ok(None) };
    Ok(Some(RunState {
        id: r.try_get(0)?,
        user_id: r.try_get(1)?,
        status,
        answer: r.try_get(3)?,
        error: r.try_get(4)?,
    }))
}

fn run_states(rows: &[tokio_postgres::Row]) -> Result<Vec<RunState>, Error> {
    rows.iter().filter_map(|r| run_state(r).transpose()).collect()
}

/// The states of the given requests (absent ids are left out).
pub async fn request_states(client: &impl GenericClient, ids: &[Uuid]) -> Result<Vec<RunState>, Error> {
    let stmt = client.prepare_cached(REQUEST_STATES).await?;
    let rows = client.query(&stmt, &[&ids]).await?;
    run_states(&rows)
}

/// The requests of `user` that are not terminal, plus those changed since
/// `since` when given; newest first, at most `limit`.
pub async fn user_states(
    client: &impl GenericClient,
    user: Uuid,
    since: Option<DateTime<Utc>>,
    limit: i64,
) -> Result<Vec<RunState>, Error> {
    let stmt = client.prepare_cached(USER_STATES).await?;
    let rows = client.query(&stmt, &[&user, &since, &limit]).await?;
    run_states(&rows)
}

/// Requests by non-terminal status, plus `FAILED`.
pub async fn count_backlog(client: &impl GenericClient) -> Result<Vec<(String, i64)>, Error> {
    let stmt = client.prepare_cached(COUNT_BACKLOG).await?;
    let rows = client.query(&stmt, &[]).await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
}
