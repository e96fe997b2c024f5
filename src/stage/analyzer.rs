//! Step 1, the analyzer: the active `Analyzer` prompt, the user's own recent
//! memory, the analyzer model; strict parsing of the analysis JSON.

use serde_json::{Value, json};

use super::{StageError, StageInput, StageOutput, StageSuccess, Usage, from_llm};
use crate::error::Disposition;
use crate::llm::{ChatRequest, Llm, LlmDisposition, Role};
use crate::model::MemoryRecord;

/// Invalid model output gets exactly one retry.
pub const INVALID_JSON_ATTEMPTS: u32 = 2;

pub async fn run(llm: &Llm, input: &StageInput) -> Result<StageSuccess, StageError> {
    let Some(prompt) = input.prompts.analyzer.clone() else {
        return Err(StageError::fail(
            "no_prompt",
            "no active Analyzer prompt in system_prompts",
        ));
    };
    let mut memory: &[MemoryRecord] = &input.memory;
    loop {
        let body = json!({
            "user_query": input.user_query,
            "lsm_records": memory.iter().map(|m| json!({
                "id": m.id,
                "time_bucket_start": m.time_bucket_start,
                "time_bucket_end": m.time_bucket_end,
                "tags": m.tags,
                "summary": m.summary,
            })).collect::<Vec<_>>(),
        });
        let req = ChatRequest::new(Some(prompt.clone()), body.to_string()).json();
        match llm.chat(Role::Analyzer, req).await {
            Ok(resp) => {
                let usage = Usage {
                    model: Some(resp.model.clone()),
                    prompt_tokens: resp.prompt_tokens,
                    completion_tokens: resp.completion_tokens,
                };
                return match parse_analysis(&resp.text) {
                    Ok(analysis) => Ok(StageSuccess {
                        output: StageOutput::Analysis(analysis),
                        usage,
                    }),
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

/// Parses and validates the analysis: one JSON object, possibly inside a
/// fenced code block, with the five fields of the Analyzer prompt.
pub fn parse_analysis(text: &str) -> Result<Value, String> {
    let body = strip_fence(text.trim());
    let v: Value = serde_json::from_str(body).map_err(|e| format!("{e} (in {} bytes)", text.len()))?;
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
        .ok_or("context_type must be a string")?;
    let time_scope = match obj.get("time_scope") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "none".into(),
        Some(_) => return Err("time_scope must be a string".into()),
    };
    let keywords = match obj.get("search_keywords") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|k| k.as_str().map(str::to_owned).ok_or("search_keywords must be strings"))
            .collect::<Result<Vec<_>, _>>()?,
        Some(Value::Null) | None => Vec::new(),
        Some(_) => return Err("search_keywords must be an array of strings".into()),
    };
    let context_found = match obj.get("context_found") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::Object(found)) => {
            let id = match found.get("lsm_record_id") {
                None | Some(Value::Null) => Value::Null,
                Some(Value::Number(n)) if n.as_i64().is_some() => Value::Number(n.clone()),
                Some(Value::String(s)) if s.parse::<i64>().is_ok() => json!(s.parse::<i64>().ok()),
                Some(_) => return Err("context_found.lsm_record_id must be an integer or null".into()),
            };
            let mut found = found.clone();
            found.insert("lsm_record_id".into(), id);
            Value::Object(found)
        }
        Some(_) => return Err("context_found must be an object or null".into()),
    };
    Ok(json!({
        "needs_context": needs_context,
        "context_type": context_type,
        "time_scope": time_scope,
        "search_keywords": keywords,
        "context_found": context_found,
    }))
}

/// The inside of a fenced code block (```json … ```), else the text itself.
pub(crate) fn strip_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let rest = rest.split_once('\n').map_or("", |(_, body)| body);
    rest.trim_end().strip_suffix("```").unwrap_or(rest).trim()
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
