//! The analyze stage: the active `Analyzer` prompt, the user's own recent
//! memory and how many earlier turns the user has (`earlier_turns`: a
//! newcomer has turns before any LSM record, and the analysis may ask for
//! the search over them), the analyzer model; strict parsing into an
//! [`Analysis`].
//!
//! Asking the user: only where the request may ask ([`Clarify::MayAsk`]),
//! the input says `"may_ask_user": true` and the analysis may carry
//! `clarify: {"question": …}`; anywhere else a question is dropped. A
//! request that asked gets `"clarification": {"question", "reply"}`, with
//! `reply` null and a `note` when the user did not reply in time; it does
//! not ask again (a request asks at most once).

use serde_json::{Value, json};

use super::analysis::Analysis;
use super::{StageError, StageInput, StageOutput, StageSuccess, Usage, from_llm};
use crate::error::Disposition;
use crate::llm::{ChatRequest, Llm, LlmDisposition, Role};
use crate::model::{Clarify, MemoryRecord, PromptRole};

/// Invalid model output gets exactly one retry.
pub const INVALID_JSON_ATTEMPTS: u32 = crate::llm::INVALID_OUTPUT_ATTEMPTS;

pub async fn run(llm: &Llm, input: &StageInput) -> Result<StageSuccess, StageError> {
    let Some(prompt) = input.prompts.get(PromptRole::Analyzer).map(str::to_owned) else {
        return Err(StageError::fail(
            "no_prompt",
            format!("no active {} prompt in system_prompts", PromptRole::Analyzer),
        ));
    };
    let mut memory: &[MemoryRecord] = &input.memory;
    loop {
        let mut body = json!({
            "user_query": input.user_query,
            "lsm_records": memory.iter().map(|m| json!({
                "id": m.id,
                "time_bucket_start": m.time_bucket_start,
                "time_bucket_end": m.time_bucket_end,
                "tags": m.tags,
                "summary": m.summary,
            })).collect::<Vec<_>>(),
            "earlier_turns": input.earlier_turns,
        });
        add_clarify(&mut body, &input.clarify);
        let req = ChatRequest::new(Some(prompt.clone()), body.to_string()).json();
        match llm.chat(Role::Analyzer, req).await {
            Ok(resp) => {
                let usage = Usage {
                    model: Some(resp.model.clone()),
                    prompt_tokens: resp.prompt_tokens,
                    completion_tokens: resp.completion_tokens,
                };
                return match Analysis::parse(&resp.text) {
                    Ok(analysis) => {
                        let analysis = match &input.clarify {
                            Clarify::MayAsk => analysis,
                            Clarify::Off => analysis.without_question(),
                            Clarify::Asked { question, reply } => analysis
                                .without_question()
                                .with_clarification(question, reply.as_deref()),
                        };
                        super::metrics::analysis(&analysis);
                        Ok(StageSuccess {
                            output: StageOutput::Analysis(analysis.to_json()),
                            usage,
                            context_sources: None,
                        })
                    }
                    Err(problem) => Err(StageError {
                        class: "invalid_json".into(),
                        message: format!("the analyzer's output was not valid JSON: {problem}"),
                        disposition: Disposition::Retry {
                            after: None,
                            max_attempts: Some(INVALID_JSON_ATTEMPTS),
                        },
                        usage,
                    }),
                };
            }
            // Too long for the model: keep the newest half of the memory.
            Err(e) if e.disposition() == LlmDisposition::TokenLimit && !memory.is_empty() => {
                memory = &memory[..memory.len() / 2];
            }
            Err(e) => return Err(from_llm(e, llm, Role::Analyzer)),
        }
    }
}

/// What the analyzer's input says of asking the user (see the module doc);
/// nothing where asking is off, so its input is as it always was.
fn add_clarify(body: &mut Value, clarify: &Clarify) {
    let Some(obj) = body.as_object_mut() else { return };
    match clarify {
        Clarify::Off => {}
        Clarify::MayAsk => {
            obj.insert("may_ask_user".into(), Value::Bool(true));
        }
        Clarify::Asked { question, reply } => {
            let mut c = json!({"question": question, "reply": reply});
            if reply.is_none()
                && let Some(c) = c.as_object_mut()
            {
                c.insert(
                    "note".into(),
                    json!("the user did not reply to this question in time: answer without the reply"),
                );
            }
            obj.insert("clarification".into(), c);
        }
    }
}

/// Parses and validates the analysis ([`Analysis::parse`]) and returns the
/// JSON stored for it ([`Analysis::to_json`]).
pub fn parse_analysis(text: &str) -> Result<Value, String> {
    Analysis::parse(text).map(|a| a.to_json())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"needs_context": true, "context_type": "topic", "time_scope": "last week",
        "search_keywords": ["trip", "Lisbon"], "context_found": {"lsm_record_id": 7, "period": "May", "relevance": 0.8}}"#;

    #[test]
    fn accepts_plain_and_fenced_json() {
        let plain = parse_analysis(GOOD).unwrap_or_default();
        assert_eq!(plain["context_found"]["lsm_record_id"], 7);
        let fenced = parse_analysis(&format!("```json\n{GOOD}\n```")).unwrap_or_default();
        assert_eq!(fenced, plain);
        let bare_fence = parse_analysis(&format!("```\n{GOOD}\n```")).unwrap_or_default();
        assert_eq!(bare_fence, plain);
    }

    #[test]
    fn normalises_optional_fields() {
        let v = parse_analysis(r#"{"needs_context": false, "context_type": "none"}"#).unwrap_or_default();
        assert_eq!(v["search_keywords"], json!([]));
        assert_eq!(v["context_found"], Value::Null);
        assert_eq!(v["time_scope"], "none");
        let v = parse_analysis(
            r#"{"needs_context": true, "context_type": "topic", "context_found": {"lsm_record_id": "12"}}"#,
        )
        .unwrap_or_default();
        assert_eq!(v["context_found"]["lsm_record_id"], 12);
    }

    #[test]
    fn refuses_what_is_not_an_analysis() {
        for bad in [
            "",
            "Sure! Here is the analysis:",
            "[1, 2]",
            r#"{"needs_context": "yes", "context_type": "topic"}"#,
            r#"{"needs_context": true}"#,
            r#"{"needs_context": true, "context_type": "x", "search_keywords": "trip"}"#,
            r#"{"needs_context": true, "context_type": "x", "context_found": {"lsm_record_id": "seven"}}"#,
            r#"{"needs_context": true, "context_type": "x", "context_found": 5}"#,
        ] {
            assert!(parse_analysis(bad).is_err(), "{bad}");
        }
    }
}
