//! The memory an assemble stage packs (fused or not), read as the stage
//! layer plans it ([`memory::plan_for`]).
//!
//! - One statement for the query (`repo::memory::search`), none when the
//!   plan needs none (no long-term search and no thread).
//! - One more for each of the plan's sub-queries (at most five: the
//!   analysis' sub-queries and its entities), on the same connection after
//!   the query's, with the same limits and no thread turns; each
//!   sub-query is embedded like the query when embeddings are on (one
//!   embedding each, all at once). [`memory::merge`] puts their items after
//!   the query's before the plan arranges them. A plan without
//!   sub-queries runs exactly the statement it always ran.
//! - A failure of any of them is a retryable stage error; the whole read
//!   is bounded by the stage timeout.

use futures_util::future::join_all;

use super::Engine;
use crate::config::MemoryConfig;
use crate::llm::embed::Embedder;
use crate::model::MemoryItem;
use crate::repo::{self, memory::MemorySearch};
use crate::stage::{StageError, StageInput, memory};

/// A search text's embedding and the model that made it, if any.
type Embedded = Option<(Vec<f32>, String)>;

/// The long-term search of `text` for `input`'s request, with the daemon's
/// limits and `text`'s embedding; no thread turns.
fn searched<'a>(input: &StageInput, m: &MemoryConfig, text: &'a str, embedded: &'a Embedded) -> MemorySearch<'a> {
    MemorySearch {
        user_id: input.user_id,
        request_id: input.request_id,
        thread_id: None,
        thread_turns: m.thread_turns,
        query: text,
        hits: m.hits,
        window: m.window,
        records: m.records,
        semantic: embedded.as_ref().map(|(embedding, model)| repo::memory::Semantic {
            embedding: embedding.clone(),
            model,
            weight: m.semantic_weight,
        }),
    }
}

impl Engine {
    /// Reads the memory the assemble stage packs into `input.retrieved`
    /// (see the module doc). A failure is a retryable stage error.
    pub(super) async fn retrieve(&self, input: &mut StageInput) -> Result<(), StageError> {
        let plan = memory::plan_for(input, chrono::Utc::now());
        if !plan.needs_statement() {
            return Ok(());
        }
        let (query, more) = self.embeddings(input, &plan).await;
        let search = |text, embedded| searched(input, &self.cfg.memory, text, embedded);
        let main = MemorySearch {
            thread_id: plan.thread_id,
            ..search(&plan.query, &query)
        };
        let subs: Vec<MemorySearch<'_>> = plan.sub_queries.iter().zip(&more).map(|(q, e)| search(q, e)).collect();
        let (items, found) = self.read(&main, &subs).await?;
        input.retrieved = plan.arrange(memory::merge(items, found));
        Ok(())
    }

    /// The embeddings of the plan's query (the request's query alone, and
    /// only for a long-term search: the one made while the analyzer ran,
    /// by this embedder's model, or a new one) and of each sub-query.
    async fn embeddings(&self, input: &mut StageInput, plan: &memory::MemoryPlan) -> (Embedded, Vec<Embedded>) {
        let embedder = self.embedder.as_ref().filter(|_| !plan.query.trim().is_empty());
        let early = input
            .query_embedding
            .take()
            .filter(|(_, model)| embedder.is_some_and(|e| e.model() == model));
        let owned = |found: Option<(Vec<f32>, &str)>| found.map(|(e, model)| (e, model.to_owned()));
        let query = async {
            match early {
                Some(found) => Some(found),
                None => owned(Embedder::for_search(embedder, &input.user_query).await),
            }
        };
        let more = join_all(
            plan.sub_queries
                .iter()
                .map(|q| async move { owned(Embedder::for_search(embedder, q).await) }),
        );
        tokio::join!(query, more)
    }

    /// Runs the query's search, then each sub-query's, on one pooled
    /// connection within the stage timeout.
    async fn read(
        &self,
        main: &MemorySearch<'_>,
        subs: &[MemorySearch<'_>],
    ) -> Result<(Vec<MemoryItem>, Vec<Vec<MemoryItem>>), StageError> {
        let read = async {
            let client = self.pool.get().await?;
            let items = repo::memory::search(&client, main).await?;
            let mut found = Vec::with_capacity(subs.len());
            for s in subs {
                found.push(repo::memory::search(&client, s).await?);
            }
            Ok::<_, crate::db::Error>((items, found))
        };
        match tokio::time::timeout(self.cfg.stage_timeout(), read).await {
            Ok(Ok(read)) => Ok(read),
            Ok(Err(e)) => Err(StageError::retry(
                "memory_search",
                format!("reading the memory failed: {e}"),
            )),
            Err(_) => Err(StageError::retry(
                "memory_search",
                format!(
                    "reading the memory did not finish within {} s",
                    self.cfg.stage_timeout_secs
                ),
            )),
        }
    }
}
