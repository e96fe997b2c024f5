//! The offline archivist: the Archivist prompt's JSON.
//!
//! Guarantees: `time_bucket_start` and `time_bucket_end` are the earliest
//! and latest timestamps of the input's messages (RFC 3339, whole seconds;
//! timestamps outside messages, such as period bounds, only when no message
//! has one; the current time when the input has none at all); `tags` are
//! the five most frequent keywords (`conversation` when there are none);
//! `summary` starts with `[offline]`. The same input and `now` always give
//! the same answer.

use chrono::{DateTime, NaiveDate, NaiveDateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

use super::request::parse_json_object;
use super::words::{excerpt, frequent_words};
use crate::llm::ChatRequest;

/// Whether a string is nothing but a timestamp.
fn is_timestamp(s: &str) -> bool {
    let s = s.trim();
    s.len() <= 40 && s.chars().all(|c| c.is_ascii_digit() || " -:.+TtZz".contains(c)) && !find_datetimes(s).is_empty()
}

/// Walks a JSON input: string leaves that are prose (no timestamps, no
/// message-type labels) go to `prose`; the timestamps of message objects
/// (objects with a `content` or `text` string) go to `times`. Timestamps
/// outside messages, such as the period bounds, are not the conversation's.
fn walk_archive_input<'a>(value: &'a Value, prose: &mut Vec<&'a str>, times: &mut Vec<DateTime<Utc>>) {
    match value {
        Value::String(s) if !is_timestamp(s) && !matches!(s.as_str(), "user_query" | "assistant_response") => {
            prose.push(s);
        }
        Value::Array(items) => items.iter().for_each(|v| walk_archive_input(v, prose, times)),
        Value::Object(map) => {
            let is_message = ["content", "text"]
                .iter()
                .any(|k| map.get(*k).is_some_and(Value::is_string));
            for v in map.values() {
                match v {
                    Value::String(s) if is_timestamp(s) => {
                        if is_message {
                            times.extend(find_datetimes(s));
                        }
                    }
                    _ => walk_archive_input(v, prose, times),
                }
            }
        }
        _ => {}
    }
}

/// The archivist's answer; `now` is the bucket when the input has no time.
pub(crate) fn archive(req: &ChatRequest, now: DateTime<Utc>) -> Value {
    let parsed: Vec<(Option<Value>, &str)> = req
        .messages
        .iter()
        .map(|m| (parse_json_object(&m.content), m.content.as_str()))
        .collect();
    let mut prose: Vec<&str> = Vec::new();
    let mut times: Vec<DateTime<Utc>> = Vec::new();
    for (json, text) in &parsed {
        match json {
            Some(v) => walk_archive_input(v, &mut prose, &mut times),
            None => prose.push(text),
        }
    }
    if times.is_empty() {
        times = parsed.iter().flat_map(|(_, t)| find_datetimes(t)).collect();
    }
    let joined = prose.join("\n");
    let start = times.iter().min().copied().unwrap_or(now);
    let end = times.iter().max().copied().unwrap_or(now);
    let mut tags = frequent_words(&joined, 5);
    if tags.is_empty() {
        tags.push("conversation".to_owned());
    }
    let summary = format!(
        "[offline] Conversation about {}: \"{}\"",
        tags.join(", "),
        excerpt(&joined, 200)
    );
    json!({
        "time_bucket_start": start.to_rfc3339_opts(SecondsFormat::Secs, true),
        "time_bucket_end": end.to_rfc3339_opts(SecondsFormat::Secs, true),
        "tags": tags,
        "summary": summary,
    })
}

/// Timestamps written anywhere in `text`: RFC 3339, PostgreSQL's text form
/// (`2024-05-01 10:00:00.123+00`), naive date-times (taken as UTC) and bare
/// dates (midnight UTC). For each date, the longest form that parses wins.
fn find_datetimes(text: &str) -> Vec<DateTime<Utc>> {
    const ZONED: [&str; 2] = ["%Y-%m-%dT%H:%M:%S%.f%#z", "%Y-%m-%d %H:%M:%S%.f%#z"];
    const NAIVE: [&str; 2] = ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"];
    let bytes = text.as_bytes();
    let is_date_at = |i: usize| {
        let pattern = b"dddd-dd-dd";
        bytes.len() >= i + pattern.len()
            && pattern
                .iter()
                .zip(&bytes[i..])
                .all(|(p, b)| if *p == b'd' { b.is_ascii_digit() } else { b == p })
            && (i == 0 || !bytes[i - 1].is_ascii_digit())
    };
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !is_date_at(i) {
            i += 1;
            continue;
        }
        // The candidate: ASCII characters a timestamp can contain.
        let end = bytes[i..]
            .iter()
            .take(40)
            .position(|b| !(b.is_ascii_digit() || b" -:.+TtZz".contains(b)))
            .map_or((i + 40).min(bytes.len()), |p| i + p);
        let candidate = &text[i..end];
        let parsed = (10..=candidate.len()).rev().find_map(|len| {
            let s = candidate[..len].trim_end();
            if s.len() != len {
                return None;
            }
            DateTime::parse_from_rfc3339(s)
                .ok()
                .or_else(|| ZONED.iter().find_map(|f| DateTime::parse_from_str(s, f).ok()))
                .map(|d| d.with_timezone(&Utc))
                .or_else(|| {
                    NAIVE
                        .iter()
                        .find_map(|f| NaiveDateTime::parse_from_str(s, f).ok())
                        .map(|n| n.and_utc())
                })
                .or_else(|| {
                    (len == 10)
                        .then(|| NaiveDate::parse_from_str(s, "%Y-%m-%d").ok())
                        .flatten()
                        .and_then(|d| d.and_hms_opt(0, 0, 0))
                        .map(|n| n.and_utc())
                })
                .map(|d| (d, len))
        });
        match parsed {
            Some((d, len)) => {
                found.push(d);
                i += len;
            }
            None => i += 10,
        }
    }
    found
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn finds_timestamps_in_every_common_form() {
        let text = r#"{"created_at":"2024-05-01T10:00:00Z"} then 2024-05-01 12:30:00.5+00 and
            2024-05-02T08:00:00 (naive), a date 2024-05-03, junk 2024-13-45, id 12024-05-01"#;
        let found: Vec<String> = find_datetimes(text)
            .iter()
            .map(|d| d.to_rfc3339_opts(SecondsFormat::Millis, true))
            .collect();
        assert_eq!(
            found,
            [
                "2024-05-01T10:00:00.000Z",
                "2024-05-01T12:30:00.500Z",
                "2024-05-02T08:00:00.000Z",
                "2024-05-03T00:00:00.000Z",
            ]
        );
    }

    #[test]
    fn archive_buckets_by_the_messages_times() {
        let input = json!({
            "start_date": "2024-05-01T00:00:00Z",
            "raw_logs": [
                {"message_type": "user_query", "content": "How do I prune tomato plants?", "created_at": "2024-05-01T10:00:00Z"},
                {"message_type": "assistant_response", "content": "Prune tomato suckers weekly.", "created_at": "2024-05-01T10:00:05Z"},
                {"message_type": "user_query", "content": "And tomato watering?", "created_at": "2024-05-02T09:00:00Z"}
            ]
        });
        let req = ChatRequest::new(Some("Archivist".into()), input.to_string());
        let now = Utc::now();
        let v = archive(&req, now);
        // The period bound (start_date) is not a message time.
        assert_eq!(v["time_bucket_start"], "2024-05-01T10:00:00Z");
        assert_eq!(v["time_bucket_end"], "2024-05-02T09:00:00Z");
        assert_eq!(v["tags"], json!(["tomato", "prune", "plants", "suckers", "weekly"]));
        let summary = v["summary"].as_str().unwrap();
        assert!(summary.starts_with("[offline] Conversation about tomato"), "{summary}");
        assert!(!summary.contains("user_query"));
        assert_eq!(archive(&req, now), v, "deterministic");
    }
}
