//! Replying to a question: the one path of every door (`POST
//! /api/query/{id}/reply`, `maasctl requests reply`, the MCP tool `reply`,
//! the console; the SQL door's trigger calls the same SQL function,
//! `maas_reply`). The request must be the caller's tenant's (and, for a
//! token bound to a user, that user's) and wait for its user's reply
//! (`WAITING_USER_INPUT`); the reply is then logged once as the user's
//! turn and the request goes back to the analyzer, in one statement
//! guarded by the status, so of two replies at once one applies and the
//! other is refused naming the status the first left.

use uuid::Uuid;

use super::caller::{Need, Principal, bound_user};
use super::error::{AppError, Code};
use super::input::query_text;
use crate::model::Status;
use crate::repo::{self, GenericClient};

/// Applies `text` as the reply of `who`'s user to request `id`: `Ok` when
/// it was applied (the request is `NEW` again, due now). Refused with
/// `scope_required` (a token without scope submit), `not_found` (no such
/// request for this caller: another tenant's or, for a bound token,
/// another user's), `not_waiting` (naming the status it is in), or the
/// text's own refusals (`empty_field`, `field_too_long`, `invalid_text`).
pub async fn reply(client: &impl GenericClient, who: &Principal, id: Uuid, text: &str) -> Result<(), AppError> {
    who.require(Need::Submit)?;
    query_text("text", text)?;
    let not_found = || AppError::not_found(format!("no request {id}"));
    let state = repo::requests::request_state_of_tenant(client, id, who.tenant).await?;
    let Some(state) = state.first() else {
        return Err(not_found());
    };
    if let Some(user) = bound_user(client, who).await?
        && user != state.user_id
    {
        return Err(not_found());
    }
    match repo::waits::reply(client, id, who.tenant, text).await? {
        Some(Status::WaitingUserInput) => Ok(()),
        Some(status) => Err(not_waiting(id, status)),
        None => Err(not_found()),
    }
}

/// The refusal of a reply to a request that does not wait for one.
fn not_waiting(id: Uuid, status: Status) -> AppError {
    AppError::conflict(
        Code::NotWaiting,
        format!("request {id} is {status}, not WAITING_USER_INPUT: it takes a reply only while it waits for one"),
    )
}
