//! The audit trail (`operator_actions`): who did what to which request, and
//! why. Actions on one request are written by the statement that performs
//! them ([`super::requests`], [`super::control`]); this file records the
//! others and reads the trail.

use super::GenericClient;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::db::Error;
use crate::model::OperatorAction;

super::statements! {
    RECORD = "record_action",
    USER_GUARD = "actions_user_guard",
    RECORD_ABOUT_USER = "record_user_action",
    FOR_REQUEST = "show_actions",
    ABOUT_USER = "actions_about_user",
    PROMPT_CHANGES = "actions_prompt_changes",
}

/// Records an operator action that concerns no single request.
pub async fn record(
    client: &impl GenericClient,
    action: OperatorAction,
    actor: &str,
    reason: Option<&str>,
    detail: &Value,
) -> Result<(), Error> {
    super::execute(client, RECORD, &[&action, &actor, &reason, detail]).await?;
    Ok(())
}

/// Records an operator action about `user`'s memory (`detail` names the
/// user), unless the user was forgotten; false when it was. Two
/// statements: `client` must be a transaction, so that a forget that
/// begins meanwhile waits for it and erases the row.
pub async fn record_about_user(
    client: &impl GenericClient,
    action: OperatorAction,
    actor: &str,
    reason: Option<&str>,
    detail: &Value,
    user: Uuid,
) -> Result<bool, Error> {
    super::execute(client, USER_GUARD, &[&user]).await?;
    super::query_found(client, RECORD_ABOUT_USER, &[&action, &actor, &reason, detail, &user]).await
}

super::row_struct! {
    /// One operator action on a request.
    #[derive(Debug, Clone, Serialize)]
    pub struct Action {
        pub action: OperatorAction,
        pub actor: String,
        pub reason: Option<String>,
        pub from_status: Option<String>,
        pub to_status: Option<String>,
        pub detail: Option<Value>,
        pub at: DateTime<Utc>,
    }
}

/// The actions on one request, in order.
pub async fn for_request(client: &impl GenericClient, id: Uuid) -> Result<Vec<Action>, Error> {
    super::query_as(client, FOR_REQUEST, &[&id]).await
}

// ---- actions on no request, for the operator console: a user's memory,
// the prompts ----------------------------------------------------------------
// (The same row as a request's [`Action`], its statuses empty.)

/// The newest `limit` actions about `user`'s memory, newest first.
pub async fn about_user(client: &impl GenericClient, user: Uuid, limit: usize) -> Result<Vec<Action>, Error> {
    super::query_as(client, ABOUT_USER, &[&user, &super::as_limit(limit)]).await
}

/// The newest `limit` prompt changes (`prompt_set`, `prompt_activate`).
pub async fn prompt_changes(client: &impl GenericClient, limit: usize) -> Result<Vec<Action>, Error> {
    super::query_as(client, PROMPT_CHANGES, &[&super::as_limit(limit)]).await
}
