//! LLM providers: one client per role, classified errors, shared limits.
//!
//! Every stage that needs a model goes through [`Llm::chat`] with its
//! [`Role`]. The role decides the provider, model, temperature, token limit,
//! timeout, concurrency and requests per minute ([`LlmConfig`]); the stage
//! only supplies the prompt ([`ChatRequest`]).
//!
//! Providers:
//! - **OpenAI-compatible** chat completions (`{base}/chat/completions`):
//!   OpenAI, vLLM, Ollama, llama.cpp, OpenRouter…
//! - **Anthropic** Messages (`{base}/v1/messages`).
//! - **Google Gemini** `generateContent`
//!   (`{base}/v1beta/models/{model}:generateContent`).
//! - **Offline**: deterministic, in-process, no key, no network; every
//!   answer is labelled as such (see [`offline`]). It is the default, so a
//!   fresh install runs end to end without credentials.
//!
//! Each HTTP provider shapes a call (URL, headers, body); one sender in
//! `wire` posts it, so the headers and the JSON body are set up in one place.
//!
//! Invariants:
//! - **The client never retries.** A failure comes back as an [`LlmError`]
//!   whose [`LlmError::disposition`] tells the caller what to do; the caller
//!   stores retries durably (a `run_after` column), so a restart loses no
//!   schedule. The only waits inside `chat` are admission waits (a
//!   concurrency slot, the role's requests-per-minute budget, a provider's
//!   shared cool-down after a 429), each bounded by the role timeout.
//! - **`chat` is bounded**: at most one role timeout waiting for admission
//!   plus one role timeout for the HTTP exchange.
//! - **Keys never leak**: they live in [`Secret`](crate::secret::Secret), whose `Debug` and
//!   `Display` redact; provider error text is scrubbed of the key before it
//!   becomes part of an error.
//! - Nothing here logs prompts or completions; only sizes, model, tokens,
//!   latency and error classes.
//!
//! What every model caller shares (the stages and the archivist alike):
//! [`failure`] maps an [`LlmError`] to the retry policy, [`text`] strips a
//! fenced answer, [`tokens`] counts tokens for a model; [`metrics`] holds
//! this layer's own series. Nothing here imports the stages, the archivist
//! or `crate::metrics`.

mod anthropic;
mod client;
pub mod config;
pub mod embed;
mod error;
pub mod failure;
mod gemini;
pub mod limit;
pub mod metrics;
pub mod offline;
mod openai;
pub mod text;
pub mod tokens;
mod wire;

use std::str::FromStr;
use std::time::Duration;

pub use client::Llm;
pub use config::{
    ConfigError, Endpoint, EndpointConfig, LlmConfig, OfflineConfig, ResolvedLlm, RoleConfig, RoleSettings,
};
pub use error::{LlmDisposition, LlmError, parse_proto_duration, parse_retry_after};
pub use failure::{DEFAULT_RATE_LIMIT_WAIT, Failure, INVALID_OUTPUT_ATTEMPTS};
pub use limit::{DEFAULT_COOLING, MAX_COOLING};
pub use text::strip_fence;
pub use tokens::TokenCounter;

/// The providers' response parsers and the HTTP error classifier, reachable
/// from outside the crate so that property tests (`tests/it/props.rs`) can
/// feed them arbitrary bytes: none of them may panic on any input.
pub mod parse {
    /// What a parser made of a successful (2xx) body.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Parsed {
        /// The completion text.
        pub text: String,
        /// The model the provider says answered.
        pub model: Option<String>,
        /// Reported input tokens.
        pub prompt_tokens: Option<u32>,
        /// Reported output tokens.
        pub completion_tokens: Option<u32>,
    }

    fn parsed(c: super::client::Completion) -> Parsed {
        Parsed {
            text: c.text,
            model: c.model,
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
        }
    }

    /// Parses an OpenAI-compatible chat completion body.
    pub fn openai(body: &[u8]) -> Result<Parsed, String> {
        super::openai::parse(body).map(parsed)
    }

    /// Parses an Anthropic Messages body.
    pub fn anthropic(body: &[u8]) -> Result<Parsed, String> {
        super::anthropic::parse(body).map(parsed)
    }

    /// Parses a Gemini `generateContent` body.
    pub fn gemini(body: &[u8]) -> Result<Parsed, String> {
        super::gemini::parse(body).map(parsed)
    }

    /// Classifies a non-success HTTP answer (status, headers, body) the way
    /// the client does.
    pub use super::error::classify_status;
}

crate::model::named_enum! {
    /// The API a role talks to; its name is the one used in configuration,
    /// logs, metrics and errors.
    pub enum ProviderKind {
        /// OpenAI chat completions and every server that speaks that shape.
        OpenAi = "openai",
        /// Anthropic Messages API.
        Anthropic = "anthropic",
        /// Google Gemini `generateContent`.
        Gemini = "gemini",
        /// The built-in deterministic provider; no network.
        Offline = "offline",
    }
}

/// The name given was not one of `openai`, `anthropic`, `gemini`, `offline`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown LLM provider {0:?} (expected openai, anthropic, gemini or offline)")]
pub struct UnknownProvider(pub String);

impl FromStr for ProviderKind {
    type Err = UnknownProvider;

    /// Case-insensitive; surrounding whitespace is ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        ProviderKind::ALL
            .into_iter()
            .find(|kind| kind.as_str().eq_ignore_ascii_case(name))
            .ok_or_else(|| UnknownProvider(s.to_owned()))
    }
}

crate::model::named_enum! {
    /// Who is calling: each role has its own provider, model and limits. Its
    /// name is the one used in configuration (`llm.<name>`), logs and metrics.
    pub enum Role {
        /// Decides whether a query needs long-term memory; a cheap model, JSON out.
        Analyzer = "analyzer",
        /// Writes the final answer; a strong model.
        Responder = "responder",
        /// Compresses raw chat logs into LSM records; a cheap model, JSON out.
        Archivist = "archivist",
    }
}

/// The author of one message of a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageRole {
    /// The end user (or the stage speaking for them).
    User,
    /// An earlier model answer.
    Assistant,
}

impl MessageRole {
    /// The wire name used by OpenAI and Anthropic (`user` / `assistant`).
    pub fn as_str(self) -> &'static str {
        match self {
            MessageRole::User => "user",
            MessageRole::Assistant => "assistant",
        }
    }
}

/// One turn of the conversation sent to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `user` or `assistant`.
    pub role: MessageRole,
    /// The text of the turn.
    pub content: String,
}

impl Message {
    /// A user turn.
    pub fn user(content: impl Into<String>) -> Message {
        Message {
            role: MessageRole::User,
            content: content.into(),
        }
    }

    /// An assistant turn.
    pub fn assistant(content: impl Into<String>) -> Message {
        Message {
            role: MessageRole::Assistant,
            content: content.into(),
        }
    }
}

/// What a stage asks of a model. Model, temperature and limits come from the
/// role's configuration, not from here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChatRequest {
    /// The system prompt, if any.
    pub system: Option<String>,
    /// The conversation, oldest first; normally ends with a user turn.
    pub messages: Vec<Message>,
    /// Ask for a single JSON object: OpenAI `response_format: json_object`,
    /// Gemini `responseMimeType: application/json`, Anthropic (which has no
    /// JSON mode) an extra system instruction. The caller still validates.
    pub json_mode: bool,
}

impl ChatRequest {
    /// A system prompt and one user message.
    pub fn new(system: Option<String>, user: impl Into<String>) -> ChatRequest {
        ChatRequest {
            system,
            messages: vec![Message::user(user)],
            json_mode: false,
        }
    }

    /// The same request, asking for JSON output.
    #[must_use]
    pub fn json(mut self) -> ChatRequest {
        self.json_mode = true;
        self
    }

    /// The content of the last user message, if there is one.
    pub fn last_user_message(&self) -> Option<&str> {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == MessageRole::User)
            .map(|m| m.content.as_str())
    }

    /// Characters of prompt (system plus messages); logged instead of the text.
    pub fn prompt_chars(&self) -> usize {
        self.system.as_deref().map_or(0, str::len) + self.messages.iter().map(|m| m.content.len()).sum::<usize>()
    }
}

/// A piece of a streamed answer, in order, from the model call in flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// The answer's next text.
    Text(String),
    /// The model call started over (a retry inside the same stage run): what
    /// was sent before is void; the next `Text` starts the answer again.
    Restart,
}

/// Where a streamed answer's pieces go (the dispatcher reads the other end).
pub type DeltaSink = tokio::sync::mpsc::UnboundedSender<Delta>;

/// A completion.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    /// The generated text; never empty (an empty completion is an error).
    pub text: String,
    /// The model that answered, as the provider reports it (falls back to
    /// the configured model when the provider does not say).
    pub model: String,
    /// Input tokens, when the provider reports them.
    pub prompt_tokens: Option<u32>,
    /// Output tokens, when the provider reports them.
    pub completion_tokens: Option<u32>,
    /// Time from sending the request to having the whole body; admission
    /// waits (concurrency, rate limits, cool-down) are not included.
    pub latency: Duration,
}
