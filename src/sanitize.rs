//! What a provider's reply may carry into the database (invariant 9): the
//! text and JSON sanitiser shared by the stage results the dispatcher
//! writes and the records the archivist writes. Plain values only, so any
//! layer may use it.
//!
//! Guarantees:
//! - [`text`] leaves no NUL character (PostgreSQL `text` and `jsonb` refuse
//!   it; one such character used to fail a whole batch of results) and cuts
//!   at a bound in characters, so the text stays valid UTF-8;
//! - [`json`] does the same to every string and key of a JSON value and
//!   replaces values nested deeper than [`MAX_DEPTH`] by `null`;
//! - the bounds are the ones the schema checks (sql/0009): the answer and
//!   the context at [`MAX_ANSWER_CHARS`] and [`MAX_CONTEXT_CHARS`]
//!   characters, the model name at [`MAX_MODEL_CHARS`], error texts at
//!   [`MAX_ERROR_CHARS`], an analysis' strings at [`MAX_JSON_STRING_CHARS`]
//!   and the whole analysis at [`MAX_ANALYSIS_BYTES`] serialised.
//!
//! Every change is reported by kind ([`Poison`]), for the metric
//! `maas_poison_total`. How a whole stage result is sanitised (and refused
//! when its analysis cannot be stored) is the dispatcher's
//! (`dispatcher::sanitise_result`).

use serde_json::Value;

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

/// What the sanitiser did to one value or result.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Sanitised {
    /// Each kind of change made, once.
    pub found: Vec<Poison>,
    /// Why the result could not be stored as it was: the caller turns it
    /// into a failure of the request with this reason.
    pub refused: Option<String>,
}

impl Sanitised {
    /// Records that `p` was found (each kind once).
    pub fn note(&mut self, p: Poison) {
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
