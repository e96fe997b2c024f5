//! The memory an assemble stage packs (fused or not), read as the stage
//! layer plans it ([`memory::plan_for`]).
//!
//! - The statements are the one search of a plan
//!   ([`crate::users::retrieve`], as the doors and the memory benchmark
//!   run it): one for the query, none when the plan needs none (no
//!   long-term search and no thread).
//! - One more for each of the plan's sub-queries (at most five: the
//!   analysis' sub-queries and its entities), on the same connection after
//!   the query's, with the same limits and no thread turns; each
//!   sub-query is embedded like the query when embeddings are on (one
//!   embedding each, all at once). [`memory::merge`] takes every search's
//!   hits in turn by rank, the query's first in each round, before the
//!   plan arranges them. A plan without
//!   sub-queries runs exactly the statement it always ran.
//! - A failure of any of them is a retryable stage error; the whole read
//!   is bounded by the stage timeout, and timed
//!   (`maas_memory_search_duration_seconds`, by result).

use futures_util::future::join_all;

use super::Engine;
use crate::llm::embed::Embedder;
use crate::model::MemoryItem;
use crate::stage::{StageError, StageInput, memory};
use crate::users::Embedded;

impl Engine {
    /// Reads the memory the assemble stage packs into `input.retrieved`
    /// (see the module doc). A failure is a retryable stage error.
    pub(super) async fn retrieve(&self, input: &mut StageInput) -> Result<(), StageError> {
        let plan = memory::plan_for(input, chrono::Utc::now());
        if !plan.needs_statement() {
            return Ok(());
        }
        let (query, more) = self.embeddings(input, &plan).await;
        let who = crate::users::Searcher {
            user_id: input.user_id,
            request_id: input.request_id,
        };
        input.retrieved = self.read(&plan, who, &query, &more).await?;
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

    /// Runs the plan's searches ([`crate::users::retrieve`]) on one pooled
    /// connection within the stage timeout.
    async fn read(
        &self,
        plan: &memory::MemoryPlan,
        who: crate::users::Searcher,
        query: &Embedded,
        more: &[Embedded],
    ) -> Result<Vec<MemoryItem>, StageError> {
        let read = async {
            let client = self.pool.get().await?;
            crate::users::retrieve(&client, &self.cfg.memory, plan, who, query, more).await
        };
        let started = std::time::Instant::now();
        let read = tokio::time::timeout(self.cfg.stage_timeout(), read).await;
        let result = match &read {
            Ok(Ok(_)) => "ok",
            Ok(Err(_)) => "error",
            Err(_) => "timeout",
        };
        crate::metrics::memory_search(result, started.elapsed());
        match read {
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
