//! Operator actions over HTTP: `POST /api/query/{id}/cancel` and
//! `POST /api/query/{id}/retry`, each with a JSON body `{"reason": "…"}`,
//! and `POST /api/query/{id}/continue` (no body); the review of an answer
//! that awaits it, `POST /api/query/{id}/review` ([`review`]).
//!
//! Each is an [`Action`] run by the one handler [`act`]: one call of
//! [`crate::control`], as for `maasctl requests cancel|retry|continue` and
//! the console, recorded in `operator_actions` with the actor `http` (and
//! the reason). A reason is required for cancel and retry (1 to 1000
//! characters). Answers: 200 with what changed; 404
//! for an unknown request (or another tenant's); 409 when the request is
//! not in a state the action applies to (cancel: already finished; retry:
//! not `FAILED`; continue: not resting between stages), naming its status.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};
use uuid::Uuid;

use super::AppState;
use super::input::parse_id;
use crate::app::review::{Reviewer, Verdict};
use crate::app::{AppError, Code, Principal};
use crate::control::{self, CancelOutcome, ContinueOutcome, RetryOutcome};

const ACTOR: &str = "http";
const MAX_REASON_CHARS: usize = 1000;

/// The `reason` of a body `{"reason": "…"}`.
fn reason(body: &[u8]) -> Result<String, AppError> {
    let missing = || AppError::unprocessable(Code::MissingField, "reason is required: {\"reason\": \"…\"}");
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(missing());
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| AppError::bad_request(Code::MalformedJson, format!("the body is not valid JSON: {e}")))?;
    match v.get("reason") {
        None | Some(Value::Null) => Err(missing()),
        Some(Value::String(s)) if s.trim().is_empty() => {
            Err(AppError::unprocessable(Code::EmptyField, "reason must not be empty"))
        }
        Some(Value::String(s)) if s.chars().count() > MAX_REASON_CHARS => Err(AppError::unprocessable(
            Code::FieldTooLong,
            format!("reason is longer than {MAX_REASON_CHARS} characters"),
        )),
        Some(Value::String(s)) => {
            super::input::check_field("reason", s)?;
            Ok(s.trim().to_owned())
        }
        Some(_) => Err(AppError::unprocessable(Code::InvalidField, "reason must be a string")),
    }
}

fn db_error(e: impl std::fmt::Display) -> AppError {
    AppError::unavailable(Code::Database, format!("database error: {e}"))
}

fn not_found(id: Uuid) -> AppError {
    AppError::not_found(format!("no request {id}"))
}

/// What an action's outcome answers: the 200 body, or a 409 (code,
/// message); `None` when there is no such request (404).
type Answer = Option<Result<Value, (Code, String)>>;

/// One operator action on a request over HTTP: its [`crate::control`]
/// call, and the answer its outcome makes.
pub trait Action {
    /// Whether the body must give a reason.
    const REASON: bool;
    type Outcome;
    /// The control call on request `id`, as the actor `http`.
    fn run(
        client: &deadpool_postgres::Object,
        id: Uuid,
        reason: Option<&str>,
    ) -> impl Future<Output = Result<Self::Outcome, control::Error>> + Send;
    fn answer(outcome: Self::Outcome, id: Uuid) -> Answer;
}

/// `POST /api/query/{id}/{cancel|retry|continue}`: action `A` on the
/// caller's request (404 for another tenant's).
pub async fn act<A: Action>(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, AppError> {
    let id = parse_id(&id, "request")?;
    let reason = if A::REASON { Some(reason(&body)?) } else { None };
    let client = app.pool.get().await.map_err(db_error)?;
    let of_caller = match crate::app::caller::bound_user(&client, &who).await? {
        None => crate::repo::requests::is_of_tenant(&client, id, who.tenant).await,
        Some(user) => crate::repo::requests::request_state_of_tenant(&client, id, who.tenant)
            .await
            .map(|rows| rows.iter().any(|r| r.user_id == user)),
    };
    if !of_caller.map_err(db_error)? {
        return Err(not_found(id));
    }
    let outcome = A::run(&client, id, reason.as_deref()).await.map_err(db_error)?;
    match A::answer(outcome, id) {
        Some(Ok(body)) => Ok(Json(body).into_response()),
        Some(Err((code, message))) => Err(AppError::conflict(code, message)),
        None => Err(not_found(id)),
    }
}

/// `POST /api/query/{id}/cancel`: 409 when the request already finished.
pub struct Cancel;

impl Action for Cancel {
    const REASON: bool = true;
    type Outcome = CancelOutcome;

    async fn run(
        c: &deadpool_postgres::Object,
        id: Uuid,
        reason: Option<&str>,
    ) -> Result<CancelOutcome, control::Error> {
        control::cancel(c, id, ACTOR, reason).await
    }

    fn answer(outcome: CancelOutcome, id: Uuid) -> Answer {
        let was = match outcome {
            CancelOutcome::Cancelled { was } => was,
            CancelOutcome::AlreadyFinished { status } => {
                return Some(Err((
                    Code::AlreadyFinished,
                    format!("request {id} is already {status}"),
                )));
            }
            CancelOutcome::NotFound => return None,
        };
        Some(Ok(
            json!({"request_id": id, "status": "CANCELLED", "was": was.as_str()}),
        ))
    }
}

/// `POST /api/query/{id}/retry`: 409 unless the request is `FAILED`.
pub struct Retry;

impl Action for Retry {
    const REASON: bool = true;
    type Outcome = RetryOutcome;

    async fn run(
        c: &deadpool_postgres::Object,
        id: Uuid,
        reason: Option<&str>,
    ) -> Result<RetryOutcome, control::Error> {
        control::retry(c, id, ACTOR, reason).await
    }

    fn answer(outcome: RetryOutcome, id: Uuid) -> Answer {
        Some(match outcome {
            RetryOutcome::Retried { status, stage } => {
                Ok(json!({"request_id": id, "status": status.as_str(), "stage": stage.as_str()}))
            }
            RetryOutcome::NotFailed { status } => Err((
                Code::NotFailed,
                format!("request {id} is {status}; only FAILED requests are retried"),
            )),
            RetryOutcome::NotFound => return None,
        })
    }
}

/// `POST /api/query/{id}/continue` (no body): releases the next stage of
/// a debug request resting in `ANALYZED` or `READY` (step-by-step mode),
/// answering `{request_id, status, next_stage}`; 409 when it is not resting.
pub struct Continue;

impl Action for Continue {
    const REASON: bool = false;
    type Outcome = ContinueOutcome;

    async fn run(
        c: &deadpool_postgres::Object,
        id: Uuid,
        reason: Option<&str>,
    ) -> Result<ContinueOutcome, control::Error> {
        control::continue_request(c, id, ACTOR, reason).await
    }

    fn answer(outcome: ContinueOutcome, id: Uuid) -> Answer {
        let (status, debug) = match outcome {
            ContinueOutcome::Released { status, next } => {
                return Some(Ok(
                    json!({"request_id": id, "status": status.as_str(), "next_stage": next.as_str()}),
                ));
            }
            ContinueOutcome::NotHeld { status, debug } => (status, debug),
            ContinueOutcome::NotFound => return None,
        };
        let why = if debug {
            format!("request {id} is {status}, not resting between stages")
        } else {
            format!("request {id} is not a debug request (status {status})")
        };
        Some(Err((Code::NotHeld, why)))
    }
}

/// `POST /api/query/{id}/review` with `{"action": "approve" | "edit" |
/// "reject", "text"?, "reason"?, "then"?}` (scope operate): an operator's
/// verdict on an answer that awaits review, by [`crate::app::review`] as
/// `maasctl requests review` and the console give it. 200 with
/// `{request_id, action, status}`; 404 for an unknown request (or another
/// tenant's); 409 `not_awaiting_review` naming its status; 422 naming a
/// missing or wrong field.
pub async fn review(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, AppError> {
    let id = parse_id(&id, "request")?;
    let verdict = verdict(&body)?;
    let client = app.pool.get().await.map_err(db_error)?;
    let done = crate::app::review::review(&client, Reviewer::Caller(&who), ACTOR, id, &verdict).await?;
    Ok(
        Json(json!({"request_id": done.request_id, "action": done.action, "status": done.status.as_str()}))
            .into_response(),
    )
}

/// The verdict of a review body: `action` required, `text`, `reason` and
/// `then` strings when given.
fn verdict(body: &[u8]) -> Result<Verdict, AppError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| AppError::bad_request(Code::MalformedJson, format!("the body is not valid JSON: {e}")))?;
    let Value::Object(fields) = v else {
        return Err(AppError::bad_request(
            Code::MalformedJson,
            "the body must be a JSON object",
        ));
    };
    let text = |name: &str| -> Result<Option<&str>, AppError> {
        match fields.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(AppError::unprocessable(
                Code::InvalidField,
                format!("{name} must be a string"),
            )),
        }
    };
    let action = text("action")?.ok_or_else(|| {
        AppError::unprocessable(
            Code::MissingField,
            "action is required: {\"action\": \"approve\" | \"edit\" | \"reject\"}",
        )
    })?;
    Verdict::from_fields(action, text("text")?, text("reason")?, text("then")?)
}
