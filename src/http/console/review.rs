//! The console's review of an answer that awaits it: the request page's
//! "Answer under review" forms post here, and the verdict is
//! [`crate::app::review`]'s, as over HTTP and `maasctl requests review`,
//! recorded with the session's token name as the actor.

use axum::Extension;
use axum::extract::{Form, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::auth::{Session, check_action};
use super::pages::{client, id_of, request_user};
use super::{Fail, fail};
use crate::app::review::{Reviewer, Verdict};
use crate::app::{AppError, Kind};
use crate::http::AppState;

#[derive(Deserialize)]
pub struct ReviewForm {
    #[serde(default)]
    csrf: String,
    #[serde(default, deserialize_with = "crate::app::input::text_without_nul")]
    action: String,
    #[serde(default, deserialize_with = "crate::app::input::text_without_nul")]
    text: String,
    #[serde(default, deserialize_with = "crate::app::input::text_without_nul")]
    reason: String,
    #[serde(default, deserialize_with = "crate::app::input::text_without_nul")]
    then: String,
}

/// `POST /console/requests/{id}/review` with `csrf`, `action` (`approve`,
/// `edit`, `reject`) and `text`, `reason`, `then` as the action needs:
/// back to the request's page once applied; a refusal says why.
pub async fn review(
    State(app): State<AppState>,
    Extension(s): Extension<Session>,
    Path(id): Path<String>,
    Form(f): Form<ReviewForm>,
) -> Response {
    match apply(&app, &s, &id, &f).await {
        Ok(id) => Redirect::to(&format!("/console/requests/{id}")).into_response(),
        Err(r) => r.into_response(),
    }
}

async fn apply(app: &AppState, s: &Session, id: &str, f: &ReviewForm) -> Result<uuid::Uuid, Fail> {
    check_action(s, &f.csrf)?;
    let id = id_of(id, "request")?;
    let given = |v: &str| Some(v.to_owned()).filter(|v| !v.trim().is_empty());
    let (text, reason, then) = (given(&f.text), given(&f.reason), given(&f.then));
    let verdict =
        Verdict::from_fields(f.action.trim(), text.as_deref(), reason.as_deref(), then.as_deref()).map_err(refused)?;
    let c = client(app).await?;
    request_user(&c, s, id, id).await?;
    let who = if s.who.operator {
        Reviewer::Operator
    } else {
        Reviewer::Caller(&s.who)
    };
    let done = crate::app::review::review(&c, who, s.actor(), id, &verdict)
        .await
        .map_err(refused)?;
    tracing::info!(request_id = %id, action = done.action, status = %done.status, "console: review");
    Ok(id)
}

/// A refused review, as the console says it.
fn refused(e: AppError) -> Fail {
    let code = match e.kind {
        Kind::NotFound => StatusCode::NOT_FOUND,
        Kind::Conflict => StatusCode::CONFLICT,
        Kind::Forbidden => StatusCode::FORBIDDEN,
        Kind::Invalid => StatusCode::BAD_REQUEST,
        Kind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    fail(code, &format!("console: review: {}", e.message))
}
