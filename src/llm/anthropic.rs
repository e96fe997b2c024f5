//! Anthropic Messages: `POST {base_url}/v1/messages`.
//!
//! Headers `x-api-key` and `anthropic-version: 2023-06-01`; the system
//! prompt is the top-level `system` field; `max_tokens` is mandatory. The
//! API has no JSON mode, so JSON mode appends an instruction to the system
//! prompt (the caller validates the output either way). Streamed:
//! `stream: true`; the events are `message_start` (model, input tokens),
//! `content_block_delta` (`text_delta`s), `message_delta` (stop reason,
//! output tokens), `message_stop` (the end), `ping`, and `error` (the same
//! error object an HTTP error carries).

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

/// The API version this client speaks.
pub(crate) const API_VERSION: &str = "2023-06-01";

const JSON_INSTRUCTION: &str = "Respond with a single JSON object and nothing else: no prose, no code fences.";

fn request(endpoint: &Endpoint, settings: &RoleSettings, req: &ChatRequest, stream: bool) -> Outgoing {
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
    if stream {
        body["stream"] = json!(true);
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

/// One event of a Messages stream, by its `type`.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    MessageStart {
        message: StartMessage,
    },
    ContentBlockDelta {
        delta: BlockDelta,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: Option<Usage>,
    },
    MessageStop,
    Error {
        error: Value,
    },
    /// `ping`, `content_block_start`, `content_block_stop` and any event
    /// type added later.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct StartMessage {
    model: Option<String>,
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct BlockDelta {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct MessageDelta {
    stop_reason: Option<String>,
}

/// One event of a streamed Messages answer.
pub(crate) fn read_event(answer: &mut Answer, _event: &str, data: &str) -> Result<Step, Fault> {
    let event: Event = decode(data, "Messages event")?;
    match event {
        Event::MessageStart { message } => {
            answer.note_model(message.model);
            let usage = message.usage.as_ref();
            answer.note_usage(usage.and_then(|u| u.input_tokens), usage.and_then(|u| u.output_tokens));
        }
        // Thinking and tool-input deltas are not part of the answer.
        Event::ContentBlockDelta { delta } if delta.kind == "text_delta" => {
            return Ok(Step::Text(delta.text.unwrap_or_default()));
        }
        Event::MessageDelta { delta, usage } => {
            answer.finish_reason = delta.stop_reason.or(answer.finish_reason.take());
            let usage = usage.as_ref();
            answer.note_usage(usage.and_then(|u| u.input_tokens), usage.and_then(|u| u.output_tokens));
        }
        Event::MessageStop => {
            answer.complete = true;
            return Ok(Step::End);
        }
        Event::Error { error } => return Err(Fault::error_event(&error, data)),
        Event::ContentBlockDelta { .. } | Event::Other => {}
    }
    Ok(Step::Text(String::new()))
}
