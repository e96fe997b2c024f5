//! Operator actions over HTTP: `POST /api/query/{id}/cancel` and
//! `POST /api/query/{id}/retry`, each with a JSON body `{"reason": "…"}`.
//!
//! The same statements as `maasctl requests cancel|retry`
//! ([`crate::control`]), recorded in `operator_actions` with the actor
//! `http` and the reason. A reason is required (1 to 1000 characters).
//! Answers: 200 with what changed; 404 for an unknown request (or another
//! tenant's); 409 when the
//! request is not in a state the action applies to (cancel: already
//! finished; retry: not `FAILED`), naming its status.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use super::tenancy::Principal;
use crate::control::{self, CancelOutcome, RetryOutcome};

const ACTOR: &str = "http";
const MAX_REASON_CHARS: usize = 1000;

fn parse_id(raw: &str) -> Result<Uuid, ApiError> {
    raw.parse::<Uuid>()
        .map_err(|_| ApiError::bad_request("invalid_id", format!("{raw:?} is not a request id (a UUID)")))
}

/// The `reason` of a body `{"reason": "…"}`.
fn reason(body: &[u8]) -> Result<String, ApiError> {
    let missing = || ApiError::unprocessable("missing_field", "reason is required: {\"reason\": \"…\"}");
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(missing());
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("malformed_json", format!("the body is not valid JSON: {e}")))?;
    match v.get("reason") {
        None | Some(Value::Null) => Err(missing()),
        Some(Value::String(s)) if s.trim().is_empty() => {
            Err(ApiError::unprocessable("empty_field", "reason must not be empty"))
        }
        Some(Value::String(s)) if s.chars().count() > MAX_REASON_CHARS => Err(ApiError::unprocessable(
            "field_too_long",
            format!("reason is longer than {MAX_REASON_CHARS} characters"),
        )),
        Some(Value::String(s)) => Ok(s.trim().to_owned()),
        Some(_) => Err(ApiError::unprocessable("invalid_field", "reason must be a string")),
    }
}

fn db_error(e: impl std::fmt::Display) -> ApiError {
    ApiError::unavailable("database", format!("database error: {e}"))
}

/// `POST /api/query/{id}/cancel`.
pub async fn cancel(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let reason = reason(&body)?;
    let client = app.pool.get().await.map_err(db_error)?;
    if !crate::repo::requests::is_of_tenant(&client, id, who.tenant)
        .await
        .map_err(db_error)?
    {
        return Err(ApiError::not_found(format!("no request {id}")));
    }
    match control::cancel(&client, id, ACTOR, Some(&reason))
        .await
        .map_err(db_error)?
    {
        CancelOutcome::Cancelled { was } => Ok(Json(json!({
            "request_id": id,
            "status": "CANCELLED",
            "was": was.as_str(),
        }))
        .into_response()),
        CancelOutcome::AlreadyFinished { status } => Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_finished",
            format!("request {id} is already {}", status.as_str()),
        )),
        CancelOutcome::NotFound => Err(ApiError::not_found(format!("no request {id}"))),
    }
}

/// `POST /api/query/{id}/retry`.
pub async fn retry(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let reason = reason(&body)?;
    let client = app.pool.get().await.map_err(db_error)?;
    if !crate::repo::requests::is_of_tenant(&client, id, who.tenant)
        .await
        .map_err(db_error)?
    {
        return Err(ApiError::not_found(format!("no request {id}")));
    }
    match control::retry(&client, id, ACTOR, Some(&reason))
        .await
        .map_err(db_error)?
    {
        RetryOutcome::Retried { status, stage } => Ok(Json(json!({
            "request_id": id,
            "status": status.as_str(),
            "stage": stage,
        }))
        .into_response()),
        RetryOutcome::NotFailed { status } => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_failed",
            format!("request {id} is {}; only FAILED requests are retried", status.as_str()),
        )),
        RetryOutcome::NotFound => Err(ApiError::not_found(format!("no request {id}"))),
    }
}
