//! The OpenAI-compatible endpoint: `POST /v1/chat/completions` and
//! `GET /v1/models`, so an application that speaks OpenAI's chat
//! completions gets maas's memory by changing its base URL to
//! `http://HOST:PORT/v1`. A door over the application layer as
//! `POST /api/query` is: the same tokens, tenants, scope (submit), limits,
//! caps, body cap, idempotency keys and `Origin` rules, one submission
//! ([`submit::enqueue_conversation`]), one follower, one stream
//! ([`super::live::Stream::chat_chunks`]).
//!
//! A chat completion is a pipeline request:
//! - **user**: the token's bound user; else `X-Maas-User`, else the
//!   body's `user`: a UUID, or any other string, mapped to
//!   `uuid5(NAMESPACE_URL, "maas:user:" + string)` ([`user_id_of`]):
//!   stable, and kept apart per tenant like every user id. None of them:
//!   400 `missing_field` naming the three.
//! - **thread**: `X-Maas-Thread` or `metadata.thread_id` (a UUID); else
//!   derived from the conversation, `uuid5(NAMESPACE_URL,
//!   "maas:thread:" + user + "\n" + first user message)`: a client that
//!   resends its history stays in one thread.
//! - **query**: the last message, which must be the user's. The earlier
//!   user and assistant messages are the thread's turns: those the thread
//!   does not hold yet are logged, in order, in the request's transaction;
//!   those it holds (an earlier question and maas's answer) are recognised
//!   and not logged twice. System and developer messages steer nothing
//!   (the deployment's prompts do); tool messages are not read.
//! - **model**: one of `GET /v1/models` (the responder's model and
//!   `http.openai_models`), else 404 `model_not_found`.
//! - **answer**: `id` is `chatcmpl-` and the request id (which
//!   `maasctl requests show` and the console take), `usage` the tokens of
//!   every stage of the pipeline, `finish_reason` `stop`. Not streamed, the
//!   answer is waited for up to `http.max_wait_secs` (then 503 `timeout`
//!   naming the request, which goes on). `stream: true` sends OpenAI's
//!   chunks ending with `data: [DONE]`, with a usage chunk first when
//!   `stream_options.include_usage` asks.
//! - **errors**: OpenAI's error object, `{"error": {"message", "type",
//!   "param", "code"}}`, with the status of the same refusal on `/api`
//!   (401, 403, 404, 413, 415, 422, 429 with `Retry-After`, 500, 503);
//!   [`reshape`] gives every answer under `/v1/` that shape, the refusals
//!   of authentication, caps and the framework included.

use axum::Extension;
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::AppState;
use super::api::{REQUEST_QUEUE, check_json_content_type, idempotency_key, read_body};
use super::live::{Chunks, answer_chunks, completion_id, usage_json};
use crate::app::follow::{Follower, Target, until_end};
use crate::app::input::{check_text, query_text};
use crate::app::{AppError, Caller, Code, Kind, Principal, memory, submit};
use crate::model::Status;
use crate::repo::requests::NewRequest;

/// Most messages a conversation may carry (the body cap bounds their text).
const MAX_MESSAGES: usize = 1000;
/// Most bytes of an error body [`reshape`] reads.
const ERROR_BODY_CAP: usize = 64 * 1024;

/// A chat completion request, as read.
#[derive(Debug)]
struct Chat {
    model: String,
    /// `(role, text)` of every message, in order.
    messages: Vec<(String, String)>,
    stream: bool,
    include_usage: bool,
    user: Option<String>,
    thread: Option<Uuid>,
}

fn invalid(code: Code, message: impl Into<String>) -> AppError {
    AppError::bad_request(code, message)
}

/// The text of message `i`: a string, or the text parts of an array.
fn message_text(i: usize, content: Option<&Value>) -> Result<String, AppError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = Vec::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push(t.as_str()),
                    _ => {
                        return Err(invalid(
                            Code::InvalidField,
                            format!("messages[{i}].content: only text parts are read"),
                        ));
                    }
                }
            }
            Ok(text.join("\n"))
        }
        Some(_) => Err(invalid(
            Code::InvalidField,
            format!("messages[{i}].content must be a string or an array of text parts"),
        )),
    }
}

/// The messages of a request body, each `(role, text)`.
fn messages_of(fields: &Map<String, Value>) -> Result<Vec<(String, String)>, AppError> {
    let Some(Value::Array(list)) = fields.get("messages") else {
        return Err(invalid(
            Code::MissingField,
            "messages is required: an array of messages",
        ));
    };
    if list.is_empty() || list.len() > MAX_MESSAGES {
        return Err(invalid(
            Code::InvalidField,
            format!("messages must hold 1 to {MAX_MESSAGES} messages, not {}", list.len()),
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(Code::InvalidField, format!("messages[{i}].role must be a string")))?;
        let text = message_text(i, m.get("content"))?;
        check_text(&format!("messages[{i}].content"), &text)?;
        out.push((role.to_owned(), text));
    }
    Ok(out)
}

/// An optional string field.
fn string_field(fields: &Map<String, Value>, name: &str) -> Result<Option<String>, AppError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid(Code::InvalidField, format!("{name} must be a string"))),
    }
}

/// Reads a chat completion body, naming the field at fault.
fn parse_chat(body: &[u8]) -> Result<Chat, AppError> {
    let body: Value = serde_json::from_slice(body)
        .map_err(|e| invalid(Code::MalformedJson, format!("the body is not valid JSON: {e}")))?;
    let Value::Object(fields) = body else {
        return Err(invalid(Code::MalformedJson, "the body must be a JSON object"));
    };
    let model = string_field(&fields, "model")?
        .ok_or_else(|| invalid(Code::MissingField, "model is required (GET /v1/models lists them)"))?;
    let messages = messages_of(&fields)?;
    let flag = |v: Option<&Value>, name: &str| match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid(Code::InvalidField, format!("{name} must be a boolean"))),
    };
    let stream = flag(fields.get("stream"), "stream")?;
    let include_usage = flag(
        fields.get("stream_options").and_then(|o| o.get("include_usage")),
        "stream_options.include_usage",
    )?;
    let thread = match fields.get("metadata").and_then(|m| m.get("thread_id")) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(uuid_value("metadata.thread_id", s)?),
        Some(_) => return Err(invalid(Code::InvalidId, "metadata.thread_id must be a UUID string")),
    };
    Ok(Chat {
        model,
        messages,
        stream,
        include_usage,
        user: string_field(&fields, "user")?,
        thread,
    })
}

fn uuid_value(name: &str, raw: &str) -> Result<Uuid, AppError> {
    raw.trim().parse::<Uuid>().map_err(|_| {
        invalid(
            Code::InvalidId,
            format!("{name} {} is not a UUID", super::input::shown(raw)),
        )
    })
}

/// The user id a string names: the UUID it is, else
/// `uuid5(NAMESPACE_URL, "maas:user:" + string)`.
pub fn user_id_of(raw: &str) -> Uuid {
    raw.trim()
        .parse::<Uuid>()
        .unwrap_or_else(|_| Uuid::new_v5(&Uuid::NAMESPACE_URL, format!("maas:user:{raw}").as_bytes()))
}

/// The thread of a conversation whose first user message is `first`.
pub fn thread_of_conversation(user: Uuid, first: &str) -> Uuid {
    Uuid::new_v5(&Uuid::NAMESPACE_URL, format!("maas:thread:{user}\n{first}").as_bytes())
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, AppError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim()).filter(|s| !s.is_empty()))
            .map_err(|_| invalid(Code::InvalidField, format!("{name} must be visible ASCII"))),
    }
}

/// The user a chat is for (see the module's docs), and the field that
/// named it.
fn chat_user(who: &Principal, headers: &HeaderMap, body_user: Option<&str>) -> Result<(Uuid, &'static str), AppError> {
    if let Some(raw) = header_text(headers, "x-maas-user")? {
        return Ok((user_id_of(raw), "X-Maas-User"));
    }
    if let Some(raw) = body_user.map(str::trim).filter(|u| !u.is_empty()) {
        return Ok((user_id_of(raw), "user"));
    }
    match who.user {
        Some(bound) => Ok((bound, "the token's user")),
        None => Err(invalid(
            Code::MissingField,
            "no user: send the body's `user`, an `X-Maas-User` header, or use a token bound to a user (maasctl tokens create … --user)",
        )),
    }
}

/// The models the deployment offers: the responder's, then the aliases of
/// `http.openai_models` (resolved once, when the server's state is made).
pub fn offered(cfg: &crate::config::Config) -> Vec<String> {
    let mut models = Vec::new();
    match cfg.llm.resolve(&cfg.llm_provider, &|k| std::env::var(k).ok()) {
        Ok(llm) => models.push(llm.role(crate::llm::Role::Responder).model.clone()),
        Err(e) => {
            tracing::warn!(error = %e, "http: the responder's model is unknown; /v1/models lists the aliases only")
        }
    }
    for alias in &cfg.http.openai_models {
        if !models.contains(alias) {
            models.push(alias.clone());
        }
    }
    models
}

/// `GET /v1/models`: what the deployment offers.
pub async fn models(State(app): State<AppState>) -> Json<Value> {
    let data: Vec<Value> = app
        .models
        .iter()
        .map(|id| json!({ "id": id, "object": "model", "created": 0, "owned_by": "maas" }))
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

/// The pieces of a chat as a request: its thread, query and earlier turns.
struct Conversation<'a> {
    thread: Uuid,
    query: &'a str,
    earlier: Vec<(&'static str, &'a str)>,
}

fn conversation<'a>(chat: &'a Chat, headers: &HeaderMap, user: Uuid) -> Result<Conversation<'a>, AppError> {
    let Some(((role, query), before)) = chat.messages.split_last() else {
        return Err(invalid(Code::MissingField, "messages must not be empty"));
    };
    if role != "user" {
        return Err(invalid(
            Code::InvalidField,
            format!("messages: the last message must be the user's, not {role:?}"),
        ));
    }
    query_text("the last message's content", query)?;
    let mut earlier = Vec::new();
    for (role, text) in before {
        let kind = match role.as_str() {
            "user" => "user_query",
            "assistant" => "assistant_response",
            _ => continue,
        };
        if !text.trim().is_empty() {
            query_text("an earlier message's content", text)?;
            earlier.push((kind, text.as_str()));
        }
    }
    let given = match header_text(headers, "x-maas-thread")? {
        Some(raw) => Some(uuid_value("X-Maas-Thread", raw)?),
        None => chat.thread,
    };
    let first = chat
        .messages
        .iter()
        .find(|(r, _)| r == "user")
        .map_or(query.as_str(), |(_, t)| t.as_str());
    Ok(Conversation {
        thread: given.unwrap_or_else(|| thread_of_conversation(user, first)),
        query,
        earlier,
    })
}

/// `POST /v1/chat/completions` (see the module's docs).
pub async fn chat(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, AppError> {
    check_json_content_type(&headers)?;
    let body = read_body(body, app.cfg.http.max_body_bytes).await?;
    let key = idempotency_key(&headers)?;
    let chat = parse_chat(&body)?;
    if !app.models.contains(&chat.model) {
        return Err(AppError::new(
            Kind::NotFound,
            Code::ModelNotFound,
            format!("model {:?} is not offered here (GET /v1/models lists them)", chat.model),
        ));
    }
    let (shown, field) = chat_user(&who, &headers, chat.user.as_deref())?;
    let user = memory::user(&app, &who, shown, field).await?;
    let talk = conversation(&chat, &headers, shown)?;
    let metadata = json!({ "openai": { "model": chat.model, "messages": chat.messages.len() } });
    let req = NewRequest {
        user_id: shown,
        thread_id: Some(talk.thread),
        query: talk.query,
        callback_url: None,
        debug: false,
        tenant_id: who.tenant,
        metadata: Some(&metadata),
        stream: chat.stream,
        // A chat completion has no way to take a reply: it never asks.
        clarify: Some(false),
        review: false,
    };
    // The wait or the stream takes its place before the request exists.
    let caller = caller.map_or(Caller::ANONYMOUS, |Extension(c)| c);
    let place = match chat.stream {
        true => app.streams.enter(caller)?,
        false => app.long_polls.enter(caller)?,
    };
    let (id, replayed) = submit::enqueue_conversation(&app, &who, &req, key, user, &talk.earlier).await?;
    let mut resp = if chat.stream {
        let opts = Chunks {
            model: chat.model,
            usage_for: chat.include_usage.then_some(who.tenant),
        };
        answer_chunks(&app, caller, who.tenant, id, place, opts).await?
    } else {
        let _place = place;
        completion(&app, id, who.tenant, &chat.model).await?
    };
    if replayed {
        resp.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(resp)
}

/// The answer of request `id` once it ends (within `http.max_wait_secs`),
/// as a `chat.completion`.
async fn completion(app: &AppState, id: Uuid, tenant: Uuid, model: &str) -> Result<Response, AppError> {
    let sub = app.hub.subscribe(Target::Request(id), REQUEST_QUEUE);
    let mut follower = Follower::new(app.pool.clone(), sub).for_tenant(tenant);
    let state = follower
        .current()
        .await?
        .pop()
        .ok_or_else(|| AppError::not_found(format!("no request {id}")))?;
    let deadline = tokio::time::Instant::now() + app.cfg.http.max_wait();
    let state = until_end(&mut follower, state, deadline, &app.shutdown).await?;
    match state.stage {
        Status::Completed => {}
        s if s.is_terminal() => {
            return Err(AppError::new(
                Kind::Internal,
                Code::RequestFailed,
                format!(
                    "request {id} ended {s}: {}",
                    state.error.as_deref().unwrap_or("no error recorded")
                ),
            ));
        }
        _ => {
            return Err(AppError::unavailable(
                Code::Timeout,
                format!(
                    "request {id} has not answered within {} s; it goes on (GET /api/query/{id}/status)",
                    app.cfg.http.max_wait().as_secs()
                ),
            ));
        }
    }
    let client = app.pool.get().await?;
    let usage = crate::repo::requests::usage_of(&client, id, tenant).await?;
    let body = json!({
        "id": completion_id(id),
        "object": "chat.completion",
        "created": chrono::Utc::now().timestamp(),
        "model": model,
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": state.answer.unwrap_or_default(), "refusal": null },
            "logprobs": null,
            "finish_reason": "stop",
        }],
        "usage": usage_json(usage),
    });
    Ok(Json(body).into_response())
}

/// OpenAI's error `type` of a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        500.. => "server_error",
        _ => "invalid_request_error",
    }
}

/// Middleware: every error answer under `/v1/` in OpenAI's shape,
/// `{"error": {"message", "type", "param", "code"}}`, keeping its status
/// and headers (`Retry-After`, `WWW-Authenticate`).
pub async fn reshape(req: Request, next: Next) -> Response {
    let under_v1 = req.uri().path().starts_with("/v1/");
    let resp = next.run(req).await;
    let status = resp.status();
    if !under_v1 || !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, ERROR_BODY_CAP).await.unwrap_or_default();
    let (message, code) = match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) => (
            v["error"].as_str().unwrap_or("").to_owned(),
            v["code"].as_str().map(str::to_owned),
        ),
        Err(_) => (String::from_utf8_lossy(&bytes).into_owned(), None),
    };
    let message = if message.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        message
    };
    let body = json!({ "error": {
        "message": message,
        "type": error_type(status),
        "param": null,
        "code": code,
    } });
    parts
        .headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(Bytes::from(body.to_string())))
}

/// The endpoint's paths in the OpenAPI document.
pub fn openapi_paths() -> Value {
    let error = json!({ "description": "OpenAI's error object", "content": { "application/json": { "schema": {
        "type": "object", "properties": { "error": { "type": "object", "properties": {
            "message": { "type": "string" }, "type": { "type": "string" },
            "param": { "type": ["string", "null"] }, "code": { "type": ["string", "null"] }
        } } }
    } } } });
    json!({
        "/v1/chat/completions": { "post": {
            "summary": "OpenAI-compatible chat completion: the last user message is a pipeline request",
            "description": "See docs/http-api.md, \"The OpenAI-compatible endpoint\". Needs scope submit.",
            "security": [{ "bearer": [] }],
            "requestBody": { "required": true, "content": { "application/json": { "schema": {
                "type": "object", "required": ["model", "messages"],
                "properties": {
                    "model": { "type": "string" },
                    "messages": { "type": "array", "items": { "type": "object" } },
                    "stream": { "type": "boolean" },
                    "user": { "type": "string" },
                    "metadata": { "type": "object" }
                }
            } } } },
            "responses": {
                "200": { "description": "A chat.completion, or with stream: true chat.completion.chunk events ending with [DONE]" },
                "400": error.clone(), "401": error.clone(), "403": error.clone(), "404": error.clone(),
                "413": error.clone(), "415": error.clone(), "422": error.clone(), "429": error.clone(),
                "500": error.clone(), "503": error.clone()
            }
        } },
        "/v1/models": { "get": {
            "summary": "The models this deployment offers (the responder's and http.openai_models)",
            "security": [{ "bearer": [] }],
            "responses": { "200": { "description": "A list of models" }, "401": error }
        } }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_strings_map_to_stable_ids_and_uuids_stay() {
        let id = Uuid::new_v4();
        assert_eq!(user_id_of(&id.to_string()), id);
        assert_eq!(user_id_of("alice"), user_id_of("alice"));
        assert_ne!(user_id_of("alice"), user_id_of("bob"));
        assert_eq!(
            user_id_of("alice"),
            Uuid::new_v5(&Uuid::NAMESPACE_URL, b"maas:user:alice")
        );
    }

    #[test]
    fn a_resent_history_keeps_its_thread() -> Result<(), AppError> {
        let user = Uuid::new_v4();
        let one = parse_chat(br#"{"model":"m","messages":[{"role":"user","content":"Hi, I am Ana"}]}"#)?;
        let two = parse_chat(
            br#"{"model":"m","messages":[{"role":"system","content":"Be brief"},{"role":"user","content":"Hi, I am Ana"},{"role":"assistant","content":"Hello Ana"},{"role":"user","content":[{"type":"text","text":"Who am I?"}]}]}"#,
        )?;
        let h = HeaderMap::new();
        let (a, b) = (conversation(&one, &h, user)?, conversation(&two, &h, user)?);
        assert_eq!(a.thread, b.thread);
        assert_eq!(b.query, "Who am I?");
        assert_eq!(
            b.earlier,
            vec![("user_query", "Hi, I am Ana"), ("assistant_response", "Hello Ana")]
        );
        Ok(())
    }

    #[test]
    fn bad_bodies_are_refused_by_name() -> Result<(), AppError> {
        let code = |b: &str| parse_chat(b.as_bytes()).err().map(|e| e.code.as_str());
        assert_eq!(code(r#"{"messages":[]}"#), Some("missing_field"));
        assert_eq!(code(r#"{"model":"m"}"#), Some("missing_field"));
        assert_eq!(code(r#"{"model":"m","messages":[]}"#), Some("invalid_field"));
        assert_eq!(
            code(r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#),
            Some("invalid_field")
        );
        assert_eq!(
            code(r#"{"model":"m","messages":[{"role":"user","content":"q"}],"metadata":{"thread_id":"x"}}"#),
            Some("invalid_id")
        );
        let last = parse_chat(br#"{"model":"m","messages":[{"role":"assistant","content":"q"}]}"#)?;
        let e = conversation(&last, &HeaderMap::new(), Uuid::nil()).err();
        assert_eq!(e.map(|e| e.code), Some(Code::InvalidField));
        Ok(())
    }
}
