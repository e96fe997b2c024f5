//! The `[memory]` section: what the assemble stage retrieves and how much
//! of it goes into a context.
//!
//! Guarantees: plain data with its defaults (the figures measured in
//! `BENCHMARKS.md`, the memory entries); [`MemoryConfig::problem`] names
//! the key of an invalid value. This module imports nothing of the crate.

use serde::{Deserialize, Serialize};

/// `[memory]`: retrieval and packing of the user's memory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct MemoryConfig {
    /// Token budget of the long-term memory lines of a context (counted as
    /// the assembler counts). Default 2000.
    pub budget_tokens: usize,
    /// Token budget of the short-term memory: the newest turns of the
    /// request's own thread, newest first. Default 500.
    pub thread_budget_tokens: usize,
    /// Most turns of the thread read for the short-term memory. Default 20.
    pub thread_turns: usize,
    /// Most matching turns of the long-term search at a `budget_tokens` of
    /// 2000 or less; a larger budget asks for proportionally more
    /// (`stage::memory::hits`). Default 40.
    pub hits: usize,
    /// Same-thread neighbours each side of each of the five strongest
    /// hits (the other hits come alone). Default 2.
    pub window: usize,
    /// Most matching records (`lsm_storage`). Default 0 (the offline
    /// archivist's summaries never helped; 1 with a model's summaries).
    pub records: usize,
    /// Weight of the semantic part (the cosine of embeddings) in a hit's
    /// score, 0 to 1, when `[llm.embedding]` is on; the full-text score
    /// weighs the rest. Default 0.6 (fitted on LoCoMo's development half,
    /// leave one conversation out: BENCHMARKS.md, session 27).
    pub semantic_weight: f64,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            budget_tokens: 2000,
            thread_budget_tokens: 500,
            thread_turns: 20,
            hits: 40,
            window: 2,
            records: 0,
            semantic_weight: 0.6,
        }
    }
}

impl MemoryConfig {
    /// The key and problem of the first invalid value, if any.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        if !(0.0..=1.0).contains(&self.semantic_weight) {
            return Some((
                "memory.semantic_weight",
                format!("must be between 0 and 1 (got {})", self.semantic_weight),
            ));
        }
        for (key, v, max) in [
            ("memory.hits", self.hits, 1000),
            ("memory.window", self.window, 10),
            ("memory.records", self.records, 100),
            ("memory.thread_turns", self.thread_turns, 1000),
        ] {
            if v > max {
                return Some((key, format!("must be at most {max} (got {v})")));
            }
        }
        None
    }
}
