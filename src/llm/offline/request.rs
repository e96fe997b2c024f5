//! Reading a request the way every offline role does: its texts, the JSON
//! objects in them, and the user's query (see the module doc of
//! [`offline`](super) for where the query is taken from). Pure.

use serde_json::Value;

use crate::llm::ChatRequest;

/// The text between `open` and `close`, trimmed.
pub(super) fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let end = text[start..].find(close)? + start;
    Some(text[start..end].trim())
}

/// A text that is one JSON object or array.
pub(super) fn parse_json_object(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    if !(trimmed.starts_with('{') || trimmed.starts_with('[')) {
        return None;
    }
    serde_json::from_str(trimmed).ok()
}

/// All texts of a request: the system prompt, then the messages.
pub(super) fn texts(req: &ChatRequest) -> impl Iterator<Item = &str> {
    req.system
        .as_deref()
        .into_iter()
        .chain(req.messages.iter().map(|m| m.content.as_str()))
}

/// The user's query, as described in the module doc of [`offline`](super).
pub(super) fn query_of(req: &ChatRequest) -> String {
    let last = req.last_user_message().unwrap_or_default();
    if let Some(Value::Object(map)) = parse_json_object(last) {
        for key in ["user_query", "query", "current_query"] {
            if let Some(q) = map.get(key).and_then(Value::as_str) {
                return q.trim().to_owned();
            }
        }
    }
    std::iter::once(last)
        .chain(texts(req))
        .find_map(|t| between(t, "<current_query>", "</current_query>"))
        .map_or_else(|| last.trim().to_owned(), unquote)
}

/// The query as the user wrote it: the assembler escapes `&`, `<`, `>` and
/// `"` inside `<current_query>`.
fn unquote(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&")
}
