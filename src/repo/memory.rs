//! A request's memory (`raw_logs` and `lsm_storage`, read only): the newest
//! turns of its thread and the turns and records its query finds, in one
//! statement (`memory_search.sql`).
//!
//! Guarantees: every scan is filtered by the request's user and goes
//! through an index that leads with `user_id` (invariant 7); the request's
//! own turns are never returned; one round trip.

use deadpool_postgres::{Client, GenericClient};
use tokio_postgres::Row;
use uuid::Uuid;

use super::{FromRow, as_limit, rows_as};
use crate::db::Error;
use crate::model::MemoryItem;

/// The parts of the memory search (`memory_search.sql` says what each
/// holds); the full-text statement has nothing of the semantic part.
macro_rules! part {
    ($name:literal) => {
        include_str!(concat!("../../sql/queries/", $name, ".sql"))
    };
}

super::statements! {
    SEARCH = "memory_search": concat!(part!("memory_search"), part!("memory_search_fulltext"), part!("memory_search_items")),
    SEARCH_SEMANTIC = "memory_search_semantic":
        concat!(part!("memory_search"), part!("memory_search_semantic"), part!("memory_search_items")),
    COMMON_LEXEMES = "memory_common_lexemes",
}

/// The least logged turns of a user whose common lexemes are counted
/// (below it a common lexeme's lookup costs little).
pub const COMMON_LEXEMES_FROM: i64 = 5_000;

/// Counts `user`'s common lexemes (in at least 256 of its turns) when due:
/// it has `logged` turns, at least `from`, and was never counted or has
/// doubled since (`memory_common_lexemes.sql`). The search then skips
/// their lookups. Returns the lexemes stored (0: not due).
pub async fn count_common_lexemes(
    client: &impl super::GenericClient,
    user: Uuid,
    logged: i64,
    from: i64,
) -> Result<i64, Error> {
    if logged < from {
        // (not due, as the statement would say: no round trip)
        return Ok(0);
    }
    super::query_one_value(client, COMMON_LEXEMES, &[&user, &logged, &from], "lexemes").await
}

/// What to retrieve for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct MemorySearch<'a> {
    pub user_id: Uuid,
    /// The request itself: its own turns are left out.
    pub request_id: Uuid,
    /// The request's thread, for the short-term turns (`None`: none).
    pub thread_id: Option<Uuid>,
    /// Most turns of the thread.
    pub thread_turns: usize,
    /// The search text; empty: no long-term search.
    pub query: &'a str,
    /// Most matching turns.
    pub hits: usize,
    /// Same-thread neighbours each side of each of the five strongest hits.
    pub window: usize,
    /// Most matching records.
    pub records: usize,
    /// The query speaks of its user in the first person: the user's own
    /// turns score as a named speaker's (see `memory_search.sql`).
    pub first_person: bool,
    /// The semantic part, when embeddings are on.
    pub semantic: Option<Semantic<'a>>,
}

/// The semantic part of a search: the query's embedding and how much it
/// weighs (see `memory_search_semantic.sql`). The caller embeds the query;
/// this layer takes vectors, never a model.
#[derive(Debug, Clone, PartialEq)]
pub struct Semantic<'a> {
    /// The query's embedding (unit length).
    pub embedding: &'a [f32],
    /// The model that made it; only turn embeddings of this model count.
    pub model: &'a str,
    /// Weight of the cosine in a hit's score, 0 to 1.
    pub weight: f64,
}

super::statement_params! {
    /// The inputs of `memory_search.sql`, `$1` to `$9` in field order.
    struct SearchParams<'a> {
        user_id: Uuid,
        query: &'a str,
        hits: i32,
        window: i32,
        records: i32,
        thread_id: Option<Uuid>,
        thread_turns: i32,
        request_id: Uuid,
        first_person: bool,
    }
}

super::statement_params! {
    /// The further inputs of `memory_search_semantic.sql`, `$10` to `$12`.
    struct SemanticParams<'a> {
        embedding: &'a [f32],
        model: &'a str,
        weight: f64,
    }
}

fn int(n: usize) -> i32 {
    i32::try_from(as_limit(n)).unwrap_or(i32::MAX)
}

impl FromRow for MemoryItem {
    /// A row of the memory search.
    fn from_row(r: &Row) -> Result<MemoryItem, Error> {
        Ok(MemoryItem {
            kind: super::column(r, "kind")?,
            id: r.try_get("id")?,
            why: super::column(r, "why")?,
            score: r.try_get("score")?,
            hit_id: r.try_get("hit_id")?,
            thread_id: r.try_get("thread_id")?,
            message_type: r.try_get("message_type")?,
            content: r.try_get("content")?,
            created_at: r.try_get("created_at")?,
            period_end: r.try_get("period_end")?,
        })
    }
}

/// Run with a generic plan: a custom plan of this statement costs about a
/// millisecond to plan and chose worse joins where measured (8 ms against
/// 2.5 ms), and a pooled connection makes five of them before PostgreSQL
/// settles on the generic one. `SET LOCAL` keeps the setting to this
/// statement's transaction (behind a transaction-mode pooler, where the
/// statement is unnamed, the generic plan is made at each run).
const BEGIN_GENERIC: &str = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan";

/// The thread's newest turns (newest first), then the long-term items in
/// packing order (see `memory_search.sql`); with `semantic`, the hits are
/// ranked by full text and embeddings together. One statement, in a transaction
/// of its own that asks for the generic plan: `BEGIN; SET LOCAL`, the
/// statement and `COMMIT` go out together, one round trip (the driver
/// sends requests in the order they are first polled). All three are
/// queued at once, so the transaction ends however the caller stops
/// waiting (a failed statement makes the `COMMIT` a rollback), and behind
/// a transaction-mode pooler they are one transaction on one server
/// connection. It takes a pooled connection, never a transaction: its
/// `COMMIT` would end the caller's.
pub async fn search(client: &Client, s: &MemorySearch<'_>) -> Result<Vec<MemoryItem>, Error> {
    let long_term = !s.query.trim().is_empty();
    let params = SearchParams {
        user_id: s.user_id,
        query: if long_term { s.query } else { "" },
        hits: if long_term { int(s.hits) } else { 0 },
        window: int(s.window),
        records: if long_term { int(s.records) } else { 0 },
        thread_id: s.thread_id,
        thread_turns: int(s.thread_turns),
        request_id: s.request_id,
        first_person: long_term && s.first_person,
    };
    let semantic = s.semantic.as_ref().filter(|_| long_term).map(|m| SemanticParams {
        embedding: m.embedding,
        model: m.model,
        weight: m.weight.clamp(0.0, 1.0),
    });
    let mut values = params.params();
    let sql = match &semantic {
        Some(more) => {
            values.extend(more.params());
            SEARCH_SEMANTIC
        }
        None => SEARCH,
    };
    let (begin, rows, commit) = if crate::db::unnamed_statements() {
        let typed = super::typed(&values);
        futures_util::join!(
            client.batch_execute(BEGIN_GENERIC),
            client.query_typed(sql, &typed),
            client.batch_execute("COMMIT")
        )
    } else {
        // Prepared (and cached) before the three go out, so nothing comes
        // between them.
        let stmt = client.prepare_cached(sql).await?;
        futures_util::join!(
            client.batch_execute(BEGIN_GENERIC),
            client.query(&stmt, &values),
            client.batch_execute("COMMIT")
        )
    };
    begin?;
    let rows = rows?;
    commit?;
    rows_as(&rows)
}

#[cfg(test)]
mod tests {
    use super::super::params_check::check;
    use super::*;

    #[test]
    fn search_params_are_in_the_order_the_sql_documents() {
        check(SEARCH, SearchParams::NAMES);
        let all: Vec<&str> = SearchParams::NAMES
            .iter()
            .chain(SemanticParams::NAMES)
            .copied()
            .collect();
        check(SEARCH_SEMANTIC, &all);
    }
}
