//! The optional fields of `POST /api/query` beyond `user_id`, `thread_id`
//! and `query`: `callback_url` (http or https, at most 2048 characters,
//! no spaces — the table's own check, said here by name) and `debug`
//! (a boolean: the request rests between stages until continued).
//!
//! Where a callback may go is decided at delivery, on the address
//! connected to (`callbacks::guard`), not here.

use serde_json::{Map, Value};

use super::error::ApiError;

const MAX_URL_CHARS: usize = 2048;

pub(super) fn callback_url(fields: &Map<String, Value>) -> Result<Option<&str>, ApiError> {
    let url = match fields.get("callback_url") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.as_str(),
        Some(_) => {
            return Err(ApiError::unprocessable(
                "invalid_field",
                "callback_url must be a string",
            ));
        }
    };
    let bad = |why: &str| Err(ApiError::unprocessable("invalid_field", format!("callback_url {why}")));
    if url.chars().count() > MAX_URL_CHARS {
        return bad(&format!("is longer than {MAX_URL_CHARS} characters"));
    }
    if url.chars().any(char::is_whitespace) {
        return bad("must not contain spaces");
    }
    match reqwest::Url::parse(url) {
        Ok(u) if (u.scheme() == "http" || u.scheme() == "https") && u.host_str().is_some_and(|h| !h.is_empty()) => {
            Ok(Some(url))
        }
        Ok(_) => bad("must be an http:// or https:// URL with a host"),
        Err(e) => bad(&format!("is not a URL: {e}")),
    }
}

pub(super) fn debug(fields: &Map<String, Value>) -> Result<bool, ApiError> {
    match fields.get("debug") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::unprocessable("invalid_field", "debug must be true or false")),
    }
}
