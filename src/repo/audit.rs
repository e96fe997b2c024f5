//! The audit trail (`operator_actions`): who did what to which request, and
//! why. Actions on one request are written by the statement that performs
//! them ([`super::requests`], [`super::control`]); this file records the
//! others and reads the trail.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::Row;
use uuid::Uuid;

use super::{FromRow, rows_as};
use crate::db::Error;

const RECORD: &str = include_str!("../../sql/queries/record_action.sql");
const FOR_REQUEST: &str = include_str!("../../sql/queries/show_actions.sql");

/// This file's statements, for [`super::all`].
pub(super) const STATEMENTS: &[(&str, &str)] = &[("record_action", RECORD), ("show_actions", FOR_REQUEST)];

/// Records an operator action that concerns no single request.
pub async fn record(
    client: &impl GenericClient,
    action: &str,
    actor: &str,
    reason: Option<&str>,
    detail: &Value,
) -> Result<(), Error> {
    let stmt = client.prepare_cached(RECORD).await?;
    client.execute(&stmt, &[&action, &actor, &reason, detail]).await?;
    Ok(())
}

/// One operator action on a request.
#[derive(Debug, Clone, Serialize)]
pub struct Action {
    pub action: String,
    pub actor: String,
    pub reason: Option<String>,
    pub from_status: Option<String>,
    pub to_status: Option<String>,
    pub detail: Option<Value>,
    pub at: DateTime<Utc>,
}

impl FromRow for Action {
    fn from_row(r: &Row) -> Result<Action, Error> {
        Ok(Action {
            action: r.try_get("action")?,
            actor: r.try_get("actor")?,
            reason: r.try_get("reason")?,
            from_status: r.try_get("from_status")?,
            to_status: r.try_get("to_status")?,
            detail: r.try_get("detail")?,
            at: r.try_get("at")?,
        })
    }
}

/// The actions on one request, in order.
pub async fn for_request(client: &impl GenericClient, id: Uuid) -> Result<Vec<Action>, Error> {
    let stmt = client.prepare_cached(FOR_REQUEST).await?;
    rows_as(&client.query(&stmt, &[&id]).await?)
}
