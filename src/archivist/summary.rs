//! The archivist model's answer, validated.
//!
//! Guarantees: [`parse_summary`] never panics; an [`ArchiveSummary`] it
//! returns has `time_bucket_start` ≤ `time_bucket_end` (both UTC), tags
//! that are non-empty trimmed strings, and a non-empty trimmed summary.
//! Anything else is an error naming the field, which the runner treats as
//! invalid output ([`INVALID_JSON_ATTEMPTS`] tries per chunk).

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::llm::text::strip_fence;

/// The validated answer of the archivist model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveSummary {
    pub time_bucket_start: DateTime<Utc>,
    pub time_bucket_end: DateTime<Utc>,
    pub tags: Vec<String>,
    pub summary: String,
}

fn parse_time(v: Option<&Value>, key: &str) -> Result<DateTime<Utc>, String> {
    let s = v.and_then(Value::as_str).ok_or(format!("{key} must be a string"))?;
    // RFC 3339, also with a space for the `T` and PostgreSQL's `+00` offsets.
    let t = s.trim().replacen(' ', "T", 1);
    let short_offset = t.len() > 3 && {
        let (head, tail) = t.split_at(t.len() - 3);
        (tail.starts_with('+') || tail.starts_with('-'))
            && tail[1..].bytes().all(|b| b.is_ascii_digit())
            && head.contains('T')
    };
    let t = if short_offset { format!("{t}:00") } else { t };
    DateTime::parse_from_rfc3339(&t)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{key} is not an RFC 3339 time ({e})"))
}

/// Parses and validates the archivist's JSON: one object, possibly inside
/// a fenced code block, with `time_bucket_start` ≤ `time_bucket_end` (RFC
/// 3339), `tags` (strings; may be absent) and a non-empty `summary`.
pub fn parse_summary(text: &str) -> Result<ArchiveSummary, String> {
    let body = strip_fence(text.trim());
    let v: Value = serde_json::from_str(body).map_err(|e| format!("{e} (in {} bytes)", text.len()))?;
    let obj = v.as_object().ok_or("expected a JSON object")?;
    let start = parse_time(obj.get("time_bucket_start"), "time_bucket_start")?;
    let end = parse_time(obj.get("time_bucket_end"), "time_bucket_end")?;
    if start > end {
        return Err("time_bucket_start is after time_bucket_end".into());
    }
    // The years the schema stores (`lsm_storage_time_range`, sql/0009).
    for (t, key) in [(start, "time_bucket_start"), (end, "time_bucket_end")] {
        if !(1..=9998).contains(&chrono::Datelike::year(&t)) {
            return Err(format!("{key} is outside the years 1 to 9998"));
        }
    }
    let tags = match obj.get("tags") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|t| t.as_str().map(|s| s.trim().to_owned()).ok_or("tags must be strings"))
            .filter(|t| t.as_ref().map_or(true, |s| !s.is_empty()))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err("tags must be an array of strings".into()),
    };
    let summary = obj
        .get("summary")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or("summary must be a non-empty string")?;
    Ok(ArchiveSummary {
        time_bucket_start: start,
        time_bucket_end: end,
        tags,
        summary: summary.to_owned(),
    })
}

/// Invalid model output gets exactly one more try (as the analyzer's).
pub const INVALID_JSON_ATTEMPTS: u32 = crate::llm::INVALID_OUTPUT_ATTEMPTS;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_and_fenced_summaries() {
        let good = r#"{"time_bucket_start": "2024-05-01T10:00:00Z", "time_bucket_end": "2024-05-01T13:00:00+02:00",
            "tags": ["trip", " Lisbon "], "summary": "Planned a trip."}"#;
        let s = parse_summary(good).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.tags, vec!["trip", "Lisbon"]);
        assert_eq!(s.time_bucket_end.to_rfc3339(), "2024-05-01T11:00:00+00:00");
        assert_eq!(parse_summary(&format!("```json\n{good}\n```")).ok(), Some(s));
        let no_tags = r#"{"time_bucket_start": "2024-05-01 10:00:00+00", "time_bucket_end": "2024-05-01T10:00:00Z", "summary": "x"}"#;
        assert_eq!(parse_summary(no_tags).map(|s| s.tags.len()), Ok(0));
    }

    #[test]
    fn refuses_what_is_not_a_summary() {
        for bad in [
            "",
            "Here is the summary",
            "[]",
            r#"{"time_bucket_start": "yesterday", "time_bucket_end": "2024-05-01T10:00:00Z", "summary": "x"}"#,
            r#"{"time_bucket_start": "2024-05-02T10:00:00Z", "time_bucket_end": "2024-05-01T10:00:00Z", "summary": "x"}"#,
            r#"{"time_bucket_start": "2024-05-01T10:00:00Z", "time_bucket_end": "2024-05-01T10:00:00Z", "summary": ""}"#,
            r#"{"time_bucket_start": "2024-05-01T10:00:00Z", "time_bucket_end": "2024-05-01T10:00:00Z", "summary": "x", "tags": "a"}"#,
            r#"{"time_bucket_start": "2024-05-01T10:00:00Z", "time_bucket_end": "2024-05-01T10:00:00Z", "summary": "x", "tags": [1]}"#,
        ] {
            assert!(parse_summary(bad).is_err(), "{bad}");
        }
    }
}
