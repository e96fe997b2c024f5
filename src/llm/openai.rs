//! OpenAI-compatible chat completions: `POST {base_url}/chat/completions`.
//!
//! The shape OpenAI, vLLM, Ollama, llama.cpp's server and OpenRouter all
//! accept: `Authorization: Bearer <key>`, the system prompt as the first
//! message, `max_tokens` (the field every compatible server knows), and
//! `response_format: {"type": "json_object"}` in JSON mode. Streamed:
//! `stream: true` with `stream_options: {include_usage: true}`; each event a
//! `chat.completion.chunk` (text in `choices[0].delta.content`), usage in
//! the last chunk (no choices), then `data: [DONE]`.

use serde::Deserialize;
use serde_json::{Value, json};

use super::ChatRequest;
use super::client::Completion;
use super::config::{Endpoint, RoleSettings};
use super::stream::{Answer, Fault, Step, decode};
use super::wire::{Outgoing, Shape, chat_body, role_content_messages};

pub(crate) const SHAPE: Shape = Shape {
    request,
    parse,
    read_event,
};

fn request(endpoint: &Endpoint, settings: &RoleSettings, req: &ChatRequest, stream: bool) -> Outgoing {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = &req.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.extend(role_content_messages(req));
    let mut body = chat_body(settings, messages);
    if req.json_mode {
        body["response_format"] = json!({"type": "json_object"});
    }
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    Outgoing {
        url: format!("{}/chat/completions", endpoint.base_url),
        headers: vec![("authorization", format!("Bearer {}", endpoint.api_key.expose()))],
        body,
    }
}

#[derive(Deserialize)]
struct Response {
    model: Option<String>,
    choices: Vec<Choice>,
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: ChoiceMessage,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ChoiceMessage {
    content: Option<Value>,
    refusal: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: Option<u32>,
    completion_tokens: Option<u32>,
}

pub(crate) fn parse(body: &[u8]) -> Result<Completion, String> {
    let response: Response = serde_json::from_slice(body).map_err(|e| format!("not a chat completion: {e}"))?;
    let choice = response
        .choices
        .into_iter()
        .next()
        .ok_or("no choices in the completion")?;
    // Content is a string; a few compatible servers send an array of parts.
    let text = match choice.message.content {
        Some(Value::String(s)) => s,
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    };
    if text.trim().is_empty() {
        return Err(match choice.message.refusal {
            Some(refusal) => format!("the model refused: {refusal}"),
            None => format!(
                "empty completion (finish_reason {})",
                choice.finish_reason.as_deref().unwrap_or("none")
            ),
        });
    }
    let usage = response.usage;
    Ok(Completion {
        text,
        model: response.model.filter(|m| !m.is_empty()),
        prompt_tokens: usage.as_ref().and_then(|u| u.prompt_tokens),
        completion_tokens: usage.as_ref().and_then(|u| u.completion_tokens),
    })
}

#[derive(Deserialize)]
struct Chunk {
    model: Option<String>,
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    usage: Option<Usage>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: Option<ChunkDelta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct ChunkDelta {
    content: Option<String>,
    refusal: Option<String>,
}

/// One event of a streamed chat completion.
pub(crate) fn read_event(answer: &mut Answer, _event: &str, data: &str) -> Result<Step, Fault> {
    if data.trim() == "[DONE]" {
        answer.complete = true;
        return Ok(Step::End);
    }
    let chunk: Chunk = decode(data, "completion chunk")?;
    if let Some(error) = chunk.error {
        return Err(Fault::error_event(&error, data));
    }
    answer.note_model(chunk.model);
    if let Some(usage) = chunk.usage {
        answer.note_usage(usage.prompt_tokens, usage.completion_tokens);
    }
    let Some(choice) = chunk.choices.into_iter().next() else {
        return Ok(Step::Text(String::new()));
    };
    if choice.finish_reason.is_some() {
        answer.finish_reason = choice.finish_reason;
    }
    let delta = choice.delta.unwrap_or_default();
    if let Some(refusal) = delta.refusal {
        answer.refusal.push_str(&refusal);
    }
    Ok(Step::Text(delta.content.unwrap_or_default()))
}
