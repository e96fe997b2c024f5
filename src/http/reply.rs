//! `POST /api/query/{id}/reply {"text": "…"}`: the user's reply to the
//! question its request waits on (scope submit), through
//! [`crate::app::reply::reply`], as every door replies. Answers 200 with
//! the request's new state (`processing`, stage `NEW`); 404 for a request
//! that is not the caller's; 409 `not_waiting` naming the status when it
//! does not wait for a reply; 422 for a missing, empty or too long text.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde_json::{Value, json};

use super::AppState;
use super::input::parse_id;
use crate::app::{AppError, Code, Principal};

/// The `text` of a body `{"text": "…"}`.
fn text(body: &[u8]) -> Result<String, AppError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| AppError::bad_request(Code::MalformedJson, format!("the body is not valid JSON: {e}")))?;
    match v.get("text") {
        None | Some(Value::Null) => Err(AppError::unprocessable(
            Code::MissingField,
            "text is required: {\"text\": \"…\"}",
        )),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(AppError::unprocessable(Code::InvalidField, "text must be a string")),
    }
}

/// `POST /api/query/{id}/reply`.
pub async fn reply(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, AppError> {
    let id = parse_id(&id, "request")?;
    let text = text(&body)?;
    let client = app.pool.get().await?;
    crate::app::reply::reply(&client, &who, id, &text).await?;
    Ok(Json(json!({"request_id": id, "status": "processing", "stage": "NEW"})))
}
