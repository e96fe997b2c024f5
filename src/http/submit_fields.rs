//! The optional fields of `POST /api/query` beyond `user_id`, `thread_id`
//! and `query`: `callback_url` (http or https, at most 2048 characters,
//! no spaces — the table's own check, said here by name) and `debug`
//! (a boolean: the request rests between stages until continued) and
//! `metadata` (a JSON object of the client's own, at most
//! [`MAX_METADATA_BYTES`] bytes as compact JSON and [`MAX_METADATA_DEPTH`]
//! levels deep, no NUL character in any key or string: stored and shown,
//! never read by the engine). A refusal of `metadata` is a 400 naming it.
//! `stream` (a boolean): send the answer's pieces while the model writes
//! them (`app::follow::deltas`); false pays nothing. `clarify` (a boolean):
//! the analyzer may ask the user a question before it goes on (true), or
//! never (false); absent or null, as the tenant's `hitl_clarify` says.
//! `review` (a boolean): an operator approves, edits or rejects the answer
//! before the user gets it (`app::review`); false leaves it to the tenant's
//! `hitl_review`.
//!
//! Where a callback may go is decided at delivery, on the address
//! connected to (`callbacks::guard`), not here.

use serde_json::{Map, Value};

use crate::app::{AppError, Code};

const MAX_URL_CHARS: usize = 2048;
/// Most bytes of `metadata`, as compact JSON.
pub const MAX_METADATA_BYTES: usize = 4096;
/// Deepest nesting of `metadata`: the object itself is level 1.
pub const MAX_METADATA_DEPTH: usize = 8;

pub(super) fn callback_url(fields: &Map<String, Value>) -> Result<Option<&str>, AppError> {
    let url = match fields.get("callback_url") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.as_str(),
        Some(_) => {
            return Err(AppError::unprocessable(
                Code::InvalidField,
                "callback_url must be a string",
            ));
        }
    };
    let bad = |why: &str| {
        Err(AppError::unprocessable(
            Code::InvalidField,
            format!("callback_url {why}"),
        ))
    };
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

pub(super) fn debug(fields: &Map<String, Value>) -> Result<bool, AppError> {
    flag(fields, "debug")
}

pub(super) fn stream(fields: &Map<String, Value>) -> Result<bool, AppError> {
    flag(fields, "stream")
}

/// `clarify`: `None` when absent or null (the tenant decides).
pub(super) fn clarify(fields: &Map<String, Value>) -> Result<Option<bool>, AppError> {
    match fields.get("clarify") {
        None | Some(Value::Null) => Ok(None),
        _ => flag(fields, "clarify").map(Some),
    }
}

/// `review`: true asks for an operator's review; false or absent leaves it
/// to the tenant's `hitl_review` (a request cannot turn the tenant's off).
pub(super) fn review(fields: &Map<String, Value>) -> Result<bool, AppError> {
    flag(fields, "review")
}

/// A boolean field: absent or null is false; anything but a boolean is a
/// 422 naming it.
fn flag(fields: &Map<String, Value>, name: &str) -> Result<bool, AppError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(AppError::unprocessable(
            Code::InvalidField,
            format!("{name} must be true or false"),
        )),
    }
}

/// `metadata`: absent or null is none; anything but an object within the
/// bounds is refused (400, code `invalid_metadata`, naming the field).
pub(super) fn metadata(fields: &Map<String, Value>) -> Result<Option<Value>, AppError> {
    let bad = |why: String| Err(AppError::bad_request(Code::InvalidMetadata, format!("metadata {why}")));
    let value = match fields.get("metadata") {
        None | Some(Value::Null) => return Ok(None),
        Some(v @ Value::Object(_)) => v,
        Some(_) => return bad("must be a JSON object".into()),
    };
    let depth = depth_of(value);
    if depth > MAX_METADATA_DEPTH {
        return bad(format!(
            "is nested {depth} levels deep; at most {MAX_METADATA_DEPTH} are accepted"
        ));
    }
    let bytes = serde_json::to_vec(value).map_or(usize::MAX, |b| b.len());
    if bytes > MAX_METADATA_BYTES {
        return bad(format!(
            "is {bytes} bytes as JSON; at most {MAX_METADATA_BYTES} are accepted"
        ));
    }
    if has_nul(value) {
        return bad("contains a NUL character (U+0000); jsonb cannot hold it".into());
    }
    Ok(Some(value.clone()))
}

/// Levels of arrays and objects: a scalar is 0, `{}` is 1.
fn depth_of(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth_of).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(depth_of).max().unwrap_or(0),
        _ => 0,
    }
}

fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(a) => a.iter().any(has_nul),
        Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn meta(v: Value) -> Result<Option<Value>, String> {
        let Value::Object(fields) = json!({ "metadata": v }) else {
            unreachable!()
        };
        metadata(&fields).map_err(|e| format!("{} {}", e.code, e.message))
    }

    /// The refusal of `v`, empty when it was accepted.
    fn refusal(v: Value) -> String {
        meta(v).err().unwrap_or_default()
    }

    #[test]
    fn metadata_is_an_object_within_bounds() {
        assert_eq!(meta(Value::Null), Ok(None));
        assert_eq!(
            meta(json!({"a": [1, {"b": "c"}]})),
            Ok(Some(json!({"a": [1, {"b": "c"}]})))
        );
        for bad in [json!([1]), json!("x"), json!(3)] {
            let e = refusal(bad);
            assert!(e.starts_with("invalid_metadata metadata must be a JSON object"), "{e}");
        }
        let big = json!({ "k": "x".repeat(MAX_METADATA_BYTES) });
        assert!(refusal(big).contains("bytes as JSON"));
        let mut deep = json!({});
        for _ in 0..MAX_METADATA_DEPTH {
            deep = json!({ "d": deep });
        }
        assert!(refusal(deep).contains("levels deep"));
        let mut just = json!({});
        for _ in 1..MAX_METADATA_DEPTH {
            just = json!({ "d": just });
        }
        assert!(meta(just).is_ok());
        assert!(refusal(json!({ "a\u{0}": 1 })).contains("NUL"));
    }
}
