//! OpenAI-compatible chat completions: `POST {base_url}/chat/completions`.
//!
//! The shape OpenAI, vLLM, Ollama, llama.cpp's server and OpenRouter all
//! accept: `Authorization: Bearer <key>`, the system prompt as the first
//! message, `max_tokens` (the field every compatible server knows), and
//! `response_format: {"type": "json_object"}` in JSON mode.

use serde::Deserialize;
use serde_json::{Value, json};

use super::ChatRequest;
use super::client::Completion;
use super::config::{Endpoint, RoleSettings};
use super::wire::{Outgoing, chat_body, role_content_messages};

pub(crate) fn request(endpoint: &Endpoint, settings: &RoleSettings, req: &ChatRequest) -> Outgoing {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = &req.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.extend(role_content_messages(req));
    let mut body = chat_body(settings, messages);
    if req.json_mode {
        body["response_format"] = json!({"type": "json_object"});
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
