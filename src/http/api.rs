//! The `/api` routes: submit a query, read its status (long-poll), and
//! follow it live over SSE or WebSocket.
//!
//! The `/api` routes share one set of request and reply types and one
//! follower; one file keeps each route's contract in one reading.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use uuid::Uuid;

use super::AppState;
use super::input::parse_id;
use super::live::{Chunks, STREAM_QUEUE, Stream, answer_chunks};
use crate::app::caller;
use crate::app::follow::{Cursor, Follower, Frame, RequestState, Target, until_end};
use crate::app::submit::{MAX_KEY_LEN, enqueue};
use crate::app::{AppError, Caller, Code, Kind, Need, Principal};
use crate::metrics::StreamGauge;
use crate::repo::requests::NewRequest;

pub use super::input::MAX_QUERY_CHARS;
/// Queue of a long-poll or single-request stream; a request changes status
/// about seven times.
pub(super) const REQUEST_QUEUE: usize = 16;
/// Queue of a stream that follows a user.
const USER_QUEUE: usize = 256;

/// An over-long body is read and dropped up to this many bytes, for at most
/// [`DRAIN_TIME`], before the 413 goes out (see [`read_body`]).
const DRAIN_CAP: usize = 16 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Reads a request body of at most `max` bytes. A longer one is drained
/// (read and dropped, within [`DRAIN_CAP`] and [`DRAIN_TIME`]) before the
/// error is returned: a connection closed with unread data is reset by TCP,
/// and the client may then lose the 413 it was sent.
pub(super) async fn read_body(body: axum::body::Body, max: usize) -> Result<Bytes, AppError> {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| AppError::bad_request(Code::UnreadableBody, format!("cannot read the body: {e}")))?;
        if buf.len() + chunk.len() <= max {
            buf.extend_from_slice(&chunk);
            continue;
        }
        let deadline = tokio::time::Instant::now() + DRAIN_TIME;
        let mut drained = buf.len() + chunk.len();
        while drained < DRAIN_CAP {
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(Some(Ok(more))) => drained += more.len(),
                _ => break,
            }
        }
        return Err(AppError::new(
            Kind::TooLarge,
            Code::BodyTooLarge,
            format!("the body is larger than {max} bytes"),
        ));
    }
    Ok(Bytes::from(buf))
}

/// `POST /api/query`: 202 with the request's id; with `"stream": true`
/// and `Accept: text/event-stream`, the answer itself as OpenAI's
/// `chat.completion.chunk` events ([`Stream::chat_chunks`]).
pub async fn submit(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, AppError> {
    check_json_content_type(&headers)?;
    let body = read_body(body, app.cfg.http.max_body_bytes).await?;
    let key = idempotency_key(&headers)?;
    let sub = super::input::parse_submission(&body)?;
    let req = NewRequest {
        user_id: sub.user_id,
        thread_id: sub.thread_id,
        query: &sub.query,
        callback_url: sub.callback_url.as_deref(),
        debug: sub.debug,
        tenant_id: who.tenant,
        metadata: sub.metadata.as_ref(),
        stream: sub.stream,
        clarify: sub.clarify,
        review: sub.review,
    };
    // A stream takes its place before the request exists (over a cap, the
    // request is not made).
    let caller = caller.map_or(Caller::ANONYMOUS, |Extension(c)| c);
    let place = match sub.stream && accepts_event_stream(&headers) {
        true => Some(app.streams.enter(caller)?),
        false => None,
    };
    who.acts_for(sub.user_id, "user_id")?;
    let (id, replayed) = enqueue(&app, &who, &req, key).await?;
    if !replayed {
        tracing::debug!(request.id = %id, tenant = %who.tenant_name, "http: request submitted");
    }
    let mut resp = match place {
        Some(place) => {
            let opts = Chunks {
                model: "maas".to_owned(),
                usage_for: None,
            };
            answer_chunks(&app, caller, who.tenant, id, place, opts).await?
        }
        None => accepted(id),
    };
    if let Ok(v) = HeaderValue::from_str(&format!("/api/query/{id}/status")) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    if replayed {
        resp.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(resp)
}

/// The 202 of a submitted request.
fn accepted(id: Uuid) -> Response {
    (
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "request_id": id, "status": "processing" })),
    )
        .into_response()
}

/// Whether the client takes `text/event-stream` (`Accept`).
fn accepts_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|m| {
            m.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("text/event-stream")
        })
}

/// The position after which a reconnecting client wants the pieces of the
/// answer (`Last-Event-ID`, or `?after=`); a value that is not one is
/// refused.
fn resume_from(raw: Option<&str>, name: &str) -> Result<Option<Cursor>, AppError> {
    raw.filter(|r| !r.trim().is_empty())
        .map(|r| {
            Cursor::parse(r).ok_or_else(|| {
                AppError::bad_request(
                    Code::InvalidCursor,
                    format!(
                        "{name}={}: expected ATTEMPT.SEQ, the id of the last piece received",
                        super::input::shown(r)
                    ),
                )
            })
        })
        .transpose()
}

pub(super) fn check_json_content_type(headers: &HeaderMap) -> Result<(), AppError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = ct.split(';').next().unwrap_or("").trim();
    if media.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(AppError::new(
            Kind::UnsupportedMedia,
            Code::UnsupportedMediaType,
            format!(
                "expected Content-Type: application/json, got {}",
                if ct.is_empty() { "none" } else { ct }
            ),
        ))
    }
}

pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, AppError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let bad = || {
        AppError::bad_request(
            Code::InvalidIdempotencyKey,
            format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters"),
        )
    };
    let key = v.to_str().map_err(|_| bad())?.trim();
    if key.is_empty() || key.len() > MAX_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad());
    }
    Ok(Some(key))
}

/// Parses a wait: `30s`, `500ms`, `2m`, or plain seconds (`30`, `1.5`).
pub fn parse_wait(raw: &str) -> Option<Duration> {
    let s = raw.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num.trim().parse().ok()?;
    if !n.is_finite() || n < 0.0 {
        return None;
    }
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}

/// `GET /api/query/{id}/status[?wait=30s][&include=context]`: the state,
/// and `metadata` when the request carries one; with `include=context` also
/// `context` and `context_sources` (the memory it holds and the system
/// prompt), read after the state. The context is the user's memory, so
/// `include=context` needs what the memory route needs
/// ([`Need::ReadUser`], scope `read`), checked before anything is read.
pub async fn status(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Json<serde_json::Value>, AppError> {
    let id = parse_id(&id, "request")?;
    let Query(params) = query.map_err(|e| AppError::bad_request(Code::InvalidQuery, e.body_text()))?;
    let with_context = match params.get("include").map(String::as_str) {
        None => false,
        Some("context") => true,
        Some(other) => {
            return Err(AppError::bad_request(
                Code::InvalidInclude,
                format!("include={}: the only value is context", super::input::shown(other)),
            ));
        }
    };
    if with_context {
        who.require(Need::ReadUser)?;
    }
    let caller = caller.map_or(Caller::ANONYMOUS, |Extension(c)| c);
    let state = state_after_wait(&app, caller, &who, id, &params).await?;
    let mut body = serde_json::to_value(&state)
        .map_err(|e| AppError::from(crate::db::Error::Unexpected(format!("status of {id}: {e}"))))?;
    let client = app.pool.get().await?;
    // The answer under review, to who may review it (`app::review`).
    if state.stage == crate::model::Status::AwaitingReview
        && let Some(obj) = body.as_object_mut()
        && let Some(answer) = crate::app::review::answer_under_review(&client, &who, id).await?
    {
        obj.insert("answer".into(), serde_json::Value::String(answer));
    }
    if let Some(obj) = body.as_object_mut()
        && let Some(Some(metadata)) = crate::repo::requests::metadata_of(&client, id).await?
    {
        obj.insert("metadata".into(), metadata);
    }
    if with_context && let Some(obj) = body.as_object_mut() {
        let run = crate::repo::requests::context_of(&client, id, who.tenant).await?;
        let (context, sources) = run.map_or((None, None), |r| (r.context, r.context_sources));
        obj.insert(
            "context".into(),
            context.map_or(serde_json::Value::Null, serde_json::Value::String),
        );
        obj.insert("context_sources".into(), sources.unwrap_or(serde_json::Value::Null));
    }
    Ok(Json(body))
}

/// The state of `id`, after waiting as `?wait=` asks.
async fn state_after_wait(
    app: &AppState,
    caller: Caller,
    who: &Principal,
    id: Uuid,
    params: &HashMap<String, String>,
) -> Result<RequestState, AppError> {
    let wait = match params.get("wait") {
        None => Duration::ZERO,
        Some(w) => parse_wait(w)
            .ok_or_else(|| {
                AppError::bad_request(
                    Code::InvalidWait,
                    format!("wait={}: expected e.g. 30s, 500ms or 2m", super::input::shown(w)),
                )
            })?
            .min(app.cfg.http.max_wait()),
    };
    // Subscribe before reading, so a change in between is not missed.
    let sub = app.hub.subscribe(Target::Request(id), REQUEST_QUEUE);
    let mut follower = Follower::new(app.pool.clone(), sub)
        .for_tenant(who.tenant)
        .for_user(bound_user(app, who).await?);
    let state = follower
        .current()
        .await?
        .pop()
        .ok_or_else(|| AppError::not_found(format!("no request {id}")))?;
    if state.needs_caller() || wait.is_zero() {
        return Ok(state);
    }
    // A long-poll holds a place until it answers; over a cap it answers
    // at once (429/503 with Retry-After).
    let _place = app.long_polls.enter(caller)?;
    let _waiting = StreamGauge::long_poll();
    let deadline = tokio::time::Instant::now() + wait;
    Ok(until_end(&mut follower, state, deadline, &app.shutdown).await?)
}

/// `GET /api/query/{id}/events`: Server-Sent Events, one `data:` JSON per
/// change, the current state first, and `delta`/`restart` events while a
/// streamed answer is written (`Last-Event-ID` resumes after a piece);
/// ends after the terminal state, or with a `revoked` event once the token
/// is revoked.
pub async fn events(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    let id = parse_id(&id, "request")?;
    let last_id = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let after = resume_from(last_id, "Last-Event-ID")?;
    let caller = caller.map_or(Caller::ANONYMOUS, |Extension(c)| c);
    let place = app.streams.enter(caller)?;
    let sub = app.hub.subscribe_streaming(Target::Request(id), STREAM_QUEUE);
    let mut follower = Follower::new(app.pool.clone(), sub)
        .for_tenant(who.tenant)
        .for_user(bound_user(&app, &who).await?)
        .with_deltas(after);
    let first = first_frames(&mut follower, after.is_some()).await?;
    if first.is_empty() {
        return Err(AppError::not_found(format!("no request {id}")));
    }
    Ok(Stream::new(&app, caller, follower, first, "sse", place).sse())
}

/// The stored id of the user `who`'s token is bound to, if it is
/// ([`tenancy::bound_user`]).
async fn bound_user(app: &AppState, who: &Principal) -> Result<Option<Uuid>, AppError> {
    if who.user.is_none() {
        return Ok(None);
    }
    let client = app.pool.get().await?;
    caller::bound_user(&client, who).await
}

/// The current state(s), then, for a client that resumes, the pieces it
/// missed.
async fn first_frames(follower: &mut Follower, resumes: bool) -> Result<Vec<Frame>, AppError> {
    let mut first: Vec<Frame> = follower.current().await?.into_iter().map(Frame::State).collect();
    if resumes && !first.is_empty() {
        first.extend(follower.catch_up().await);
    }
    Ok(first)
}

/// `GET /api/ws?request_id=ID[&after=ATTEMPT.SEQ]` or `?user_id=ID`: a
/// WebSocket of JSON text messages, the current state(s) first, then every
/// change and the pieces of streamed answers (`after` resumes a request's
/// after a piece). A request's
/// socket closes (1000) after its terminal state; a user's stays open. Both
/// close (1001) when the daemon stops, and (1008) once the token is revoked.
/// A browser opens a WebSocket without CORS, so an `Origin` must name this
/// server (`local_guard::browser_origin`, 403 `forbidden_origin`).
pub async fn ws(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, AppError> {
    super::local_guard::browser_origin(&headers)?;
    let Query(params) = query.map_err(|e| AppError::bad_request(Code::InvalidQuery, e.body_text()))?;
    let target = ws_target(&app, &who, &params).await?;
    let after = match target {
        Target::Request(_) => resume_from(params.get("after").map(String::as_str), "after")?,
        Target::User(_) => None,
    };
    let caller = caller.map_or(Caller::ANONYMOUS, |Extension(c)| c);
    let place = app.streams.enter(caller)?;
    let queue = match target {
        Target::Request(_) => STREAM_QUEUE,
        Target::User(_) => USER_QUEUE,
    };
    let sub = app.hub.subscribe_streaming(target, queue);
    let mut follower = Follower::new(app.pool.clone(), sub)
        .for_tenant(who.tenant)
        .for_user(bound_user(&app, &who).await?)
        .with_deltas(after);
    let first = first_frames(&mut follower, after.is_some()).await?;
    if let Target::Request(id) = target
        && first.is_empty()
    {
        return Err(AppError::not_found(format!("no request {id}")));
    }
    let upgrade = upgrade.map_err(|e| {
        AppError::new(
            Kind::UpgradeRequired,
            Code::WebsocketRequired,
            format!("this route speaks WebSocket: {}", e.body_text()),
        )
    })?;
    let stream = Stream::new(&app, caller, follower, first, "websocket", place);
    let max = app.cfg.http.ws_max_message_bytes;
    Ok(upgrade
        .max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| stream.websocket(socket)))
}

/// What a WebSocket follows: `request_id` (scope of the route) or
/// `user_id` (a user's memory and stream: [`Need::ReadUser`]).
async fn ws_target(app: &AppState, who: &Principal, params: &HashMap<String, String>) -> Result<Target, AppError> {
    match (params.get("request_id"), params.get("user_id")) {
        (Some(r), None) => Ok(Target::Request(parse_id(r, "request")?)),
        (None, Some(u)) => {
            who.require(Need::ReadUser)?;
            let user = parse_id(u, "user")?;
            who.acts_for(user, "user_id")?;
            let client = app.pool.get().await?;
            Ok(Target::User(caller::stored_user(&client, who, user).await?))
        }
        _ => Err(AppError::bad_request(
            Code::InvalidQuery,
            "give exactly one of request_id and user_id",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_parse_with_units() {
        assert_eq!(parse_wait("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_wait("30"), Some(Duration::from_secs(30)));
        assert_eq!(parse_wait("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_wait("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_wait("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_wait("0"), Some(Duration::ZERO));
        for bad in ["", "soon", "-1s", "5h", "s", "NaNs", "1e400s"] {
            assert_eq!(parse_wait(bad), None, "{bad}");
        }
    }
}
