//! The offline analyzer: the analysis JSON of the Analyzer prompt,
//! deterministic, labelled `"offline": true`.
//!
//! Guarantees (see also the module doc of [`offline`](super)):
//! - `needs_context` is true when the request holds LSM records (JSON
//!   objects with an `id` and a `summary`, anywhere in the system prompt or
//!   the messages: a whole message that is JSON, or a line of one), and
//!   also when the request says the user has earlier turns
//!   (`earlier_turns` > 0 in the JSON object of the last user message) and
//!   the query could use them ([`could_use_memory`]); otherwise false.
//!   `context_found` is the record sharing the most keywords (ties: the
//!   first listed).
//! - `time_scope` and a `period`/`recent` `context_type` come from
//!   [`timescope::find`], so every scope written is one
//!   [`Analysis::time_range`](crate::stage::Analysis::time_range) reads.
//! - Asking the user ([`vague`]): where the request says it may
//!   (`"may_ask_user": true`), a query with no content word — no word of
//!   four or more letters that is not a stop word or a number ("And that
//!   one?", "What about it?") — gets `clarify: {"question": …}`, the same
//!   question for the same query. A request that asked already
//!   (`clarification` in its input) searches with the words of its query
//!   and of the user's reply.

use serde_json::{Value, json};

use super::request::{parse_json_object, query_of, texts};
use super::words::could_use_memory;
use super::words::distinct_words;
use crate::llm::ChatRequest;
use crate::timescope;

/// An LSM record as the analyzer sees it.
struct Record {
    id: Value,
    text: String,
    period: Option<String>,
}

/// The records in a JSON value, depth first; an id seen before is skipped.
fn collect_records(value: &Value, out: &mut Vec<Record>) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| collect_records(v, out)),
        Value::Object(map) => {
            let id = map.get("id").filter(|id| id.is_number() || id.is_string());
            let summary = map.get("summary").and_then(Value::as_str);
            if let (Some(id), Some(summary)) = (id, summary) {
                if out.iter().any(|r| &r.id == id) {
                    return;
                }
                let tags = match map.get("tags") {
                    Some(Value::Array(tags)) => tags.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "),
                    Some(Value::String(tags)) => tags.clone(),
                    _ => String::new(),
                };
                let bound = |k: &str| map.get(k).and_then(Value::as_str);
                let period = match (bound("time_bucket_start"), bound("time_bucket_end")) {
                    (Some(s), Some(e)) => Some(format!("{s} – {e}")),
                    (Some(s), None) | (None, Some(s)) => Some(s.to_owned()),
                    (None, None) => None,
                };
                out.push(Record {
                    id: id.clone(),
                    text: format!("{summary} {tags}").to_lowercase(),
                    period,
                });
            } else {
                map.values().for_each(|v| collect_records(v, out));
            }
        }
        _ => {}
    }
}

/// Every record in the request's texts, in order.
fn records_of(req: &ChatRequest) -> Vec<Record> {
    let mut records = Vec::new();
    for text in texts(req) {
        if let Some(v) = parse_json_object(text) {
            collect_records(&v, &mut records);
        } else {
            for line in text.lines() {
                if let Some(v) = parse_json_object(line) {
                    collect_records(&v, &mut records);
                }
            }
        }
    }
    records
}

/// How many earlier turns the request says the user has: `earlier_turns`
/// in the JSON object of the last user message, 0 when absent.
fn earlier_turns(req: &ChatRequest) -> i64 {
    req.last_user_message()
        .and_then(parse_json_object)
        .and_then(|v| v.get("earlier_turns").and_then(Value::as_i64))
        .unwrap_or(0)
}

/// The JSON object of the last user message, if it is one.
fn input_object(req: &ChatRequest) -> Option<Value> {
    req.last_user_message().and_then(parse_json_object)
}

/// Whether a query is too vague to search: it holds no content word (no
/// word of four or more letters that is not a stop word or a number).
pub(crate) fn vague(query: &str) -> bool {
    distinct_words(query, 1).is_empty()
}

/// The question the offline analyzer asks about a vague `query`.
fn question_about(query: &str) -> String {
    format!("What do you mean by \"{query}\"? Tell me what it is about, so I can look it up.")
}

/// The analyzer's answer.
pub(crate) fn analyze(req: &ChatRequest) -> Value {
    let query = query_of(req);
    let input = input_object(req);
    let reply = input
        .as_ref()
        .and_then(|v| v.pointer("/clarification/reply"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let may_ask = input
        .as_ref()
        .and_then(|v| v.get("may_ask_user"))
        .and_then(Value::as_bool)
        == Some(true);
    let keywords = distinct_words(&format!("{query} {reply}"), 8);
    let records = records_of(req);
    let time = timescope::find(&query);

    let best = records
        .iter()
        .map(|r| (r, keywords.iter().filter(|k| r.text.contains(*k)).count()))
        .fold(None::<(&Record, usize)>, |best, (r, score)| match best {
            Some((_, top)) if top >= score => best,
            _ => Some((r, score)),
        });

    let (context_type, context_found) = match best {
        None => ("none", json!({"lsm_record_id": null, "period": null, "relevance": 0.0})),
        Some((record, score)) => {
            let relevance = if keywords.is_empty() {
                0.0
            } else {
                (score as f64 / keywords.len() as f64 * 100.0).round() / 100.0
            };
            let kind = if score > 0 { "topic" } else { "recent" };
            (
                kind,
                json!({"lsm_record_id": record.id, "period": record.period, "relevance": relevance}),
            )
        }
    };
    // Turns, not records, are what a newcomer has: search them when the
    // query could use them.
    let from_turns = records.is_empty() && earlier_turns(req) > 0 && (time.is_some() || could_use_memory(&query));
    let (context_type, time_scope) = match time {
        Some((kind, scope)) => (kind.as_str(), scope),
        None if from_turns => ("topic", "none".to_owned()),
        None => (context_type, "none".to_owned()),
    };
    let mut analysis = json!({
        "needs_context": !records.is_empty() || from_turns,
        "context_type": context_type,
        "time_scope": time_scope,
        "search_keywords": keywords,
        "context_found": context_found,
        "offline": true,
    });
    if may_ask
        && vague(&query)
        && let Some(obj) = analysis.as_object_mut()
    {
        obj.insert("clarify".into(), json!({"question": question_about(&query)}));
    }
    analysis
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;
    use crate::llm::Message;

    #[test]
    fn a_vague_query_is_asked_about_only_where_the_request_may_ask() {
        let ask = |query: &str, may: bool| {
            let body = json!({"user_query": query, "lsm_records": [], "earlier_turns": 0, "may_ask_user": may});
            analyze(&ChatRequest::new(None, body.to_string()))
        };
        for query in ["And that one?", "What about it?", "Is it?", "ok"] {
            assert!(vague(query), "{query}");
            let q = ask(query, true)["clarify"]["question"].as_str().map(str::to_owned);
            assert!(q.as_deref().is_some_and(|q| q.contains(query)), "{query}: {q:?}");
            assert_eq!(ask(query, false).get("clarify"), None, "{query}");
        }
        for query in ["Where did we travel in May?", "What is the capital of France?"] {
            assert!(!vague(query), "{query}");
            assert_eq!(ask(query, true).get("clarify"), None, "{query}");
        }
        let body = json!({"user_query": "And that one?", "lsm_records": [], "earlier_turns": 0,
                          "clarification": {"question": "Which?", "reply": "the Lisbon trip"}});
        let v = analyze(&ChatRequest::new(None, body.to_string()));
        assert_eq!(v.get("clarify"), None, "a request asks once");
        assert_eq!(v["search_keywords"], json!(["lisbon", "trip"]));
    }

    #[test]
    fn analysis_without_records_needs_no_context() {
        let req = ChatRequest::new(Some("You are the analyzer.".into()), "What is the capital of France?");
        let v = analyze(&req);
        assert_eq!(v["needs_context"], false);
        assert_eq!(v["context_type"], "none");
        assert_eq!(v["search_keywords"], json!(["capital", "france"]));
        assert_eq!(v["context_found"]["lsm_record_id"], Value::Null);
        assert_eq!(analyze(&req), v, "deterministic");
    }

    #[test]
    fn earlier_turns_and_a_query_that_could_use_them_need_context() {
        let ask = |query: &str, turns: i64| {
            let body = json!({"user_query": query, "lsm_records": [], "earlier_turns": turns});
            analyze(&ChatRequest::new(None, body.to_string()))
        };
        for query in [
            "Where is my sister moving?",
            "Куда переезжает моя сестра?",
            "Do you remember what I told you about the garden?",
            "What did we decide last week?",
            "How is Olga doing?",
            "When did I paint that sunrise?",
            "I'm moving next week, any tips?",
            "Что я говорил про сад?",
        ] {
            assert_eq!(ask(query, 3)["needs_context"], true, "{query}");
            assert_eq!(ask(query, 0)["needs_context"], false, "{query}: no earlier turns");
        }
        let v = ask("Where is my sister moving?", 3);
        assert_eq!(v["context_type"], "topic");
        assert_eq!(v["search_keywords"], json!(["sister", "moving"]));
        assert_eq!(ask("What is the capital of france?", 3)["needs_context"], false);
        assert_eq!(ask("Сколько будет два плюс два?", 3)["needs_context"], false);
    }

    #[test]
    fn analysis_picks_the_record_sharing_most_keywords() {
        let input = json!({
            "user_query": "What did we decide about the garden fence last week?",
            "lsm_records": [
                {"id": 7, "time_bucket_start": "2024-05-01T00:00:00Z", "time_bucket_end": "2024-05-02T00:00:00Z",
                 "tags": ["cooking"], "summary": "Talked about pasta."},
                {"id": 9, "time_bucket_start": "2024-05-03T00:00:00Z", "time_bucket_end": "2024-05-04T00:00:00Z",
                 "tags": ["garden"], "summary": "Decided to paint the fence green."}
            ]
        });
        let req = ChatRequest::new(None, input.to_string());
        let v = analyze(&req);
        assert_eq!(v["needs_context"], true);
        assert_eq!(v["context_type"], "period");
        assert_eq!(v["time_scope"], "last week");
        assert_eq!(v["context_found"]["lsm_record_id"], 9);
        assert_eq!(
            v["context_found"]["period"],
            "2024-05-03T00:00:00Z – 2024-05-04T00:00:00Z"
        );
        assert_eq!(
            v["search_keywords"],
            json!(["decide", "garden", "fence", "last", "week"])
        );
    }

    #[test]
    fn records_may_come_as_lines_of_the_system_prompt() {
        let mut req = ChatRequest::new(
            Some("Analyze.\nRecords:\n{\"id\": 3, \"summary\": \"User likes chamomile\", \"tags\": [\"tea\"]}".into()),
            "<current_query>Recommend herbal drinks like chamomile</current_query>",
        );
        req.messages.insert(0, Message::assistant("earlier"));
        let v = analyze(&req);
        assert_eq!(v["needs_context"], true);
        assert_eq!(v["context_type"], "topic");
        assert_eq!(v["context_found"]["lsm_record_id"], 3);
        assert_eq!(
            v["search_keywords"],
            json!(["recommend", "herbal", "drinks", "chamomile"])
        );
    }

    #[test]
    fn analysis_reads_the_querys_time() {
        let table: &[(&str, &str, &str)] = &[
            ("What did we decide last week?", "period", "last week"),
            ("What did I do in May 2023?", "period", "2023-05"),
            ("What happened on May 8, 2023?", "period", "2023-05-08"),
            ("What happened on the 8th of May 2023?", "period", "2023-05-08"),
            ("Remind me of 2023-05-08", "period", "2023-05-08"),
            ("Any notes from 2023-05?", "period", "2023-05"),
            ("What did I read in 2022?", "period", "2022"),
            ("Where did we go in summer 2023?", "period", "2023-06/2023-08"),
            ("What did I cook 3 days ago?", "period", "3 days ago"),
            ("What did I say two weeks ago?", "period", "two weeks ago"),
            ("Plans from the last 10 days", "period", "last 10 days"),
            ("Did I call mom yesterday?", "period", "yesterday"),
            ("Have I recently mentioned Lisbon?", "period", "recently"),
            ("Что я говорил вчера?", "period", "вчера"),
            ("Что мы решили на прошлой неделе?", "period", "на прошлой неделе"),
            ("Что было в мае 2023?", "period", "2023-05"),
            ("Что было 8 мая 2023 года?", "period", "2023-05-08"),
            ("Что я читал в 2022 году?", "period", "2022"),
            ("Что я писал за последние 3 дня?", "period", "последние 3 дня"),
            ("Что я сказал неделю назад?", "period", "неделю назад"),
            ("When did Caroline go to the support group?", "period", "none"),
            ("Когда я был в Лиссабоне?", "period", "none"),
            ("What did I just say?", "recent", "none"),
            ("What did we discuss earlier in this chat?", "recent", "none"),
            ("Что было в последнем сообщении?", "recent", "none"),
            ("What is the capital of France?", "none", "none"),
            ("May I ask about gardening?", "none", "none"),
            ("I paid 2022 euros for it", "none", "none"),
        ];
        let mut wrong = Vec::new();
        for (query, context_type, time_scope) in table {
            let v = analyze(&ChatRequest::new(None, *query));
            if v["context_type"] != *context_type || v["time_scope"] != *time_scope {
                wrong.push(format!("{query:?}: {} {}", v["context_type"], v["time_scope"]));
            }
            assert_eq!(analyze(&ChatRequest::new(None, *query)), v, "deterministic");
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
