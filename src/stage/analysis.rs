//! The analyzer's result, typed: what the analyze stage produces, what the
//! assemble stage reads and what decides whether the two can be fused.
//!
//! Guarantees:
//! - An [`Analysis`] exists only validated: [`Analysis::parse`] (model
//!   output) and [`Analysis::from_json`] (a stored analysis) apply the same
//!   rules — `needs_context` a boolean, `context_type` a string,
//!   `time_scope` a string (absent or null: `"none"`), `search_keywords`
//!   strings (absent or null: none), `context_found` an object or null whose
//!   `lsm_record_id` is an integer, a string holding one, or null;
//!   `clarify` absent, null, or an object whose `question` is a non-empty
//!   string (the analyzer asks the user that before it goes on).
//! - `sub_queries` (at most [`MAX_SUB_QUERIES`] texts of at most
//!   [`MAX_SUB_QUERY_CHARS`] characters) and `entities` (at most
//!   [`MAX_ENTITIES`] of at most [`MAX_ENTITY_CHARS`]) are optional: absent,
//!   null or blank items give none. A value of the wrong type or over a
//!   bound refuses that field alone — logged with the field's name and the
//!   limit ([`texts_field`]) — and the analysis stands without it: never a
//!   failed request over an aid to the search.
//! - [`Analysis::to_json`] is exactly the JSON stored in
//!   `pipeline_runs.analysis`: the five keys, normalised as above, with
//!   every other field of `context_found` kept as the model gave it and
//!   `lsm_record_id` always present there, `clarify` only when the
//!   analysis asks, and `clarification` (`{"question", "reply"}`, reply
//!   null when the user did not reply) only for a request that asked
//!   already: the stages after the analyzer read the exchange from it
//!   ([`Analysis::query_with_exchange`]); `sub_queries` and `entities` only
//!   when there are some (so an analysis without them is stored as it
//!   always was). `from_json(&a.to_json()) == a`.
//!   When the query was embedded during the analyze stage and the analysis
//!   asks for context, the stored JSON also keeps that embedding
//!   ([`keep_query_embedding`]: a sixth key, `query_embedding`, which
//!   [`Analysis::from_json`] ignores), so an assemble stage claimed on its
//!   own searches with it instead of embedding the query again
//!   ([`kept_query_embedding`]).
//! - [`Analysis::time_range`] is a pure function of `time_scope` and the
//!   request's time, never panics, and returns a non-empty half-open range
//!   or `None`.
//! - Nothing outside `stage` reads the analysis JSON: the dispatcher only
//!   passes it along and asks [`Pipeline::fuse_assemble`](super::Pipeline::fuse_assemble).

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use crate::llm::text::strip_fence;
use crate::model::MemoryRecord;

/// The analysis of one request's query.
#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    needs_context: bool,
    context_type: String,
    time_scope: String,
    search_keywords: Vec<String>,
    context_found: Option<ContextFound>,
    /// The question the analyzer asks the user before it goes on.
    question: Option<String>,
    /// The question a request asked already, and the user's reply (`None`:
    /// the wait expired without one).
    clarification: Option<(String, Option<String>)>,
    /// Further search texts, searched beside the query.
    sub_queries: Vec<String>,
    /// Names, places and titles the query is about.
    entities: Vec<String>,
}

/// Most sub-queries an analysis may carry.
pub const MAX_SUB_QUERIES: usize = 4;
/// Most characters of one sub-query.
pub const MAX_SUB_QUERY_CHARS: usize = 200;
/// Most entities an analysis may carry.
pub const MAX_ENTITIES: usize = 8;
/// Most characters of one entity.
pub const MAX_ENTITY_CHARS: usize = 100;

/// The optional list of texts `name` of an analysis: absent or null gives
/// none, items are trimmed and blank ones dropped; an error (naming the
/// field, and the limit it broke) when it is not an array of strings, has
/// more than `most` items or an item longer than `chars` characters.
pub fn texts_field(obj: &Map<String, Value>, name: &str, most: usize, chars: usize) -> Result<Vec<String>, String> {
    let items = match obj.get(name) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(format!("{name} must be an array of strings, not {}", kind(other))),
    };
    if items.len() > most {
        return Err(format!(
            "{name} holds {} items, more than the {most} allowed",
            items.len()
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Some(text) = item.as_str() else {
            return Err(format!("{name}[{i}] must be a string, not {}", kind(item)));
        };
        let text = text.trim();
        let n = text.chars().count();
        if n > chars {
            return Err(format!("{name}[{i}] has {n} characters, more than the {chars} allowed"));
        }
        if !text.is_empty() {
            out.push(text.to_owned());
        }
    }
    Ok(out)
}

/// The question of `clarify`: absent or null, or an object whose
/// `question` is a non-empty string (trimmed).
fn clarify_of(obj: &Map<String, Value>) -> Result<Option<String>, String> {
    match obj.get("clarify") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(c)) => match c.get("question") {
            Some(Value::String(q)) if !q.trim().is_empty() => Ok(Some(q.trim().to_owned())),
            _ => Err("clarify.question must be a non-empty string".into()),
        },
        Some(_) => Err("clarify must be an object or null".into()),
    }
}

/// The question and reply of `clarification`: absent or null, or an
/// object with a question and a reply (a string or null).
fn clarification_of(obj: &Map<String, Value>) -> Result<Option<(String, Option<String>)>, String> {
    match obj.get("clarification") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(c)) => match (c.get("question"), c.get("reply")) {
            (Some(Value::String(q)), Some(Value::String(r))) => Ok(Some((q.clone(), Some(r.clone())))),
            (Some(Value::String(q)), None | Some(Value::Null)) => Ok(Some((q.clone(), None))),
            _ => Err("clarification must hold a question and a reply (a string or null)".into()),
        },
        Some(_) => Err("clarification must be an object or null".into()),
    }
}

/// A JSON value's kind, for a refusal.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// [`texts_field`], a refusal logged and taken as none.
fn texts_or_none(obj: &Map<String, Value>, name: &str, most: usize, chars: usize) -> Vec<String> {
    texts_field(obj, name, most, chars).unwrap_or_else(|problem| {
        tracing::warn!(field = name, %problem, "the analysis' {name} were refused; the request goes on without them");
        Vec::new()
    })
}

/// The memory record the analyzer found relevant, if it named one.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextFound {
    record_id: Option<i64>,
    /// The object as stored: the model's fields, `lsm_record_id` normalised.
    fields: Map<String, Value>,
}

impl ContextFound {
    /// The `lsm_storage` id it refers to, if any.
    pub fn record_id(&self) -> Option<i64> {
        self.record_id
    }

    /// Every field as stored (`lsm_record_id` included; `period`,
    /// `relevance` and the like as the model gave them).
    pub fn fields(&self) -> &Map<String, Value> {
        &self.fields
    }
}

impl Analysis {
    /// Parses model output: one JSON object, possibly inside a fenced code
    /// block, validated as described in the module doc.
    pub fn parse(text: &str) -> Result<Analysis, String> {
        let body = strip_fence(text.trim());
        let v: Value = serde_json::from_str(body).map_err(|e| format!("{e} (in {} bytes)", text.len()))?;
        Analysis::from_json(&v)
    }

    /// Validates a JSON value (a stored analysis, or a parsed answer).
    pub fn from_json(v: &Value) -> Result<Analysis, String> {
        let Some(obj) = v.as_object() else {
            return Err("expected a JSON object".into());
        };
        let needs_context = obj
            .get("needs_context")
            .and_then(Value::as_bool)
            .ok_or("needs_context must be true or false")?;
        let context_type = obj
            .get("context_type")
            .and_then(Value::as_str)
            .ok_or("context_type must be a string")?
            .to_owned();
        let time_scope = match obj.get("time_scope") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => "none".into(),
            Some(_) => return Err("time_scope must be a string".into()),
        };
        let search_keywords = match obj.get("search_keywords") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|k| k.as_str().map(str::to_owned).ok_or("search_keywords must be strings"))
                .collect::<Result<Vec<_>, _>>()?,
            Some(Value::Null) | None => Vec::new(),
            Some(_) => return Err("search_keywords must be an array of strings".into()),
        };
        let context_found = match obj.get("context_found") {
            None | Some(Value::Null) => None,
            Some(Value::Object(found)) => {
                let record_id = match found.get("lsm_record_id") {
                    None | Some(Value::Null) => None,
                    Some(Value::Number(n)) if n.as_i64().is_some() => n.as_i64(),
                    Some(Value::String(s)) if s.parse::<i64>().is_ok() => s.parse::<i64>().ok(),
                    Some(_) => return Err("context_found.lsm_record_id must be an integer or null".into()),
                };
                let mut fields = found.clone();
                fields.insert("lsm_record_id".into(), json!(record_id));
                Some(ContextFound { record_id, fields })
            }
            Some(_) => return Err("context_found must be an object or null".into()),
        };
        let (question, clarification) = (clarify_of(obj)?, clarification_of(obj)?);
        Ok(Analysis {
            needs_context,
            context_type,
            time_scope,
            search_keywords,
            context_found,
            question,
            clarification,
            sub_queries: texts_or_none(obj, "sub_queries", MAX_SUB_QUERIES, MAX_SUB_QUERY_CHARS),
            entities: texts_or_none(obj, "entities", MAX_ENTITIES, MAX_ENTITY_CHARS),
        })
    }

    /// The JSON stored in `pipeline_runs.analysis` (see the module doc).
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "needs_context": self.needs_context,
            "context_type": self.context_type,
            "time_scope": self.time_scope,
            "search_keywords": self.search_keywords,
            "context_found": self.context_found.as_ref().map_or(Value::Null, |f| Value::Object(f.fields.clone())),
        });
        if let Some(obj) = v.as_object_mut() {
            if let Some(q) = &self.question {
                obj.insert("clarify".into(), json!({"question": q}));
            }
            if let Some((q, r)) = &self.clarification {
                obj.insert("clarification".into(), json!({"question": q, "reply": r}));
            }
            if !self.sub_queries.is_empty() {
                obj.insert("sub_queries".into(), json!(self.sub_queries));
            }
            if !self.entities.is_empty() {
                obj.insert("entities".into(), json!(self.entities));
            }
        }
        v
    }

    /// The same analysis, recording that the request asked `question` and
    /// got `reply` (`None`: no reply in time).
    pub fn with_clarification(mut self, question: &str, reply: Option<&str>) -> Analysis {
        self.clarification = Some((question.to_owned(), reply.map(str::to_owned)));
        self
    }

    /// The query the stages after the analyzer answer: `query` itself, or,
    /// for a request that asked its user, the query followed by the
    /// question and the reply (or that the user did not reply).
    pub fn query_with_exchange(&self, query: &str) -> String {
        match &self.clarification {
            None => query.to_owned(),
            Some((q, Some(r))) => format!("{query}\n\n[The assistant asked: {q}]\n[The user replied: {r}]"),
            Some((q, None)) => {
                format!(
                    "{query}\n\n[The assistant asked: {q}]\n[The user did not reply in time; answer as well as possible]"
                )
            }
        }
    }

    /// The question the analyzer asks the user, if it asks.
    pub fn question(&self) -> Option<&str> {
        self.question.as_deref()
    }

    /// The same analysis without a question (the request may not ask).
    pub fn without_question(mut self) -> Analysis {
        self.question = None;
        self
    }

    /// Whether the query needs long-term memory.
    pub fn needs_context(&self) -> bool {
        self.needs_context
    }

    /// The kind of context the analyzer asked for (the prompt's words).
    pub fn context_type(&self) -> &str {
        &self.context_type
    }

    /// The period the query is about; `"none"` when it named none.
    pub fn time_scope(&self) -> &str {
        &self.time_scope
    }

    /// Words to search memory with; empty when it gave none.
    pub fn search_keywords(&self) -> &[String] {
        &self.search_keywords
    }

    /// Further search texts the analyzer gave (at most
    /// [`MAX_SUB_QUERIES`]); empty when it gave none.
    pub fn sub_queries(&self) -> &[String] {
        &self.sub_queries
    }

    /// The names, places and titles the query is about (at most
    /// [`MAX_ENTITIES`]); empty when it gave none.
    pub fn entities(&self) -> &[String] {
        &self.entities
    }

    /// The record the analyzer found relevant, if any.
    pub fn context_found(&self) -> Option<&ContextFound> {
        self.context_found.as_ref()
    }

    /// The `lsm_storage` id of the record it found, if any.
    pub fn record_id(&self) -> Option<i64> {
        self.context_found.as_ref().and_then(ContextFound::record_id)
    }

    /// Whether the assemble stage can run on `memory` (the records the
    /// claim read for the analyzer): it refers to no record, or to one of
    /// them.
    pub fn assembles_from(&self, memory: &[MemoryRecord]) -> bool {
        self.record_id().is_none_or(|id| memory.iter().any(|m| m.id == id))
    }

    /// The period `time_scope` names, as a half-open UTC range
    /// `[start, end)`; `now` is the request's time, which decides relative
    /// phrases. `None` when it names no period. The forms read are those of
    /// [`timescope::range`](crate::timescope::range()).
    pub fn time_range(&self, now: DateTime<Utc>) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        crate::timescope::range(&self.time_scope, now)
    }
}

/// The question a stored analysis asks the user, if it is a valid analysis
/// that asks ([`Analysis::question`]): what the dispatcher asks with.
pub fn question_of(stored: &Value) -> Option<String> {
    Analysis::from_json(stored).ok()?.question.filter(|q| !q.is_empty())
}

/// The key of the stored analysis that keeps the query's embedding.
const QUERY_EMBEDDING: &str = "query_embedding";

/// Adds the query's `embedding` (made by `model` during the analyze stage)
/// to `stored`, the analysis JSON, when that analysis asks for context (the
/// assemble stage searches with it then); otherwise, or when `stored` is
/// not an analysis, leaves it as it is. The vector is kept exactly (JSON
/// numbers read back as the same `f32`s): a search with it ranks as one
/// with the query embedded again.
pub fn keep_query_embedding(stored: &mut Value, embedding: &[f32], model: &str) {
    let asks = Analysis::from_json(stored).is_ok_and(|a| a.needs_context());
    if let (true, Some(obj)) = (asks, stored.as_object_mut()) {
        obj.insert(QUERY_EMBEDDING.into(), json!({"model": model, "vector": embedding}));
    }
}

/// The query's embedding and its model kept in a stored analysis
/// ([`keep_query_embedding`]); `None` when it holds none or one of another
/// shape.
#[allow(clippy::cast_possible_truncation, reason = "the numbers were written from f32s")]
pub fn kept_query_embedding(stored: &Value) -> Option<(Vec<f32>, String)> {
    let kept = stored.get(QUERY_EMBEDDING)?;
    let model = kept.get("model")?.as_str()?.to_owned();
    let vector = kept
        .get("vector")?
        .as_array()?
        .iter()
        .map(|x| x.as_f64().map(|x| x as f32))
        .collect::<Option<Vec<f32>>>()?;
    (!vector.is_empty()).then_some((vector, model))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_embedding_is_kept_exactly_and_only_when_context_is_asked_for() {
        let v = vec![0.6_f32, -0.8, 1.0e-7, 0.123_456_79];
        let mut asks = Analysis::parse(r#"{"needs_context": true, "context_type": "topic"}"#)
            .unwrap_or_else(|e| panic!("{e}"))
            .to_json();
        keep_query_embedding(&mut asks, &v, "m");
        assert_eq!(kept_query_embedding(&asks), Some((v.clone(), "m".to_owned())));
        let again = Analysis::from_json(&asks).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            again.to_json().get(QUERY_EMBEDDING),
            None,
            "the analysis itself is unchanged"
        );

        let mut plain = Analysis::parse(r#"{"needs_context": false, "context_type": "none"}"#)
            .unwrap_or_else(|e| panic!("{e}"))
            .to_json();
        let before = plain.clone();
        keep_query_embedding(&mut plain, &v, "m");
        assert_eq!(plain, before, "no search, nothing kept");
        assert_eq!(kept_query_embedding(&plain), None);
        assert_eq!(
            kept_query_embedding(&json!({QUERY_EMBEDDING: {"model": "m", "vector": ["x"]}})),
            None
        );
    }

    #[test]
    fn round_trips_through_the_stored_json() {
        let text = r#"{"needs_context": true, "context_type": "topic", "time_scope": "last week",
            "search_keywords": ["trip"], "context_found": {"lsm_record_id": "7", "period": "May"}}"#;
        let a = Analysis::parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.record_id(), Some(7));
        assert_eq!(a.search_keywords(), ["trip"]);
        assert_eq!(a.time_scope(), "last week");
        assert!(a.needs_context());
        let stored = a.to_json();
        assert_eq!(stored["context_found"], json!({"lsm_record_id": 7, "period": "May"}));
        assert_eq!(Analysis::from_json(&stored).ok(), Some(a));
    }

    #[test]
    fn a_question_is_kept_only_when_asked() {
        let a = Analysis::parse(
            r#"{"needs_context": false, "context_type": "none", "clarify": {"question": " Which trip? "}}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.question(), Some("Which trip?"));
        let stored = a.to_json();
        assert_eq!(stored["clarify"], json!({"question": "Which trip?"}));
        assert_eq!(question_of(&stored).as_deref(), Some("Which trip?"));
        assert_eq!(Analysis::from_json(&stored).ok(), Some(a.clone()));
        let quiet = a.without_question().to_json();
        assert_eq!(quiet.get("clarify"), None);
        assert_eq!(question_of(&quiet), None);
        let answered = Analysis::from_json(&quiet)
            .unwrap_or_else(|e| panic!("{e}"))
            .with_clarification("Which trip?", Some("Lisbon"));
        let stored = answered.to_json();
        assert_eq!(
            stored["clarification"],
            json!({"question": "Which trip?", "reply": "Lisbon"})
        );
        assert_eq!(Analysis::from_json(&stored).ok(), Some(answered.clone()));
        let q = answered.query_with_exchange("where?");
        assert!(
            q.starts_with("where?") && q.contains("Which trip?") && q.contains("Lisbon"),
            "{q}"
        );
        let unanswered = Analysis::from_json(&quiet)
            .unwrap_or_else(|e| panic!("{e}"))
            .with_clarification("Which trip?", None);
        assert!(unanswered.query_with_exchange("where?").contains("did not reply"));
        for bad in [r#"{"question": ""}"#, r#"{"question": 3}"#, r#""ask""#] {
            let text = format!(r#"{{"needs_context": false, "context_type": "none", "clarify": {bad}}}"#);
            assert!(Analysis::parse(&text).is_err(), "{text}");
        }
    }

    #[test]
    fn sub_queries_and_entities_are_kept_trimmed_and_stored_only_when_given() {
        let a = Analysis::parse(
            r#"{"needs_context": true, "context_type": "topic",
                "sub_queries": [" John trip Seattle ", "", "John visited Paris"], "entities": ["John", "Paris"]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.sub_queries(), ["John trip Seattle", "John visited Paris"]);
        assert_eq!(a.entities(), ["John", "Paris"]);
        let stored = a.to_json();
        assert_eq!(
            stored["sub_queries"],
            json!(["John trip Seattle", "John visited Paris"])
        );
        assert_eq!(Analysis::from_json(&stored).ok(), Some(a));
        let none = Analysis::parse(r#"{"needs_context": true, "context_type": "topic", "sub_queries": null}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(none.sub_queries().is_empty() && none.entities().is_empty());
        let stored = none.to_json();
        assert_eq!((stored.get("sub_queries"), stored.get("entities")), (None, None));
    }

    #[test]
    fn a_bad_sub_queries_or_entities_field_is_refused_alone_naming_it() {
        let long = "x".repeat(MAX_SUB_QUERY_CHARS + 1);
        let cases = [
            (
                r#""sub_queries": "John Paris""#,
                "sub_queries must be an array of strings, not a string",
            ),
            (
                r#""sub_queries": ["a", "b", "c", "d", "e"]"#,
                "sub_queries holds 5 items, more than the 4 allowed",
            ),
            (
                r#""sub_queries": ["a", 7]"#,
                "sub_queries[1] must be a string, not a number",
            ),
            (
                &*format!(r#""sub_queries": ["{long}"]"#),
                "sub_queries[0] has 201 characters, more than the 200 allowed",
            ),
            (
                r#""entities": {"name": "John"}"#,
                "entities must be an array of strings, not an object",
            ),
            (
                r#""entities": ["1","2","3","4","5","6","7","8","9"]"#,
                "entities holds 9 items, more than the 8 allowed",
            ),
        ];
        for (field, problem) in cases {
            let text =
                format!(r#"{{"needs_context": true, "context_type": "topic", "search_keywords": ["trip"], {field}}}"#);
            let obj: Map<String, Value> = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
            let name = if field.contains("sub_queries") {
                "sub_queries"
            } else {
                "entities"
            };
            let (most, chars) = if name == "entities" {
                (MAX_ENTITIES, MAX_ENTITY_CHARS)
            } else {
                (MAX_SUB_QUERIES, MAX_SUB_QUERY_CHARS)
            };
            assert_eq!(texts_field(&obj, name, most, chars), Err(problem.to_owned()), "{text}");
            // The analysis stands without the field.
            let a = Analysis::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(a.sub_queries().is_empty() && a.entities().is_empty(), "{text}");
            assert_eq!(a.search_keywords(), ["trip"]);
            assert!(a.needs_context());
        }
    }

    #[test]
    fn stored_json_keeps_its_shape() {
        let a =
            Analysis::parse(r#"{"needs_context": false, "context_type": "none"}"#).unwrap_or_else(|e| panic!("{e}"));
        // Byte for byte the JSON the analyzer has always stored.
        assert_eq!(a.to_json().to_string(), crate::llm::offline::analysis_example());
        let found = Analysis::parse(r#"{"needs_context": true, "context_type": "t", "context_found": {}}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(found.to_json()["context_found"], json!({"lsm_record_id": null}));
    }

    #[test]
    fn assembles_from_the_memory_it_was_given() {
        let mem = |id| MemoryRecord {
            id,
            time_bucket_start: chrono::DateTime::UNIX_EPOCH,
            time_bucket_end: chrono::DateTime::UNIX_EPOCH,
            tags: Vec::new(),
            summary: String::new(),
        };
        let none =
            Analysis::parse(r#"{"needs_context": false, "context_type": "none"}"#).unwrap_or_else(|e| panic!("{e}"));
        assert!(none.assembles_from(&[]));
        let seven =
            Analysis::parse(r#"{"needs_context": true, "context_type": "t", "context_found": {"lsm_record_id": 7}}"#)
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(seven.assembles_from(&[mem(3), mem(7)]));
        assert!(!seven.assembles_from(&[mem(3)]));
    }
}
