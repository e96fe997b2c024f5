//! The offline responder: `[offline] You asked: "<query>". …`, naming the
//! key terms and whether a history block (`<context_from_history>`) came
//! with the query. Deterministic; says that no language model was called.

use super::request::{between, query_of, texts};
use super::words::{distinct_words, excerpt};
use crate::llm::ChatRequest;

/// The responder's answer.
pub(crate) fn respond(req: &ChatRequest) -> String {
    let query = query_of(req);
    let mut answer = format!("[offline] You asked: \"{}\".", excerpt(&query, 300));
    let keywords = distinct_words(&query, 5);
    if !keywords.is_empty() {
        answer.push_str(&format!(" Key terms: {}.", keywords.join(", ")));
    }
    let history = texts(req).find_map(|t| between(t, "<context_from_history>", "</context_from_history>"));
    match history {
        Some(h) if !h.is_empty() => answer.push_str(&format!(
            " Your earlier conversations were consulted ({} characters of history).",
            h.chars().count()
        )),
        _ => answer.push_str(" No earlier conversations were consulted."),
    }
    answer.push_str(" This answer comes from the deterministic offline provider; no language model was called.");
    answer
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn respond_quotes_the_current_query() {
        let pie = "<system>Be helpful</system>\n<context_from_history>\nPeriod: May\nUser likes tea\n</context_from_history>\n<current_query>\nWhich green tea should I buy?\n</current_query>";
        let text = respond(&ChatRequest::new(None, pie));
        assert!(
            text.starts_with("[offline] You asked: \"Which green tea should I buy?\". Key terms: green."),
            "{text}"
        );
        assert!(text.contains("characters of history"));
        let quoted = "<current_query>\nIs &quot;A &amp; B&quot; &lt;b&gt;?\n</current_query>";
        let text = respond(&ChatRequest::new(Some("Be helpful".into()), quoted));
        assert!(
            text.starts_with("[offline] You asked: \"Is \"A & B\" <b>?\"."),
            "{text}"
        );
        let plain = respond(&ChatRequest::new(None, "hello there"));
        assert!(plain.contains("No earlier conversations"));
    }
}
