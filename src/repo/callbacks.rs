//! Callback deliveries (`callback_outbox`): claiming due deliveries under a
//! lease, recording each attempt (fenced on the attempt number), and
//! reading a request's deliveries.

use std::time::Duration;

use super::GenericClient;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{as_limit, secs};
use crate::db::Error;
use crate::model::DeliveryState;

super::statements! {
    CLAIM = "callbacks_claim",
    DELIVERED = "callbacks_delivered",
    FAILED = "callbacks_failed",
    FOR_REQUEST = "show_callbacks",
}

super::row_struct! {
    /// A callback delivery claimed for one attempt.
    #[derive(Debug, Clone)]
    pub struct Delivery {
        pub id: i64,
        pub request_id = "run_id": Uuid,
        pub url: String,
        pub event: String,
        /// The JSON body, exactly as it will be sent and signed.
        pub body: String,
        /// This attempt's number, 1-based.
        pub attempt = "attempts": i32,
        /// The request's tenant's `callback_secret`, when it has one: it
        /// signs this delivery instead of `callbacks.secret`.
        pub tenant_secret: Option<crate::secret::Secret>,
    }
}

/// A secret read from a text column (kept out of `Debug` output).
impl<'a> tokio_postgres::types::FromSql<'a> for crate::secret::Secret {
    fn from_sql(
        ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        String::from_sql(ty, raw).map(crate::secret::Secret::new)
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        <String as tokio_postgres::types::FromSql>::accepts(ty)
    }
}

/// Claims up to `batch` due deliveries, each leased for `lease`.
pub async fn claim(client: &impl GenericClient, batch: usize, lease: Duration) -> Result<Vec<Delivery>, Error> {
    super::query_as(client, CLAIM, &[&as_limit(batch), &secs(lease)]).await
}

/// Records a delivery that the receiver accepted with HTTP `status`.
pub async fn delivered(client: &impl GenericClient, id: i64, status: i32) -> Result<(), Error> {
    super::execute(client, DELIVERED, &[&id, &status]).await?;
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
        state: DeliveryState,
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
    let params = FailedParams {
        id: d.id,
        attempt: d.attempt,
        last_status: status,
        last_error: error,
        retry_secs: if dead { 0.0 } else { secs(retry_in) },
        state: if dead {
            DeliveryState::Dead
        } else {
            DeliveryState::Pending
        },
    };
    super::execute(client, FAILED, &params.params()).await?;
    Ok(())
}

super::row_struct! {
    /// One callback delivery of a request, as `maasctl requests show` prints it.
    #[derive(Debug, Clone, Serialize)]
    pub struct CallbackView {
        pub id: i64,
        pub event: String,
        pub url: String,
        pub state: DeliveryState,
        pub attempts: i32,
        pub next_attempt_at: DateTime<Utc>,
        pub last_status: Option<i32>,
        pub last_error: Option<String>,
        pub delivered_at: Option<DateTime<Utc>>,
        pub created_at: DateTime<Utc>,
    }
}

/// The deliveries of one request, in order.
pub async fn for_request(client: &impl GenericClient, id: Uuid) -> Result<Vec<CallbackView>, Error> {
    super::query_as(client, FOR_REQUEST, &[&id]).await
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
