//! The `/api/users` routes: a user's memory (see, search, correct) and
//! forgetting a user, over [`crate::users`]. Behind the API's bearer
//! authentication like every `/api` route. The user id in the path is the
//! caller's tenant's: it is mapped to the stored user id in SQL, and
//! answers show the tenant's id.
//!
//! A token bound to a user (`maasctl tokens create … --user U`) reaches
//! only that user: any other id in the path is 403 `user_not_allowed`.
//!
//! Answers: 404 `unknown_user` when nothing is held about the user (the
//! body keeps `memory_version: 0` for clients that only read the version),
//! 404 `user_forgotten` after an erase, 409 `erase_running` while one
//! runs, 404 `not_found` for a record or turn the user does not have.
//!
//! Caps, so that one client cannot take the API pool: a search's `q` is at
//! most [`MAX_SEARCH_CHARS`](memory::MAX_SEARCH_CHARS) characters (400 `invalid_query` naming `q`);
//! searches and exports running at once are capped per token
//! (`http.max_searches_per_token`, `http.max_exports_per_token`; 429
//! `too_many_searches` / `too_many_exports` with `Retry-After`). An export
//! holds its place until its document is written or its client goes away.

use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};
use uuid::Uuid;

use super::AppState;
use crate::app::caps::Pass;
use crate::app::input::check_field;
use crate::app::memory;
use crate::app::{AppError, Caller, Code, Kind, Principal};
use crate::users::{self, Correction, Page, UserError, UserKey, Why};

/// Most records (and pending turns) per page, and the default.
pub const MAX_LIMIT: usize = 500;
const DEFAULT_LIMIT: usize = 50;

/// A 404 for a user with nothing held still carries the user and version 0.
fn user_error(user: Uuid, e: UserError) -> Response {
    refusal(user, AppError::from(e))
}

/// [`user_error`] of an error already mapped.
fn refusal(user: Uuid, e: AppError) -> Response {
    if e.kind == Kind::NotFound && e.code != Code::NotFound {
        let body = json!({ "error": e.message, "code": e.code, "user_id": user, "memory_version": 0 });
        return (StatusCode::NOT_FOUND, Json(body)).into_response();
    }
    e.into_response()
}

/// The caller's user `raw`, mapped to the stored user id in SQL
/// ([`tenancy::stored_user`]): a tenant reaches only its own users.
async fn user_key(app: &AppState, who: &Principal, raw: &str) -> Result<UserKey, AppError> {
    let shown = raw
        .parse::<Uuid>()
        .map_err(|_| AppError::bad_request(Code::InvalidId, format!("{raw:?} is not a user id (a UUID)")))?;
    memory::user(app, who, shown, "the user id in the path").await
}

fn parse_row_id(raw: &str, what: &str) -> Result<i64, AppError> {
    raw.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
        AppError::bad_request(
            Code::InvalidId,
            format!("{raw:?} is not a {what} id (a positive integer)"),
        )
    })
}

/// The query's parameters; one holding a NUL is a 400 naming it.
fn params(query: Result<Query<HashMap<String, String>>, QueryRejection>) -> Result<HashMap<String, String>, AppError> {
    let params = query
        .map(|Query(p)| p)
        .map_err(|e| AppError::bad_request(Code::InvalidQuery, e.body_text()))?;
    for (k, v) in &params {
        check_field(k, v)?;
    }
    Ok(params)
}

fn int_param(params: &HashMap<String, String>, name: &str) -> Result<Option<i64>, AppError> {
    params
        .get(name)
        .map(|v| {
            v.parse::<i64>()
                .map_err(|_| AppError::bad_request(Code::InvalidQuery, format!("{name}={v:?}: expected an integer")))
        })
        .transpose()
}

/// The actor recorded for an API action: `http`, or `http:NAME` with `actor=NAME`.
fn actor(params: &HashMap<String, String>) -> String {
    match params.get("actor").map(|a| a.trim()).filter(|a| !a.is_empty()) {
        Some(a) => format!("http:{}", a.chars().take(100).collect::<String>()),
        None => "http".to_owned(),
    }
}

/// Who acts (`actor`, from [`actor`]) and why (`reason=`).
fn why<'a>(actor: &'a str, params: &'a HashMap<String, String>) -> Why<'a> {
    Why {
        actor,
        reason: params.get("reason").map(String::as_str),
    }
}

/// A route on one user: the state, the caller, the user id in the path and
/// the query.
type UserParts = (
    State<AppState>,
    Extension<Principal>,
    Path<String>,
    Result<Query<HashMap<String, String>>, QueryRejection>,
);

/// The state, the user (mapped for the caller's tenant) and the query's
/// parameters of a route on one user.
async fn user_call(
    (State(app), Extension(who), Path(id), query): UserParts,
) -> Result<(AppState, UserKey, HashMap<String, String>), AppError> {
    let user = user_key(&app, &who, &id).await?;
    Ok((app, user, params(query)?))
}

/// `GET /api/users/{id}/memory[?before=&turns_before=&limit=]`: a page of the
/// user's records (newest first) and pending turns; with `?q=TEXT` instead
/// the hits of the pipeline's retrieval for TEXT, with scores.
pub async fn memory(caller: Option<Extension<Caller>>, parts: UserParts) -> Result<Response, AppError> {
    let (app, user, params) = user_call(parts).await?;
    if let Some(q) = params.get("q") {
        let place = searching(&app, caller)?;
        let s = users::Search {
            query: q,
            ..Default::default()
        };
        return Ok(match memory::search(&app, user, s, place).await {
            Ok(v) => Json(v).into_response(),
            Err(e) => refusal(user.shown, e),
        });
    }
    let limit = match int_param(&params, "limit")? {
        None => DEFAULT_LIMIT,
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                AppError::bad_request(Code::InvalidQuery, format!("limit={n}: expected 1 to {MAX_LIMIT}"))
            })?,
    };
    let page = Page {
        before: int_param(&params, "before")?,
        turns_before: int_param(&params, "turns_before")?,
        limit,
    };
    let client = app.pool.get().await?;
    Ok(match users::view(&client, user, &page).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => user_error(user.shown, e),
    })
}

/// `GET /api/users/{id}/memory/search?q=TEXT[&when=PHRASE][&limit=N]`: the
/// hits of the pipeline's retrieval for TEXT, dated, with their sources and
/// scores; items inside the period `when` names (`last week`, `in May
/// 2023`) first; at most `limit` (1 to [`MAX_LIMIT`]). The MCP tool
/// `recall` runs the same [`memory::search`].
pub async fn memory_search(caller: Option<Extension<Caller>>, parts: UserParts) -> Result<Response, AppError> {
    let (app, user, params) = user_call(parts).await?;
    let q = params
        .get("q")
        .ok_or_else(|| AppError::bad_request(Code::InvalidQuery, "q is required"))?;
    let limit = match int_param(&params, "limit")? {
        None => None,
        Some(n) => Some(
            usize::try_from(n)
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    AppError::bad_request(Code::InvalidQuery, format!("limit={n}: expected 1 to {MAX_LIMIT}"))
                })?,
        ),
    };
    let place = searching(&app, caller)?;
    let s = users::Search {
        query: q,
        when: params.get("when").map(String::as_str),
        limit,
    };
    Ok(match memory::search(&app, user, s, place).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => refusal(user.shown, e),
    })
}

/// A place among the caller's running searches (`http.max_searches_per_token`).
pub fn searching(app: &AppState, caller: Option<Extension<Caller>>) -> Result<Pass, AppError> {
    app.searches.enter(caller.map_or(Caller::ANONYMOUS, |Extension(c)| c))
}

/// The user and the row of a `DELETE` of a record or turn, and its query.
type DeleteParts = (
    State<AppState>,
    Extension<Principal>,
    Path<(String, String)>,
    Result<Query<HashMap<String, String>>, QueryRejection>,
);

/// `DELETE /api/users/{id}/memory/{record}[?reason=&actor=]`.
pub async fn delete_record(parts: DeleteParts) -> Result<Response, AppError> {
    delete(parts, "record", Correction::DeleteRecord).await
}

/// `DELETE /api/users/{id}/turns/{turn}[?reason=&actor=]`.
pub async fn delete_turn(parts: DeleteParts) -> Result<Response, AppError> {
    delete(parts, "turn", Correction::DeleteTurn).await
}

/// Deletes the user's `what` (a record or a turn) named in the path.
async fn delete(
    (State(app), Extension(who), Path((id, row)), query): DeleteParts,
    what: &str,
    correction: fn(i64) -> Correction<'static>,
) -> Result<Response, AppError> {
    let user = user_key(&app, &who, &id).await?;
    let row = parse_row_id(&row, what)?;
    let params = params(query)?;
    apply(&app, user, correction(row), &params).await
}

/// `PUT /api/users/{id}/memory/{record}` with `{"summary": …, "reason"?: …,
/// "actor"?: …}`: replaces the record's summary.
pub async fn replace_summary(
    State(app): State<AppState>,
    Extension(who): Extension<Principal>,
    Path((id, record)): Path<(String, String)>,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AppError> {
    let user = user_key(&app, &who, &id).await?;
    let record = parse_row_id(&record, "record")?;
    let Json(body) = body.map_err(|e| AppError::bad_request(Code::MalformedJson, e.body_text()))?;
    let summary = match body.get("summary") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.as_str(),
        Some(Value::String(_)) => return Err(AppError::unprocessable(Code::EmptyField, "summary must not be empty")),
        Some(_) => return Err(AppError::unprocessable(Code::InvalidField, "summary must be a string")),
        None => return Err(AppError::unprocessable(Code::MissingField, "summary is required")),
    };
    check_field("summary", summary)?;
    let mut params = HashMap::new();
    for k in ["reason", "actor"] {
        if let Some(Value::String(v)) = body.get(k) {
            check_field(k, v)?;
            params.insert(k.to_owned(), v.clone());
        }
    }
    apply(&app, user, Correction::ReplaceSummary { record, summary }, &params).await
}

async fn apply(
    app: &AppState,
    user: UserKey,
    c: Correction<'_>,
    params: &HashMap<String, String>,
) -> Result<Response, AppError> {
    let who = actor(params);
    let client = app.pool.get().await?;
    Ok(match users::correct(&client, user, c, why(&who, params)).await {
        Ok(done) => {
            Json(json!({ "user_id": user, "id": done.id, "memory_version": done.memory_version })).into_response()
        }
        Err(e) => user_error(user.shown, e),
    })
}

/// `DELETE /api/users/{id}[?reason=&actor=]`: forgets the user. 202 when
/// the erase started (it runs in the daemon; `GET …/memory` answers 409
/// until it has finished, then 404 `user_forgotten`); 409 while an erase
/// of the user runs.
pub async fn forget(parts: UserParts) -> Result<Response, AppError> {
    let (app, user, params) = user_call(parts).await?;
    let who = actor(&params);
    if let Err(e) = users::forget_in_background(&app.pool, user, why(&who, &params)).await {
        return Ok(user_error(user.shown, e));
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "user_id": user, "status": "erasing" })),
    )
        .into_response())
}

/// `GET /api/users/{id}/export`: everything held about the user as one JSON
/// document (see [`users::export`]), streamed as it is read. A cut
/// document (the connection closes early) means the export failed.
pub async fn export(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, AppError> {
    let user = user_key(&app, &who, &id).await?;
    let place = app.exports.enter(caller.map_or(Caller::ANONYMOUS, |Extension(c)| c))?;
    if let Err(e) = users::export::check(&app.pool, user).await {
        return Ok(user_error(user.shown, e));
    }
    let (tx, rx) = tokio::sync::mpsc::channel(users::export::QUEUE);
    let pool = app.pool.clone();
    tokio::spawn(async move {
        let _place = place;
        match users::export::export(&pool, user, tx).await {
            Ok(c) => {
                tracing::info!(user = %user, requests = c.requests, turns = c.turns, records = c.records, "users: exported")
            }
            Err(e) => tracing::warn!(user = %user, error = %e, "users: export failed; the document was cut"),
        }
    });
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|c| (c.map(axum::body::Bytes::from), rx))
    });
    let mut resp = axum::body::Body::from_stream(chunks).into_response();
    resp.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = axum::http::HeaderValue::from_str(&format!("attachment; filename=\"user-{user}.json\"")) {
        resp.headers_mut().insert(axum::http::header::CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}
