//! The memory search of a plan: one function for the pipeline's assemble
//! stage (`dispatcher`), the memory search of the doors ([`super::search`])
//! and the memory benchmark, so all of them run the same statements with
//! the same limits.
//!
//! Guarantees:
//! - The query's statement is [`repo::memory::search`] with the plan's
//!   search text and thread, the `[memory]` limits, and
//!   [`stage::memory::hits`] turns: the hit count follows
//!   `memory.budget_tokens` the same way for every caller.
//! - Each of the plan's sub-queries is one more statement on the same
//!   connection, after the query's, with the same limits and no thread
//!   turns; [`memory::merge`] takes every search's hits in turn by rank,
//!   the query's first in each round. A plan without sub-queries runs
//!   exactly the query's statement.
//! - The semantic part of a statement is on when the caller gives its
//!   text's embedding (weighed with `memory.semantic_weight`); otherwise
//!   full text alone.
//! - The items come in the order the assembler packs them
//!   ([`MemoryPlan::arrange`]).

use uuid::Uuid;

use crate::config::MemoryConfig;
use crate::db;
use crate::model::MemoryItem;
use crate::repo::{self, memory::MemorySearch};
use crate::stage::memory::{self, MemoryPlan};

/// Who the search is for: the user, and the request whose own turns are
/// left out (`Uuid::nil()` for a search outside a request).
#[derive(Debug, Clone, Copy)]
pub struct Searcher {
    pub user_id: Uuid,
    pub request_id: Uuid,
}

/// A search text's embedding and the model that made it, if any.
pub type Embedded = Option<(Vec<f32>, String)>;

/// Runs the searches `plan` asks for, for `who`, within the limits of `m`:
/// the query's with `query` (its embedding), then each sub-query's with
/// the embedding of the same rank in `sub_queries` (none where missing).
/// Returns the items in packing order.
pub async fn retrieve(
    client: &deadpool_postgres::Client,
    m: &MemoryConfig,
    plan: &MemoryPlan,
    who: Searcher,
    query: &Embedded,
    sub_queries: &[Embedded],
) -> Result<Vec<MemoryItem>, db::Error> {
    let main = MemorySearch {
        thread_id: plan.thread_id,
        ..search_of(m, plan, who, &plan.query, Some(query))
    };
    let items = repo::memory::search(client, &main).await?;
    let mut found = Vec::with_capacity(plan.sub_queries.len());
    for (i, text) in plan.sub_queries.iter().enumerate() {
        found.push(repo::memory::search(client, &search_of(m, plan, who, text, sub_queries.get(i))).await?);
    }
    Ok(plan.arrange(memory::merge(items, found)))
}

/// The long-term search of `text` (the plan's query or one of its
/// sub-queries) for `who` within the limits of `m`, with `embedded` as its
/// semantic part; no thread turns.
fn search_of<'a>(
    m: &MemoryConfig,
    plan: &MemoryPlan,
    who: Searcher,
    text: &'a str,
    embedded: Option<&'a Embedded>,
) -> MemorySearch<'a> {
    MemorySearch {
        user_id: who.user_id,
        request_id: who.request_id,
        thread_id: None,
        thread_turns: m.thread_turns,
        query: text,
        hits: memory::hits(m),
        window: m.window,
        records: m.records,
        first_person: plan.first_person,
        semantic: embedded
            .and_then(Option::as_ref)
            .map(|(embedding, model)| repo::memory::Semantic {
                embedding,
                model,
                weight: m.semantic_weight,
            }),
    }
}
