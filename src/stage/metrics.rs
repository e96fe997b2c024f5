//! The stage layer's own Prometheus series, recorded through the `metrics`
//! facade (like [`crate::llm::metrics`]; their descriptions live with the
//! others in `crate::metrics`).
//!
//! Guarantees: recorded once per successful analyze or assemble attempt
//! (fused or not), never failing; labels are fixed words —
//! `maas_analyses_total{needs_context,found}` (`found`: the analyzer named
//! a record of the user's memory), `maas_contexts_total{memory}` (`found`
//! when the context has a history block, else `none`) and the histogram
//! `maas_context_tokens{part}` (`total`: the whole context; `memory`: its
//! history block, recorded only when there is one).

use metrics::{counter, histogram};

use super::Analysis;

/// One valid analysis.
pub fn analysis(a: &Analysis) {
    let needs = if a.needs_context() { "true" } else { "false" };
    let found = if a.record_id().is_some() { "true" } else { "false" };
    counter!("maas_analyses_total", "needs_context" => needs, "found" => found).increment(1);
}

/// One assembled context: its size and its memory block's, in tokens.
pub fn context(total_tokens: usize, memory_tokens: Option<usize>) {
    #[allow(
        clippy::cast_precision_loss,
        reason = "a histogram sample is a float; token counts stay far below 2^52"
    )]
    let f = |n: usize| n as f64;
    histogram!("maas_context_tokens", "part" => "total").record(f(total_tokens));
    match memory_tokens {
        Some(m) => {
            histogram!("maas_context_tokens", "part" => "memory").record(f(m));
            counter!("maas_contexts_total", "memory" => "found").increment(1);
        }
        None => counter!("maas_contexts_total", "memory" => "none").increment(1),
    }
}
