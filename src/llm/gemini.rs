//! Google Gemini: `POST {base_url}/v1beta/models/{model}:generateContent`.
//!
//! The key goes in `x-goog-api-key` (never in the URL, so it cannot end up
//! in a logged URL); the system prompt is `systemInstruction`; assistant
//! turns have the role `model`; temperature, `maxOutputTokens` and, in JSON
//! mode, `responseMimeType: application/json` sit in `generationConfig`.
//! Thought parts of thinking models are not part of the answer. Streamed:
//! `:streamGenerateContent?alt=sse`, each event a `generateContent`
//! response with the next parts; the chunk with a `finishReason` ends the
//! answer and carries the final `usageMetadata`; an error mid-stream is an
//! event holding the error object an HTTP error carries.

use serde::Deserialize;
use serde_json::json;

use super::client::Completion;
use super::config::{Endpoint, RoleSettings};
use super::stream::{Answer, Fault, Step, decode};
use super::wire::{Outgoing, Shape};
use super::{ChatRequest, MessageRole};

pub(crate) const SHAPE: Shape = Shape {
    request,
    parse,
    read_event,
};

fn request(endpoint: &Endpoint, settings: &RoleSettings, req: &ChatRequest, stream: bool) -> Outgoing {
    let contents: Vec<_> = req
        .messages
        .iter()
        .map(|m| {
            let role = match m.role {
                MessageRole::User => "user",
                MessageRole::Assistant => "model",
            };
            json!({"role": role, "parts": [{"text": m.content}]})
        })
        .collect();
    let mut generation = json!({
        "temperature": settings.temperature,
        "maxOutputTokens": settings.max_tokens,
    });
    if req.json_mode {
        generation["responseMimeType"] = json!("application/json");
    }
    let mut body = json!({"contents": contents, "generationConfig": generation});
    if let Some(system) = &req.system {
        body["systemInstruction"] = json!({"parts": [{"text": system}]});
    }
    // Accept "models/gemini-…" as well as the bare name.
    let model = settings.model.strip_prefix("models/").unwrap_or(&settings.model);
    let action = if stream {
        "streamGenerateContent?alt=sse"
    } else {
        "generateContent"
    };
    Outgoing {
        url: format!("{}/v1beta/models/{model}:{action}", endpoint.base_url),
        headers: vec![("x-goog-api-key", endpoint.api_key.expose().to_owned())],
        body,
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    #[serde(default)]
    candidates: Vec<Candidate>,
    usage_metadata: Option<Usage>,
    model_version: Option<String>,
    prompt_feedback: Option<serde_json::Value>,
    /// Only in a stream: an error after the answer started.
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    content: Option<Content>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Content {
    #[serde(default)]
    parts: Vec<Part>,
}

#[derive(Deserialize)]
struct Part {
    text: Option<String>,
    #[serde(default)]
    thought: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Usage {
    prompt_token_count: Option<u32>,
    candidates_token_count: Option<u32>,
}

pub(crate) fn parse(body: &[u8]) -> Result<Completion, String> {
    let response: Response =
        serde_json::from_slice(body).map_err(|e| format!("not a generateContent response: {e}"))?;
    let Some(candidate) = response.candidates.into_iter().next() else {
        return Err(match response.prompt_feedback {
            Some(feedback) => format!("no candidates; prompt feedback {feedback}"),
            None => "no candidates".to_owned(),
        });
    };
    let text = answer_text(candidate.content);
    if text.trim().is_empty() {
        let reason = candidate.finish_reason.as_deref().unwrap_or("none");
        return Err(format!(
            "empty completion (finishReason {reason}){}",
            empty_hint(reason)
        ));
    }
    Ok(Completion {
        text,
        model: response.model_version.filter(|m| !m.is_empty()),
        prompt_tokens: response.usage_metadata.as_ref().and_then(|u| u.prompt_token_count),
        completion_tokens: response.usage_metadata.as_ref().and_then(|u| u.candidates_token_count),
    })
}

/// The answer's parts of a candidate's content (thoughts left out).
fn answer_text(content: Option<Content>) -> String {
    content
        .map(|c| c.parts)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| !p.thought)
        .filter_map(|p| p.text)
        .collect()
}

/// What to do about an empty answer that stopped for `reason`.
fn empty_hint(reason: &str) -> &'static str {
    if reason == "MAX_TOKENS" {
        "; thinking may have used the whole max_tokens budget: raise it"
    } else {
        ""
    }
}

/// One event of a streamed `generateContent` answer.
pub(crate) fn read_event(answer: &mut Answer, _event: &str, data: &str) -> Result<Step, Fault> {
    let chunk: Response = decode(data, "generateContent chunk")?;
    if let Some(error) = chunk.error {
        return Err(Fault::error_event(&error, data));
    }
    answer.note_model(chunk.model_version);
    if let Some(usage) = chunk.usage_metadata {
        answer.note_usage(usage.prompt_token_count, usage.candidates_token_count);
    }
    let Some(candidate) = chunk.candidates.into_iter().next() else {
        return match chunk.prompt_feedback {
            Some(feedback) => Err(Fault::Invalid(format!("no candidates; prompt feedback {feedback}"))),
            None => Ok(Step::Text(String::new())),
        };
    };
    if candidate.finish_reason.is_some() {
        answer.finish_reason = candidate.finish_reason;
        answer.complete = true;
    }
    Ok(Step::Text(answer_text(candidate.content)))
}
