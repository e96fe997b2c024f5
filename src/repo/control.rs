//! The cluster-wide pause flag (`maas_control`, one row). Setting it also
//! records the operator action, in the same statement.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde::Serialize;
use tokio_postgres::Row;

use super::FromRow;
use crate::db::Error;

const GET: &str = include_str!("../../sql/queries/control_get.sql");
const SET: &str = include_str!("../../sql/queries/control_set.sql");

/// This file's statements, for [`super::all`].
pub(super) const STATEMENTS: &[(&str, &str)] = &[("control_get", GET), ("control_set", SET)];

/// Whether claiming is paused cluster-wide, and the last change.
#[derive(Debug, Clone, Serialize)]
pub struct ControlState {
    pub paused: bool,
    pub reason: Option<String>,
    pub changed_by: Option<String>,
    pub changed_at: Option<DateTime<Utc>>,
}

impl FromRow for ControlState {
    fn from_row(r: &Row) -> Result<ControlState, Error> {
        Ok(ControlState {
            paused: r.try_get("paused")?,
            reason: r.try_get("reason")?,
            changed_by: r.try_get("changed_by")?,
            changed_at: Some(r.try_get("changed_at")?),
        })
    }
}

/// The flag; never set means not paused.
pub async fn get(client: &impl GenericClient) -> Result<ControlState, Error> {
    let stmt = client.prepare_cached(GET).await?;
    Ok(match client.query_opt(&stmt, &[]).await? {
        Some(r) => ControlState::from_row(&r)?,
        None => ControlState {
            paused: false,
            reason: None,
            changed_by: None,
            changed_at: None,
        },
    })
}

/// Sets the pause flag, recorded as `actor`'s action; returns whether it
/// was paused before.
pub async fn set(client: &impl GenericClient, paused: bool, reason: Option<&str>, actor: &str) -> Result<bool, Error> {
    let stmt = client.prepare_cached(SET).await?;
    Ok(client
        .query_one(&stmt, &[&paused, &reason, &actor])
        .await?
        .try_get("was_paused")?)
}
