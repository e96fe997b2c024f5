//! Anthropic Messages: `POST {base_url}/v1/messages`.
//!
//! Headers `x-api-key` and `anthropic-version: 2023-06-01`; the system
//! prompt is the top-level `system` field; `max_tokens` is mandatory. The
//! API has no JSON mode, so JSON mode appends an instruction to the system
//! prompt (the caller validates the output either way).

use serde::Deserialize;
use serde_json::json;

use super::ChatRequest;
use super::client::Completion;
use super::config::{Endpoint, RoleSettings};
use super::wire::{Outgoing, chat_body, role_content_messages};

/// The API version this client speaks.
pub(crate) const API_VERSION: &str = "2023-06-01";

const JSON_INSTRUCTION: &str = "Respond with a single JSON object and nothing else: no prose, no code fences.";

pub(crate) fn request(endpoint: &Endpoint, settings: &RoleSettings, req: &ChatRequest) -> Outgoing {
    let system = match (&req.system, req.json_mode) {
        (Some(system), true) => Some(format!("{system}\n\n{JSON_INSTRUCTION}")),
        (Some(system), false) => Some(system.clone()),
        (None, true) => Some(JSON_INSTRUCTION.to_owned()),
        (None, false) => None,
    };
    let mut body = chat_body(settings, role_content_messages(req).collect());
    if let Some(system) = system {
        body["system"] = json!(system);
    }
    Outgoing {
        url: format!("{}/v1/messages", endpoint.base_url),
        headers: vec![
            ("x-api-key", endpoint.api_key.expose().to_owned()),
            ("anthropic-version", API_VERSION.to_owned()),
        ],
        body,
    }
}

#[derive(Deserialize)]
struct Response {
    model: Option<String>,
    content: Vec<Block>,
    stop_reason: Option<String>,
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Block {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    input_tokens: Option<u32>,
    output_tokens: Option<u32>,
}

pub(crate) fn parse(body: &[u8]) -> Result<Completion, String> {
    let response: Response = serde_json::from_slice(body).map_err(|e| format!("not a Messages response: {e}"))?;
    let text: String = response
        .content
        .iter()
        .filter(|b| b.kind == "text")
        .filter_map(|b| b.text.as_deref())
        .collect();
    if text.trim().is_empty() {
        return Err(format!(
            "empty completion (stop_reason {})",
            response.stop_reason.as_deref().unwrap_or("none")
        ));
    }
    Ok(Completion {
        text,
        model: response.model.filter(|m| !m.is_empty()),
        prompt_tokens: response.usage.as_ref().and_then(|u| u.input_tokens),
        completion_tokens: response.usage.as_ref().and_then(|u| u.output_tokens),
    })
}
