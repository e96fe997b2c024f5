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

pub(crate) fn request(
    http: &reqwest::Client,
    endpoint: &Endpoint,
    settings: &RoleSettings,
    req: &ChatRequest,
) -> reqwest::RequestBuilder {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = &req.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.extend(
        req.messages
            .iter()
            .map(|m| json!({"role": m.role.as_str(), "content": m.content})),
    );
    let mut body = json!({
        "model": settings.model,
        "messages": messages,
        "temperature": settings.temperature,
        "max_tokens": settings.max_tokens,
    });
    if req.json_mode {
        body["response_format"] = json!({"type": "json_object"});
    }
    http.post(format!("{}/chat/completions", endpoint.base_url))
        .bearer_auth(endpoint.api_key.expose())
        .json(&body)
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
