//! The stages of the fast path, behind a trait that knows nothing of SQL,
//! leases or retries: a stage takes an input and returns an output or a
//! [`StageError`]; the dispatcher owns timeouts, retries and recording.

pub mod analyzer;
pub mod assembler;
pub mod responder;
pub mod tokens;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::Value;
use uuid::Uuid;

use crate::error::Disposition;
use crate::llm::{Llm, LlmDisposition, LlmError, Role};
use crate::model::{MemoryRecord, Prompts, StageKind};

/// What a stage sees of a claimed request.
#[derive(Debug, Clone)]
pub struct StageInput {
    pub request_id: Uuid,
    pub user_id: Uuid,
    pub thread_id: Option<Uuid>,
    pub user_query: String,
    /// 1-based attempt of this stage.
    pub attempt: u32,
    /// The analyzer's result (assemble stage).
    pub analysis: Option<Value>,
    /// The assembled context (respond stage).
    pub context: Option<String>,
    /// The user's memory the stage reads: recent records for the analyzer,
    /// the record the analysis refers to for the assembler. Always the
    /// requesting user's own.
    pub memory: Vec<MemoryRecord>,
    /// The active prompts.
    pub prompts: Arc<Prompts>,
}

/// What a stage produced.
#[derive(Debug, Clone, PartialEq)]
pub enum StageOutput {
    Analysis(Value),
    Context(String),
    Answer(String),
}

/// Model usage of an attempt, for the step history.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub model: Option<String>,
    pub prompt_tokens: Option<u32>,
    pub completion_tokens: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct StageSuccess {
    pub output: StageOutput,
    pub usage: Usage,
}

/// A failed attempt: its class (for the step history and metrics), a message
/// for the operator, and what the dispatcher should do about it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{class}: {message}")]
pub struct StageError {
    pub class: Cow<'static, str>,
    pub message: String,
    pub disposition: Disposition,
    pub usage: Usage,
}

impl StageError {
    pub fn retry(class: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        StageError {
            class: class.into(),
            message: message.into(),
            disposition: Disposition::Retry {
                after: None,
                max_attempts: None,
            },
            usage: Usage::default(),
        }
    }

    pub fn fail(class: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        StageError {
            class: class.into(),
            message: message.into(),
            disposition: Disposition::Fail,
            usage: Usage::default(),
        }
    }
}

/// The three stages. Implementations must be cancel-safe: the dispatcher
/// drops the future when the lease is lost or at the end of the grace period.
pub trait Pipeline: Send + Sync + 'static {
    fn run<'a>(&'a self, stage: StageKind, input: &'a StageInput) -> BoxFuture<'a, Result<StageSuccess, StageError>>;
}

/// How long a request waits after a 429 that named no delay (the seed's 60 s).
pub const DEFAULT_RATE_LIMIT_WAIT: Duration = Duration::from_secs(60);

/// Maps a provider failure to the dispatcher's policy (the seed's error
/// table, made durable): timeouts, connection errors, 5xx, 529 and invalid
/// responses retry with exponential backoff; a 429 waits for its
/// `Retry-After` (else 60 s), each counting a try; this daemon's own
/// throttling waits without counting; quota, auth and other 4xx fail now.
pub fn from_llm(e: LlmError, llm: &Llm, role: Role) -> StageError {
    let disposition = match e.disposition() {
        LlmDisposition::Retry => Disposition::Retry {
            after: None,
            max_attempts: None,
        },
        LlmDisposition::RateLimited { retry_after } => Disposition::Retry {
            after: Some(retry_after.unwrap_or(DEFAULT_RATE_LIMIT_WAIT)),
            max_attempts: None,
        },
        LlmDisposition::Throttled { retry_after } => Disposition::Defer {
            after: retry_after.unwrap_or(Duration::from_secs(1)),
        },
        LlmDisposition::Fail | LlmDisposition::TokenLimit => Disposition::Fail,
    };
    StageError {
        class: e.class().into(),
        message: e.to_string(),
        disposition,
        usage: Usage {
            model: Some(llm.model(role).to_owned()),
            prompt_tokens: None,
            completion_tokens: None,
        },
    }
}

/// The real pipeline: analyzer and responder call their models through
/// [`Llm`] (which may be the offline provider); the assembler counts tokens
/// with the responder model's tokenizer.
pub struct LlmPipeline {
    llm: Llm,
    counter: tokens::TokenCounter,
    context_max_tokens: usize,
}

impl LlmPipeline {
    pub fn new(llm: Llm, context_max_tokens: usize) -> LlmPipeline {
        let counter = tokens::TokenCounter::for_model(llm.model(Role::Responder));
        LlmPipeline {
            llm,
            counter,
            context_max_tokens,
        }
    }

    pub fn llm(&self) -> &Llm {
        &self.llm
    }
}

impl Pipeline for LlmPipeline {
    fn run<'a>(&'a self, stage: StageKind, input: &'a StageInput) -> BoxFuture<'a, Result<StageSuccess, StageError>> {
        use futures_util::FutureExt;
        match stage {
            StageKind::Analyze => analyzer::run(&self.llm, input).boxed(),
            StageKind::Assemble => {
                futures_util::future::ready(assembler::run(&self.counter, self.context_max_tokens, input)).boxed()
            }
            StageKind::Respond => responder::run(&self.llm, input).boxed(),
        }
    }
}
