//! The respond stage: the assembled context to the responder model
//! (temperature, max tokens and timeout from its role settings). The
//! context holds the responder's system prompt at its head (the assembler
//! put it there): it is sent in the provider's system role, and the rest
//! (the history block and the quoted query) as the user's message, so
//! nothing the user or their memory wrote shares the system prompt's role.

use super::assembler::split_system;
use super::{StageError, StageInput, StageOutput, StageSuccess, Usage, from_llm};
use crate::llm::{ChatRequest, Llm, LlmDisposition, Role};

pub async fn run(llm: &Llm, input: &StageInput) -> Result<StageSuccess, StageError> {
    let Some(whole) = &input.context else {
        return Err(StageError::fail(
            "internal",
            "the request reached the responder without a context",
        ));
    };
    let (system, rest) = split_system(whole);
    let system = system.filter(|s| !s.is_empty()).map(str::to_owned);
    let mut context = rest.to_owned();
    loop {
        let request = ChatRequest::new(system.clone(), context.clone());
        match llm.chat(Role::Responder, request).await {
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
