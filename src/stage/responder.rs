//! The respond stage: the assembled context to the responder model
//! (temperature, max tokens and timeout from its role settings). The
//! context holds the responder's system prompt at its head (the assembler
//! put it there): it is sent in the provider's system role, and the rest
//! (the history block and the quoted query) as the user's message, so
//! nothing the user or their memory wrote shares the system prompt's role.
//!
//! Streaming: when the request asked for it (`input.deltas`), the answer is
//! asked for as a stream and its pieces go to the sink while the model
//! writes; the retry without the history block first sends
//! [`Delta::Restart`]. Otherwise the model is called exactly as without
//! streaming.

use super::assembler::split_system;
use super::{StageError, StageInput, StageOutput, StageSuccess, Usage, from_llm};
use crate::llm::{ChatRequest, Delta, Llm, LlmDisposition, Role};

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
        let answered = match &input.deltas {
            Some(sink) => llm.chat_stream(Role::Responder, request, sink).await,
            None => llm.chat(Role::Responder, request).await,
        };
        match answered {
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
                Some(shorter) => {
                    context = shorter;
                    if let Some(sink) = &input.deltas {
                        // Whatever the first call sent is void.
                        let _ = sink.send(Delta::Restart);
                    }
                }
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
