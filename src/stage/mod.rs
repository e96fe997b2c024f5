//! The stages of the fast path, behind a trait that knows nothing of SQL,
//! leases or retries: a stage takes an input and returns an output or a
//! [`StageError`]; the dispatcher owns timeouts, retries and recording.

pub mod offline;

use std::borrow::Cow;

use futures_util::future::BoxFuture;
use serde_json::Value;
use uuid::Uuid;

use crate::error::Disposition;
use crate::model::StageKind;

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
            disposition: Disposition::Retry { after: None },
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
