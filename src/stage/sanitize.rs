//! What a provider's reply may carry into the database (invariant 9).
//!
//! Guarantees of [`result`], applied to every stage result before it is
//! written:
//! - no NUL character is left in any text or JSON string or key (PostgreSQL
//!   `text` and `jsonb` refuse it; one such character used to fail a whole
//!   batch of results): NULs are removed;
//! - every text is within the bound the schema checks (sql/0009): the answer
//!   and the context are cut at [`MAX_ANSWER_CHARS`] and
//!   [`MAX_CONTEXT_CHARS`] characters, the model name at
//!   [`MAX_MODEL_CHARS`], error texts at [`MAX_ERROR_CHARS`];
//! - the analysis is a JSON value nested at most [`MAX_DEPTH`] levels (deeper
//!   values become `null`) whose strings hold at most [`MAX_JSON_STRING_CHARS`]
//!   characters; an analysis still over [`MAX_ANALYSIS_BYTES`] serialised is
//!   refused: the result becomes a failure of that one request, with the
//!   reason ([`Sanitised::refused`]).
//!
//! Every change is reported by kind ([`Poison`]), for the metric
//! `maas_poison_total`. Cutting is on character boundaries, so the text
//! stays valid UTF-8.

use serde_json::Value;

use crate::repo::Finished;

/// The longest answer stored, in characters (`pipeline_runs_answer_size`,
/// `raw_logs_content_size`).
pub const MAX_ANSWER_CHARS: usize = 1_000_000;
/// The longest context stored, in characters (`pipeline_runs_context_size`).
pub const MAX_CONTEXT_CHARS: usize = 4_000_000;
/// The longest model name stored, in characters.
pub const MAX_MODEL_CHARS: usize = 200;
/// The longest error class and message stored, in characters.
pub const MAX_ERROR_CHARS: usize = 10_000;
/// The deepest nesting of an analysis kept.
pub const MAX_DEPTH: usize = 32;
/// The longest string (or key) inside an analysis, in characters.
pub const MAX_JSON_STRING_CHARS: usize = 20_000;
/// The largest analysis stored, serialised (`pipeline_runs_analysis_shape`).
pub const MAX_ANALYSIS_BYTES: usize = 500_000;

/// What was wrong with a reply (the `kind` label of `maas_poison_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Poison {
    /// A NUL character, removed.
    Nul,
    /// A text or string over its bound, cut.
    Oversize,
    /// JSON nested deeper than [`MAX_DEPTH`], cut.
    Nesting,
    /// An analysis too large to store: the request failed.
    Refused,
    /// A result the database refused although sanitised: it was written
    /// alone, as a failure (see the dispatcher's flush).
    Unwritable,
}

impl Poison {
    pub const ALL: [Poison; 5] = [
        Poison::Nul,
        Poison::Oversize,
        Poison::Nesting,
        Poison::Refused,
        Poison::Unwritable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Poison::Nul => "nul",
            Poison::Oversize => "oversize",
            Poison::Nesting => "nesting",
            Poison::Refused => "refused",
            Poison::Unwritable => "unwritable",
        }
    }
}

/// What [`result`] did to one stage result.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Sanitised {
    /// Each kind of change made, once.
    pub found: Vec<Poison>,
    /// Why the result could not be stored as it was: the caller turns it
    /// into a failure of the request with this reason.
    pub refused: Option<String>,
}

impl Sanitised {
    fn note(&mut self, p: Poison) {
        if !self.found.contains(&p) {
            self.found.push(p);
        }
    }
}

/// Removes NULs from `s` and cuts it at `max` characters; reports what it did.
pub fn text(s: &mut String, max: usize, out: &mut Sanitised) {
    if s.contains('\0') {
        s.retain(|c| c != '\0');
        out.note(Poison::Nul);
    }
    if let Some((cut, _)) = s.char_indices().nth(max) {
        s.truncate(cut);
        out.note(Poison::Oversize);
    }
}

/// Sanitises a JSON value in place: NULs removed from strings and keys,
/// strings cut, nesting below [`MAX_DEPTH`] replaced by `null`.
pub fn json(v: &mut Value, out: &mut Sanitised) {
    json_at(v, 0, out);
}

fn json_at(v: &mut Value, depth: usize, out: &mut Sanitised) {
    match v {
        Value::String(s) => text(s, MAX_JSON_STRING_CHARS, out),
        Value::Array(items) => {
            if depth >= MAX_DEPTH {
                *v = Value::Null;
                out.note(Poison::Nesting);
                return;
            }
            for item in items {
                json_at(item, depth + 1, out);
            }
        }
        Value::Object(map) => {
            if depth >= MAX_DEPTH {
                *v = Value::Null;
                out.note(Poison::Nesting);
                return;
            }
            let bad_keys = map
                .keys()
                .any(|k| k.contains('\0') || k.chars().nth(MAX_JSON_STRING_CHARS).is_some());
            if bad_keys {
                let old = std::mem::take(map);
                for (mut k, val) in old {
                    text(&mut k, MAX_JSON_STRING_CHARS, out);
                    map.insert(k, val);
                }
            }
            for item in map.values_mut() {
                json_at(item, depth + 1, out);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Sanitises every text and JSON value of a stage result (see the module
/// doc). The result is otherwise unchanged; when [`Sanitised::refused`] is
/// set the caller must not write its outputs.
pub fn result(f: &mut Finished) -> Sanitised {
    let mut out = Sanitised::default();
    for (s, max) in [
        (f.answer.as_mut(), MAX_ANSWER_CHARS),
        (f.context.as_mut(), MAX_CONTEXT_CHARS),
        (f.model.as_mut(), MAX_MODEL_CHARS),
        (f.error_class.as_mut(), MAX_ERROR_CHARS),
        (f.error_message.as_mut(), MAX_ERROR_CHARS),
    ] {
        if let Some(s) = s {
            text(s, max, &mut out);
        }
    }
    if let Some(fused) = f.fused.as_mut() {
        text(&mut fused.context, MAX_CONTEXT_CHARS, &mut out);
        if let Some(v) = fused.context_sources.as_mut() {
            json(v, &mut out);
        }
    }
    if let Some(v) = f.context_sources.as_mut() {
        json(v, &mut out);
    }
    if let Some(v) = f.analysis.as_mut() {
        json(v, &mut out);
        let size = serde_json::to_vec(v).map_or(usize::MAX, |b| b.len());
        if size > MAX_ANALYSIS_BYTES {
            out.note(Poison::Refused);
            out.refused = Some(format!(
                "the analysis is {size} bytes as JSON, more than the {MAX_ANALYSIS_BYTES} that are stored"
            ));
        } else if !v.is_object() {
            out.note(Poison::Refused);
            out.refused = Some("the analysis is not a JSON object".to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_is_removed_and_reported() {
        let mut out = Sanitised::default();
        let mut s = "a\0b\0".to_owned();
        text(&mut s, 10, &mut out);
        assert_eq!(s, "ab");
        assert_eq!(out.found, vec![Poison::Nul]);
    }

    #[test]
    fn text_is_cut_on_a_character_boundary() {
        let mut out = Sanitised::default();
        let mut s = "ééééé".to_owned();
        text(&mut s, 3, &mut out);
        assert_eq!(s, "ééé");
        assert_eq!(out.found, vec![Poison::Oversize]);
        let mut fine = "abc".to_owned();
        let mut clean = Sanitised::default();
        text(&mut fine, 3, &mut clean);
        assert_eq!(fine, "abc");
        assert!(clean.found.is_empty());
    }

    #[test]
    fn json_strings_and_keys_lose_nul_and_deep_nesting_is_cut() {
        let mut out = Sanitised::default();
        let mut deep = json!(1);
        for _ in 0..(MAX_DEPTH + 5) {
            deep = json!([deep]);
        }
        let mut v = json!({"k\u{0}ey": "v\u{0}al", "deep": deep});
        json(&mut v, &mut out);
        assert_eq!(v["key"], "val");
        assert!(out.found.contains(&Poison::Nul));
        assert!(out.found.contains(&Poison::Nesting));
        assert!(!serde_json::to_string(&v).unwrap_or_default().contains("\\u0000"));
    }
}
