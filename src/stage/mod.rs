//! The stages of the fast path (analyze, assemble, respond), behind a trait
//! that knows nothing of SQL, leases or retries: a stage takes an input and
//! returns an output or a [`StageError`]; the dispatcher owns timeouts,
//! retries and recording.
//!
//! Stages own stage knowledge: the analysis JSON is read only here (typed as
//! [`Analysis`]), and whether assemble can be fused with analyze is decided
//! here ([`Pipeline::fuse_assemble`]). What stages share with the archivist
//! (the LLM error mapping, fence stripping, token counting) lives in
//! [`crate::llm`].
//!
//! Names: the last stage is *respond* ([`StageKind::Respond`]); its model
//! role is `responder` and its prompt role [`PromptRole::Responder`], stored
//! as `FinalResponder`.
//!
//! [`PromptRole::Responder`]: crate::model::PromptRole::Responder

pub mod analysis;
pub mod analyzer;
pub mod assembler;
pub mod memory;
pub mod metrics;
pub mod responder;

use std::borrow::Cow;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::Value;
use uuid::Uuid;

pub use analysis::Analysis;

use crate::config::MemoryConfig;
use crate::error::Disposition;
use crate::llm::{Failure, Llm, LlmError, Role, TokenCounter};
use crate::model::{Clarify, MemoryItem, MemoryRecord, Prompts, StageKind};

/// What a stage sees of a claimed request.
#[derive(Debug, Clone)]
pub struct StageInput {
    pub request_id: Uuid,
    pub user_id: Uuid,
    pub thread_id: Option<Uuid>,
    pub user_query: String,
    /// 1-based attempt of this stage.
    pub attempt: u32,
    /// The analyzer's result as stored (assemble stage); read it with
    /// [`StageInput::read_analysis`].
    pub analysis: Option<Value>,
    /// The assembled context (respond stage).
    pub context: Option<String>,
    /// The user's memory the stage reads: recent records for the analyzer,
    /// the record the analysis refers to for the assembler. Always the
    /// requesting user's own.
    pub memory: Vec<MemoryRecord>,
    /// How many turns the user logged besides this request's query (the
    /// analyzer's input: a newcomer has turns before any LSM record).
    pub earlier_turns: i64,
    /// Whether the analyzer may ask the user a question, and the question
    /// and reply of a request that asked (the analyzer's input).
    pub clarify: Clarify,
    /// The query's embedding and its model, computed while the analyzer
    /// ran (the dispatcher overlaps the two); the fused assemble's search
    /// uses it instead of embedding the query again.
    pub query_embedding: Option<(Vec<f32>, String)>,
    /// The memory retrieved for the assemble stage ([`memory::MemoryPlan`]):
    /// the thread's newest turns, then the long-term items in packing
    /// order. Always the requesting user's own; empty for other stages.
    pub retrieved: Vec<MemoryItem>,
    /// The active prompts.
    pub prompts: Arc<Prompts>,
    /// Where the respond stage sends its answer's pieces while the model
    /// writes (`None`: the request did not ask to stream; nothing is sent).
    pub deltas: Option<crate::llm::DeltaSink>,
}

impl StageInput {
    /// The analysis this input carries, typed; `None` when there is none or
    /// it is not a valid analysis (every stored analysis was written by
    /// [`Analysis::to_json`], so only a hand-edited row can be invalid).
    pub fn read_analysis(&self) -> Option<Analysis> {
        self.analysis.as_ref().and_then(|v| Analysis::from_json(v).ok())
    }
}

/// What a stage produced.
#[derive(Debug, Clone, PartialEq)]
pub enum StageOutput {
    /// The analysis as stored ([`Analysis::to_json`]).
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
    /// For a context: the memory it holds, a JSON array of `{kind, id,
    /// score, why}` (`pipeline_runs.context_sources`).
    pub context_sources: Option<Value>,
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

    /// A failure of the LLM layer, with the usage of the attempt.
    pub fn from_failure(f: Failure, usage: Usage) -> Self {
        StageError {
            class: f.class,
            message: f.message,
            disposition: f.disposition,
            usage,
        }
    }
}

/// The three stages. Implementations must be cancel-safe: the dispatcher
/// drops the future when the lease is lost or at the end of the grace period.
pub trait Pipeline: Send + Sync + 'static {
    fn run<'a>(&'a self, stage: StageKind, input: &'a StageInput) -> BoxFuture<'a, Result<StageSuccess, StageError>>;

    /// Whether the assemble stage can run right after a successful analyze,
    /// on what the analyzer was given, and if so the input to run it on.
    ///
    /// `input` is the analyze stage's input, `analysis` its output as
    /// stored. The default fuses when the analysis is valid and the memory
    /// record it refers to (if any) is one of the user's records the claim
    /// read for the analyzer ([`Analysis::assembles_from`]); the returned
    /// input carries the analysis. `None`: the assemble stage runs on its
    /// own, as usual.
    fn fuse_assemble(&self, input: StageInput, analysis: Option<Value>) -> Option<StageInput> {
        fuse_assemble(input, analysis)
    }
}

/// The default [`Pipeline::fuse_assemble`].
pub fn fuse_assemble(mut input: StageInput, analysis: Option<Value>) -> Option<StageInput> {
    if let Some(v) = &analysis {
        let typed = Analysis::from_json(v).ok()?;
        if !typed.assembles_from(&input.memory) {
            return None;
        }
    }
    input.analysis = analysis;
    Some(input)
}

/// Maps a provider failure to the dispatcher's policy ([`Failure::from_llm`]),
/// with the role's model as the attempt's usage.
pub fn from_llm(e: LlmError, llm: &Llm, role: Role) -> StageError {
    StageError::from_failure(
        Failure::from_llm(&e),
        Usage {
            model: Some(llm.model(role).to_owned()),
            prompt_tokens: None,
            completion_tokens: None,
        },
    )
}

/// The real pipeline: analyzer and responder call their models through
/// [`Llm`] (which may be the offline provider); the assembler counts tokens
/// with the responder model's tokenizer.
pub struct LlmPipeline {
    llm: Llm,
    counter: TokenCounter,
    context_max_tokens: usize,
    memory: MemoryConfig,
}

impl LlmPipeline {
    pub fn new(llm: Llm, context_max_tokens: usize) -> LlmPipeline {
        let counter = TokenCounter::for_model(llm.model(Role::Responder));
        LlmPipeline {
            llm,
            counter,
            context_max_tokens,
            memory: MemoryConfig::default(),
        }
    }

    /// The memory budgets of the assembler (`[memory]`).
    pub fn with_memory(mut self, memory: MemoryConfig) -> LlmPipeline {
        self.memory = memory;
        self
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
            StageKind::Assemble => futures_util::future::ready(assembler::run(
                &self.counter,
                self.context_max_tokens,
                &self.memory,
                input,
            ))
            .boxed(),
            StageKind::Respond => responder::run(&self.llm, input).boxed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn input(memory: &[i64]) -> StageInput {
        StageInput {
            request_id: Uuid::nil(),
            user_id: Uuid::nil(),
            thread_id: None,
            user_query: "q".into(),
            attempt: 1,
            analysis: None,
            context: None,
            memory: memory
                .iter()
                .map(|&id| MemoryRecord {
                    id,
                    time_bucket_start: chrono::DateTime::UNIX_EPOCH,
                    time_bucket_end: chrono::DateTime::UNIX_EPOCH,
                    tags: Vec::new(),
                    summary: String::new(),
                })
                .collect(),
            earlier_turns: 0,
            clarify: Clarify::Off,
            query_embedding: None,
            retrieved: Vec::new(),
            prompts: Arc::new(Prompts::default()),
            deltas: None,
        }
    }

    fn analysis(found: Value) -> Option<Value> {
        Some(json!({
            "needs_context": true,
            "context_type": "topic",
            "time_scope": "none",
            "search_keywords": [],
            "context_found": found,
        }))
    }

    #[test]
    fn fuses_when_the_record_is_in_the_claimed_memory() {
        let a = analysis(json!({"lsm_record_id": 7}));
        let fused = fuse_assemble(input(&[3, 7]), a.clone());
        assert_eq!(fused.and_then(|i| i.analysis), a);
        assert!(fuse_assemble(input(&[]), analysis(Value::Null)).is_some());
        assert!(fuse_assemble(input(&[]), analysis(json!({"lsm_record_id": null}))).is_some());
        assert!(fuse_assemble(input(&[]), None).is_some());
    }

    #[test]
    fn does_not_fuse_otherwise() {
        assert!(fuse_assemble(input(&[3]), analysis(json!({"lsm_record_id": 7}))).is_none());
        assert!(fuse_assemble(input(&[7]), analysis(json!({"lsm_record_id": "seven"}))).is_none());
        assert!(fuse_assemble(input(&[7]), Some(json!([1]))).is_none());
    }
}
