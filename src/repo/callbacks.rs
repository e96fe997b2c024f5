//! Callback deliveries (`callback_outbox`): claiming due deliveries under a
//! lease, recording each attempt (fenced on the attempt number), and
//! reading a request's deliveries.

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde::Serialize;
use tokio_postgres::Row;
use uuid::Uuid;

use super::{FromRow, as_limit, rows_as, secs};
use crate::db::Error;

const CLAIM: &str = include_str!("../../sql/queries/callbacks_claim.sql");
const DELIVERED: &str = include_str!("../../sql/queries/callbacks_delivered.sql");
const FAILED: &str = include_str!("../../sql/queries/callbacks_failed.sql");
const FOR_REQUEST: &str = include_str!("../../sql/queries/show_callbacks.sql");

/// This file's statements, for [`super::all`].
pub(super) const STATEMENTS: &[(&str, &str)] = &[
    ("callbacks_claim", CLAIM),
    ("callbacks_delivered", DELIVERED),
    ("callbacks_failed", FAILED),
    ("show_callbacks", FOR_REQUEST),
];

/// A callback delivery claimed for one attempt.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: i64,
    pub run_id: Uuid,
    pub url: String,
    pub event: String,
    /// The JSON body, exactly as it will be sent and signed.
    pub body: String,
    /// This attempt's number, 1-based.
    pub attempt: i32,
}

impl FromRow for Delivery {
    fn from_row(r: &Row) -> Result<Delivery, Error> {
        Ok(Delivery {
            id: r.try_get("id")?,
            run_id: r.try_get("run_id")?,
            url: r.try_get("url")?,
            event: r.try_get("event")?,
            body: r.try_get("body")?,
            attempt: r.try_get("attempts")?,
        })
    }
}

/// Claims up to `batch` due deliveries, each leased for `lease`.
pub async fn claim(client: &impl GenericClient, batch: usize, lease: Duration) -> Result<Vec<Delivery>, Error> {
    let stmt = client.prepare_cached(CLAIM).await?;
    rows_as(&client.query(&stmt, &[&as_limit(batch), &secs(lease)]).await?)
}

/// Records a delivery that the receiver accepted with HTTP `status`.
pub async fn delivered(client: &impl GenericClient, id: i64, status: i32) -> Result<(), Error> {
    let stmt = client.prepare_cached(DELIVERED).await?;
    client.execute(&stmt, &[&id, &status]).await?;
    Ok(())
}

super::statement_params! {
    /// The inputs of `callbacks_failed.sql`, `$1` to `$6` in field order.
    struct FailedParams<'a> {
        id: i64,
        attempt: i32,
        last_status: Option<i32>,
        last_error: &'a str,
        retry_secs: f64,
        dead: bool,
    }
}

/// Records a failed attempt; `retry_in` is ignored when `dead`.
pub async fn failed(
    client: &impl GenericClient,
    d: &Delivery,
    status: Option<i32>,
    error: &str,
    retry_in: Duration,
    dead: bool,
) -> Result<(), Error> {
    let stmt = client.prepare_cached(FAILED).await?;
    let params = FailedParams {
        id: d.id,
        attempt: d.attempt,
        last_status: status,
        last_error: error,
        retry_secs: if dead { 0.0 } else { secs(retry_in) },
        dead,
    };
    client.execute(&stmt, &params.params()).await?;
    Ok(())
}

/// One callback delivery of a request, as `maasctl requests show` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct CallbackView {
    pub id: i64,
    pub event: String,
    pub url: String,
    pub state: String,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub delivered_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

impl FromRow for CallbackView {
    fn from_row(r: &Row) -> Result<CallbackView, Error> {
        Ok(CallbackView {
            id: r.try_get("id")?,
            event: r.try_get("event")?,
            url: r.try_get("url")?,
            state: r.try_get("state")?,
            attempts: r.try_get("attempts")?,
            next_attempt_at: r.try_get("next_attempt_at")?,
            last_status: r.try_get("last_status")?,
            last_error: r.try_get("last_error")?,
            delivered_at: r.try_get("delivered_at")?,
            created_at: r.try_get("created_at")?,
        })
    }
}

/// The deliveries of one request, in order.
pub async fn for_request(client: &impl GenericClient, id: Uuid) -> Result<Vec<CallbackView>, Error> {
    let stmt = client.prepare_cached(FOR_REQUEST).await?;
    rows_as(&client.query(&stmt, &[&id]).await?)
}

#[cfg(test)]
mod tests {
    use super::super::params_check::check;
    use super::*;

    #[test]
    fn failed_params_are_in_the_order_the_sql_documents() {
        check(FAILED, FailedParams::NAMES);
    }
}
