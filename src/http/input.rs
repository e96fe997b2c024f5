//! Outside input of the API, read before anything touches the database: the
//! submit body, ids in paths and query strings, and the JSON shape of every
//! refusal.
//!
//! Guarantees:
//! - [`parse_submission`] accepts only a JSON object whose `user_id` (and
//!   `thread_id`, when given) is a UUID string and whose `query` is
//!   non-blank text of at most [`MAX_QUERY_CHARS`] characters without a NUL
//!   (PostgreSQL `text` cannot hold U+0000); anything else is a 4xx naming
//!   the field. It never panics, whatever the bytes (property-tested).
//!   `metadata`, when given, is a JSON object within the bounds of
//!   `submit_fields` (a 400 naming it otherwise).
//!   Unknown fields are ignored, as they always were: clients may send
//!   more than this version reads.
//! - Every other text field that reaches the database is refused with a
//!   400 naming it when it holds a NUL (`crate::app::input`).
//! - [`parse_id`] and [`crate::http::api::parse_wait`] read a path or query
//!   value, and a refusal echoes at most [`ECHO_CHARS`] characters of it.
//! - [`json_errors`] turns every error answer the framework makes by itself
//!   (a path that is not UTF-8, a method a route does not have, a query
//!   string that does not decode) into the same `{"error", "code"}` JSON
//!   body the handlers send, keeping its status and headers.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::Value;
use uuid::Uuid;

pub use crate::app::input::{MAX_QUERY_CHARS, check_field};
use crate::app::input::{check_text, query_text};
use crate::app::{AppError, Code};

/// Most characters of a refused value repeated in the error message.
pub const ECHO_CHARS: usize = 64;
/// Most bytes of a framework error body kept in the JSON message.
const FRAMEWORK_BODY_CAP: usize = 1024;

/// A valid `POST /api/query` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    pub user_id: Uuid,
    pub thread_id: Option<Uuid>,
    pub query: String,
    /// Where to deliver the result (`callbacks`), if anywhere.
    pub callback_url: Option<String>,
    /// Rest between stages until continued.
    pub debug: bool,
    /// The client's own JSON object, stored with the request.
    pub metadata: Option<Value>,
    /// Send the answer's pieces while the model writes.
    pub stream: bool,
    /// May the analyzer ask the user (`clarify`); `None`: the tenant's setting.
    pub clarify: Option<bool>,
    /// An operator reviews the answer before the user gets it.
    pub review: bool,
}

/// Reads a submit body (see the module's guarantees).
pub fn parse_submission(body: &[u8]) -> Result<Submission, AppError> {
    let body: Value = serde_json::from_slice(body)
        .map_err(|e| AppError::bad_request(Code::MalformedJson, format!("the body is not valid JSON: {e}")))?;
    let Value::Object(mut fields) = body else {
        return Err(AppError::bad_request(
            Code::MalformedJson,
            "the body must be a JSON object",
        ));
    };
    let user_id = uuid_field(&fields, "user_id")?.ok_or_else(|| missing("user_id"))?;
    let thread_id = uuid_field(&fields, "thread_id")?;
    let query = match fields.remove("query") {
        None | Some(Value::Null) => return Err(missing("query")),
        Some(Value::String(s)) => s,
        Some(_) => return Err(AppError::unprocessable(Code::InvalidField, "query must be a string")),
    };
    query_text("query", &query)?;
    let callback_url = super::submit_fields::callback_url(&fields)?.map(str::to_owned);
    if let Some(url) = &callback_url {
        check_text("callback_url", url)?;
    }
    let debug = super::submit_fields::debug(&fields)?;
    let metadata = super::submit_fields::metadata(&fields)?;
    let stream = super::submit_fields::stream(&fields)?;
    let clarify = super::submit_fields::clarify(&fields)?;
    let review = super::submit_fields::review(&fields)?;
    Ok(Submission {
        user_id,
        thread_id,
        query,
        callback_url,
        debug,
        metadata,
        stream,
        clarify,
        review,
    })
}

fn missing(field: &str) -> AppError {
    AppError::unprocessable(Code::MissingField, format!("{field} is required"))
}

fn uuid_field(fields: &serde_json::Map<String, Value>, name: &str) -> Result<Option<Uuid>, AppError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Err(AppError::unprocessable(
            Code::EmptyField,
            format!("{name} must not be empty"),
        )),
        Some(Value::String(s)) => s
            .parse::<Uuid>()
            .map(Some)
            .map_err(|_| AppError::bad_request(Code::InvalidId, format!("{name} {} is not a UUID", shown(s)))),
        Some(_) => Err(AppError::bad_request(
            Code::InvalidId,
            format!("{name} must be a UUID string"),
        )),
    }
}

/// Reads the id of a `what` ("request", "user") from a path or query value;
/// a request's may be its chat completion's id (`chatcmpl-…`).
pub fn parse_id(raw: &str, what: &str) -> Result<Uuid, AppError> {
    let id = match what {
        "request" => crate::app::input::request_id(raw),
        _ => raw.parse::<Uuid>().ok(),
    };
    id.ok_or_else(|| AppError::bad_request(Code::InvalidId, format!("{} is not a {what} id (a UUID)", shown(raw))))
}

/// `raw` quoted, cut to [`ECHO_CHARS`] characters.
pub fn shown(raw: &str) -> String {
    if raw.chars().count() <= ECHO_CHARS {
        format!("{raw:?}")
    } else {
        let head: String = raw.chars().take(ECHO_CHARS).collect();
        format!("{head:?}…")
    }
}

/// The `code` of a framework error answer with this status.
fn code_of(status: StatusCode) -> Code {
    match status {
        StatusCode::BAD_REQUEST => Code::BadRequest,
        StatusCode::NOT_FOUND => Code::NoRoute,
        StatusCode::METHOD_NOT_ALLOWED => Code::MethodNotAllowed,
        StatusCode::PAYLOAD_TOO_LARGE => Code::BodyTooLarge,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => Code::UnsupportedMediaType,
        StatusCode::UNPROCESSABLE_ENTITY => Code::Unprocessable,
        StatusCode::TOO_MANY_REQUESTS => Code::TooManyRequests,
        s if s.is_server_error() => Code::Internal,
        _ => Code::HttpError,
    }
}

/// Middleware: an error answer that is not JSON becomes
/// `{"error": its text, "code": ...}` with the same status and headers.
pub async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = match axum::body::to_bytes(body, FRAMEWORK_BODY_CAP).await {
        Ok(b) if !b.is_empty() => String::from_utf8_lossy(&b).trim().to_owned(),
        _ => status.canonical_reason().unwrap_or("error").to_owned(),
    };
    let message = if status == StatusCode::METHOD_NOT_ALLOWED {
        let allow = parts
            .headers
            .get(header::ALLOW)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        format!("this route does not take that method (allowed: {allow})")
    } else {
        text
    };
    let json = serde_json::json!({ "error": message, "code": code_of(status) }).to_string();
    parts
        .headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(json))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(body: &str) -> &'static str {
        match parse_submission(body.as_bytes()) {
            Ok(_) => "ok",
            Err(e) => e.code.as_str(),
        }
    }

    #[test]
    fn submissions_are_refused_by_name() {
        let u = Uuid::new_v4();
        assert_eq!(
            code(&format!(r#"{{"user_id":"{u}","query":"a\u0000b"}}"#)),
            "invalid_text"
        );
        assert_eq!(code(&format!(r#"{{"user_id":"{u}","query":"ab","extra":1}}"#)), "ok");
        assert_eq!(
            code(&format!(r#"{{"user_id":"{u}","query":"\ud800"}}"#)),
            "malformed_json"
        );
        assert_eq!(code(r#"{"user_id":"x","query":"q"}"#), "invalid_id");
        assert_eq!(code(&"[".repeat(10_000)), "malformed_json");
    }

    #[test]
    fn echoes_are_cut() {
        assert_eq!(shown("abc"), "\"abc\"");
        assert!(shown(&"x".repeat(10_000)).len() < ECHO_CHARS + 8);
    }
}
