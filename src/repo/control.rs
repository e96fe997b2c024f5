//! The cluster-wide pause flag (`maas_control`, one row). Setting it also
//! records the operator action, in the same statement.

use super::GenericClient;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::db::Error;

super::statements! {
    GET = "control_get",
    SET = "control_set",
}

super::row_struct! {
    /// Whether claiming is paused cluster-wide, and the last change.
    #[derive(Debug, Clone, Serialize)]
    pub struct ControlState {
        pub paused: bool,
        pub reason: Option<String>,
        pub changed_by: Option<String>,
        pub changed_at: Option<DateTime<Utc>>,
    }
}

/// The flag; never set means not paused.
pub async fn get(client: &impl GenericClient) -> Result<ControlState, Error> {
    Ok(match super::query_opt_as(client, GET, &[]).await? {
        Some(state) => state,
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
    super::query_one_value(client, SET, &[&paused, &reason, &actor], "was_paused").await
}
