//! The rules of text every door takes: a query (or a remembered turn, a
//! summary) is non-blank text of at most [`MAX_QUERY_CHARS`] characters
//! without a NUL (PostgreSQL `text` cannot hold U+0000); every other text
//! field that reaches the database is refused when it holds a NUL. A
//! refusal names the field.

use super::error::{AppError, Code};

/// Longest query accepted, in characters (the `pipeline_runs_query_size`
/// bound, `triggers/0007_request_bounds.sql`).
pub const MAX_QUERY_CHARS: usize = 100_000;

/// The text of a query or a turn, named `field`: not blank, at most
/// [`MAX_QUERY_CHARS`] characters, no NUL; else `Unprocessable` naming the field
/// (`empty_field`, `field_too_long`, `invalid_text`). The one check of
/// `POST /api/query` and of the MCP tools' texts.
pub fn query_text(field: &str, s: &str) -> Result<(), AppError> {
    if s.trim().is_empty() {
        return Err(AppError::unprocessable(
            Code::EmptyField,
            format!("{field} must not be empty"),
        ));
    }
    if s.chars().count() > MAX_QUERY_CHARS {
        return Err(AppError::unprocessable(
            Code::FieldTooLong,
            format!("{field} is longer than {MAX_QUERY_CHARS} characters"),
        ));
    }
    check_text(field, s)
}

/// Refuses text the database cannot store: a NUL character (U+0000), an
/// `Unprocessable` `invalid_text` naming the field (the submit body's answer).
pub fn check_text(field: &str, s: &str) -> Result<(), AppError> {
    nul_free(field, s).map_err(|m| AppError::unprocessable(Code::InvalidText, m))
}

/// [`check_text`] as an `Invalid` `invalid_text`: for every other text field
/// (a summary, a reason, an actor, a query parameter).
pub fn check_field(field: &str, s: &str) -> Result<(), AppError> {
    nul_free(field, s).map_err(|m| AppError::bad_request(Code::InvalidText, m))
}

/// A form or query field's text, refused when it holds a NUL (the
/// framework answers with a 4xx naming the field): for the console's forms
/// (`#[serde(default, deserialize_with = "…")]`).
pub fn text_without_nul<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = <String as serde::Deserialize>::deserialize(d)?;
    nul_free("the text", &s).map_err(serde::de::Error::custom)?;
    Ok(s)
}

fn nul_free(field: &str, s: &str) -> Result<(), String> {
    match s.chars().position(|c| c == '\0') {
        None => Ok(()),
        Some(at) => Err(format!(
            "{field} contains a NUL character (U+0000) at character {at}; text cannot hold it"
        )),
    }
}

/// The id of a request as a person may give it: the UUID, or the id of
/// its chat completion on the OpenAI-compatible endpoint (`chatcmpl-` and
/// the UUID).
pub fn request_id(raw: &str) -> Option<uuid::Uuid> {
    let raw = raw.trim();
    raw.strip_prefix("chatcmpl-").unwrap_or(raw).parse().ok()
}
