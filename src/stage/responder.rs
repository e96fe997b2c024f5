//! The respond stage: the assembled context to the responder model
//! (temperature, max tokens and timeout from its role settings). The
//! context already holds the responder's system prompt (the assembler put
//! it there), so none is sent separately.

use super::{StageError, StageInput, StageOutput, StageSuccess, Usage, from_llm};
use crate::llm::{ChatRequest, Llm, LlmDisposition, Role};

pub async fn run(llm: &Llm, input: &StageInput) -> Result<StageSuccess, StageError> {
    let mut context = match &input.context {
        Some(c) => c.clone(),
        None => {
            return Err(StageError::fail(
                "internal",
                "the request reached the responder without a context",
            ));
        }
    };
    loop {
        match llm.chat(Role::Responder, ChatRequest::new(None, context.clone())).await {
            Ok(resp) => {
                return Ok(StageSuccess {
                    output: StageOutput::Answer(resp.text),
                    usage: Usage {
                        model: Some(resp.model),
                        prompt_tokens: resp.prompt_tokens,
                        completion_tokens: resp.completion_tokens,
                    },
                    context_sources: None,
                });
            }
            // Too long for the model: drop the history block and try once more.
            Err(e) if e.disposition() == LlmDisposition::TokenLimit => match without_history(&context) {
                Some(shorter) => context = shorter,
                None => return Err(from_llm(e, llm, Role::Responder)),
            },
            Err(e) => return Err(from_llm(e, llm, Role::Responder)),
        }
    }
}

fn without_history(context: &str) -> Option<String> {
    let start = context.find("<context_from_history>")?;
    let end = context.find("</context_from_history>")? + "</context_from_history>".len();
    let mut out = String::with_capacity(context.len());
    out.push_str(&context[..start]);
    out.push_str(context[end..].trim_start());
    Some(out)
}
