//! Operator actions over HTTP: `POST /api/query/{id}/cancel` and
//! `POST /api/query/{id}/retry`, each with a JSON body `{"reason": "…"}`,
//! and `POST /api/query/{id}/continue` (no body).
//!
//! Each is one call of [`crate::control`], as for `maasctl requests
//! cancel|retry|continue` and the console, recorded in `operator_actions`
//! with the actor `http` (and the reason). A reason is required for cancel
//! and retry (1 to 1000 characters). Answers: 200 with what changed; 404
//! for an unknown request (or another tenant's); 409 when the request is
//! not in a state the action applies to (cancel: already finished; retry:
//! not `FAILED`; continue: not resting between stages), naming its status.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use super::input::parse_id;
use super::tenancy::Principal;
use crate::control::{self, CancelOutcome, ContinueOutcome, RetryOutcome};

const ACTOR: &str = "http";
const MAX_REASON_CHARS: usize = 1000;

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

fn not_found(id: Uuid) -> ApiError {
    ApiError::not_found(format!("no request {id}"))
}

fn conflict(code: &'static str, message: String) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, code, message)
}

/// Runs `action` on request `id` if it is the caller's (else 404), and
/// answers with the JSON body `answer` makes of its outcome, or its refusal.
async fn act<T>(
    app: &AppState,
    who: &Principal,
    id: Uuid,
    action: impl AsyncFnOnce(&deadpool_postgres::Object, Uuid) -> Result<T, control::Error>,
    answer: impl FnOnce(T) -> Result<Value, ApiError>,
) -> Result<Response, ApiError> {
    let client = app.pool.get().await.map_err(db_error)?;
    if !crate::repo::requests::is_of_tenant(&client, id, who.tenant)
        .await
        .map_err(db_error)?
    {
        return Err(not_found(id));
    }
    let outcome = action(&client, id).await.map_err(db_error)?;
    Ok(Json(answer(outcome)?).into_response())
}

/// `POST /api/query/{id}/cancel`.
pub async fn cancel(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = parse_id(&id, "request")?;
    let reason = reason(&body)?;
    let action = async |c: &deadpool_postgres::Object, id| control::cancel(c, id, ACTOR, Some(&reason)).await;
    act(&app, &who, id, action, |outcome| match outcome {
        CancelOutcome::Cancelled { was } => Ok(json!({
            "request_id": id,
            "status": "CANCELLED",
            "was": was.as_str(),
        })),
        CancelOutcome::AlreadyFinished { status } => Err(conflict(
            "already_finished",
            format!("request {id} is already {}", status.as_str()),
        )),
        CancelOutcome::NotFound => Err(not_found(id)),
    })
    .await
}

/// `POST /api/query/{id}/retry`.
pub async fn retry(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = parse_id(&id, "request")?;
    let reason = reason(&body)?;
    let action = async |c: &deadpool_postgres::Object, id| control::retry(c, id, ACTOR, Some(&reason)).await;
    act(&app, &who, id, action, |outcome| match outcome {
        RetryOutcome::Retried { status, stage } => Ok(json!({
            "request_id": id,
            "status": status.as_str(),
            "stage": stage.as_str(),
        })),
        RetryOutcome::NotFailed { status } => Err(conflict(
            "not_failed",
            format!("request {id} is {}; only FAILED requests are retried", status.as_str()),
        )),
        RetryOutcome::NotFound => Err(not_found(id)),
    })
    .await
}

/// `POST /api/query/{id}/continue`: releases the next stage of a debug
/// request resting in `ANALYZED` or `READY` (step-by-step mode). 200 with
/// `{request_id, status, next_stage}` when released; 409 when the request
/// is not resting; 404 for an unknown id.
pub async fn continue_request(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id, "request")?;
    let action = async |c: &deadpool_postgres::Object, id| control::continue_request(c, id, ACTOR, None).await;
    act(&app, &who, id, action, |outcome| match outcome {
        ContinueOutcome::Released { status, next } => Ok(json!({
            "request_id": id,
            "status": status.as_str(),
            "next_stage": next.as_str(),
        })),
        ContinueOutcome::NotHeld { status, debug } => Err(conflict(
            "not_held",
            if debug {
                format!("request {id} is {status}, not resting between stages")
            } else {
                format!("request {id} is not a debug run (status {status})")
            },
        )),
        ContinueOutcome::NotFound => Err(not_found(id)),
    })
    .await
}
