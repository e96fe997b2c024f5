//! What the HTTP providers ([`super::openai`], [`super::anthropic`],
//! [`super::gemini`]) share: what each one provides ([`Shape`]), a call as a
//! provider shapes it ([`Outgoing`]), sent by one function, and the message
//! and body shapes two of them use.
//!
//! Guarantee: every header a provider adds (its key among them) is marked
//! sensitive, so no debug print of a request shows it.

use reqwest::header::HeaderValue;
use serde_json::{Value, json};

use super::ChatRequest;
use super::client::Completion;
use super::config::{Endpoint, RoleSettings};
use super::stream::ReadEvent;

/// What an HTTP provider module provides: how it shapes a call (asking for
/// a stream or not), how it reads a whole answer, how it reads one event of
/// a streamed one.
pub(crate) struct Shape {
    /// The call; the flag asks for a streamed answer.
    pub request: fn(&Endpoint, &RoleSettings, &ChatRequest, bool) -> Outgoing,
    /// A whole (2xx) body.
    pub parse: fn(&[u8]) -> Result<Completion, String>,
    /// One server-sent event of a streamed answer.
    pub read_event: ReadEvent,
}

/// One chat call as a provider shapes it.
pub(crate) struct Outgoing {
    /// Where it is posted.
    pub url: String,
    /// Authentication and version headers.
    pub headers: Vec<(&'static str, String)>,
    /// The JSON body.
    pub body: Value,
}

impl Outgoing {
    /// The `POST` of this call on `http`.
    pub(crate) fn build(self, http: &reqwest::Client) -> reqwest::RequestBuilder {
        let mut builder = http.post(self.url);
        for (name, value) in self.headers {
            builder = match HeaderValue::from_str(&value) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    builder.header(name, v)
                }
                // reqwest keeps the error and reports it when sending.
                Err(_) => builder.header(name, value),
            };
        }
        builder.json(&self.body)
    }
}

/// The turns of `req` as `{"role", "content"}` objects (OpenAI and Anthropic).
pub(crate) fn role_content_messages(req: &ChatRequest) -> impl Iterator<Item = Value> + '_ {
    req.messages
        .iter()
        .map(|m| json!({"role": m.role.as_str(), "content": m.content}))
}

/// The body fields OpenAI and Anthropic share: model, messages, temperature
/// and `max_tokens`.
pub(crate) fn chat_body(settings: &RoleSettings, messages: Vec<Value>) -> Value {
    json!({
        "model": settings.model,
        "messages": messages,
        "temperature": settings.temperature,
        "max_tokens": settings.max_tokens,
    })
}
