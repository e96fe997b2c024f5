//! The memory search of a plan: one function for the pipeline's assemble
//! stage (`dispatcher`), the memory search of the doors ([`super::search`])
//! and the memory benchmark, so all of them run the same statement with the
//! same limits.
//!
//! Guarantees:
//! - The statement is [`repo::memory::search`] with the plan's search text
//!   and thread, the `[memory]` limits, and [`stage::memory::hits`] turns:
//!   the hit count follows `memory.budget_tokens` the same way for every
//!   caller.
//! - The semantic part is on when the caller gives the query's embedding
//!   (weighed with `memory.semantic_weight`); otherwise full text alone.
//! - The items come in the order the assembler packs them
//!   ([`MemoryPlan::arrange`]).

use uuid::Uuid;

use crate::config::MemoryConfig;
use crate::db;
use crate::model::MemoryItem;
use crate::repo;
use crate::stage::memory::{self, MemoryPlan};

/// Who the search is for: the user, and the request whose own turns are
/// left out (`Uuid::nil()` for a search outside a request).
#[derive(Debug, Clone, Copy)]
pub struct Searcher {
    pub user_id: Uuid,
    pub request_id: Uuid,
}

/// Runs the search `plan` asks for, for `who`, within the limits of `m`;
/// `embedding` is the query's embedding and its model, when the semantic
/// part is on. Returns the items in packing order.
pub async fn retrieve(
    client: &deadpool_postgres::Client,
    m: &MemoryConfig,
    plan: &MemoryPlan,
    who: Searcher,
    embedding: Option<(Vec<f32>, &str)>,
) -> Result<Vec<MemoryItem>, db::Error> {
    let semantic = embedding.map(|(embedding, model)| repo::memory::Semantic {
        embedding,
        model,
        weight: m.semantic_weight,
    });
    let search = repo::memory::MemorySearch {
        user_id: who.user_id,
        request_id: who.request_id,
        thread_id: plan.thread_id,
        thread_turns: m.thread_turns,
        query: &plan.query,
        hits: memory::hits(m),
        window: m.window,
        records: m.records,
        semantic,
    };
    Ok(plan.arrange(repo::memory::search(client, &search).await?))
}
