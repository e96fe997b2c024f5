//! The LLM layer's own Prometheus series, recorded through the `metrics`
//! facade (no handle to pass; the daemon's recorder renders them).
//!
//! Guarantees: [`record_call`] runs once per [`Llm::chat`](super::Llm::chat)
//! or [`Llm::chat_stream`](super::Llm::chat_stream) (a stream is one call)
//! and never fails; series names and labels are those the daemon has always
//! exported — `maas_llm_calls_total{provider,role,outcome}` (outcome `ok` or
//! the error class), `maas_llm_tokens_total{provider,role,kind}` (kind
//! `prompt`, `completion`), `maas_llm_rate_limited_total{provider,role}`,
//! `maas_llm_timeouts_total{provider,role}` and the histogram
//! `maas_llm_call_duration_seconds{provider,role}` of successful calls. The
//! `role` label is [`Role::as_str`] (`analyzer`, `responder`, `archivist`).
//! Their descriptions live with the others in `crate::metrics`.

use metrics::{counter, histogram};

use super::{ChatResponse, LlmError, ProviderKind, Role};

/// Makes the LLM series of `provider` visible (at zero) before any call.
pub fn register_provider(provider: &str) {
    let provider = provider.to_owned();
    for role in Role::ALL {
        let r = role.as_str();
        counter!("maas_llm_calls_total", "provider" => provider.clone(), "role" => r, "outcome" => "ok").increment(0);
        for kind in ["prompt", "completion"] {
            counter!("maas_llm_tokens_total", "provider" => provider.clone(), "role" => r, "kind" => kind).increment(0);
        }
        counter!("maas_llm_rate_limited_total", "provider" => provider.clone(), "role" => r).increment(0);
        counter!("maas_llm_timeouts_total", "provider" => provider.clone(), "role" => r).increment(0);
    }
}

/// Records one `Llm::chat` (or `chat_stream`) with the provider and role that served it.
pub fn record_call(provider: ProviderKind, role: Role, result: Result<&ChatResponse, &LlmError>) {
    let p = provider.as_str();
    let r = role.as_str();
    match result {
        Ok(resp) => {
            counter!("maas_llm_calls_total", "provider" => p, "role" => r, "outcome" => "ok").increment(1);
            if let Some(t) = resp.prompt_tokens {
                counter!("maas_llm_tokens_total", "provider" => p, "role" => r, "kind" => "prompt")
                    .increment(u64::from(t));
            }
            if let Some(t) = resp.completion_tokens {
                counter!("maas_llm_tokens_total", "provider" => p, "role" => r, "kind" => "completion")
                    .increment(u64::from(t));
            }
            histogram!("maas_llm_call_duration_seconds", "provider" => p, "role" => r)
                .record(resp.latency.as_secs_f64());
        }
        Err(e) => {
            let class = e.class();
            counter!("maas_llm_calls_total", "provider" => p, "role" => r, "outcome" => class).increment(1);
            match class {
                "rate_limited" => counter!("maas_llm_rate_limited_total", "provider" => p, "role" => r).increment(1),
                "timeout" => counter!("maas_llm_timeouts_total", "provider" => p, "role" => r).increment(1),
                _ => {}
            }
        }
    }
}
