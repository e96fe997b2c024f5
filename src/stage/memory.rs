//! What memory a request's context draws on, decided from its analysis:
//! the [`MemoryPlan`] the dispatcher hands to the retrieval
//! (`repo::memory::search`), and the order of what it found.
//!
//! Guarantees:
//! - `needs_context = false` means no long-term search; the turns of the
//!   request's own thread are read whatever the analysis says.
//! - The search text is the request's query followed by the analysis'
//!   `search_keywords` (a repeated word adds no lexeme).
//! - `context_type` picks the strategy: `recent` gives the thread's turns
//!   the whole memory budget first (newest first); `topic` and every other
//!   value the search by score; a time range from the analysis
//!   ([`Analysis::time_range`]) moves the items inside it ahead of the
//!   others (`period`), keeping their order.
//! - A plan that needs nothing ([`MemoryPlan::needs_statement`] false: no
//!   search and no thread) runs no statement.
//! - The long-term search asks for [`hits`] turns: `memory.hits`, scaled
//!   up in proportion to `memory.budget_tokens` above
//!   [`HITS_BUDGET_TOKENS`], so a larger budget has candidates to fill it
//!   (every caller of the search takes the count from here).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Analysis, StageInput};
use crate::config::MemoryConfig;
use crate::model::{FoundAs, MemoryItem};

/// The long-term budget `memory.hits` is meant for: the default
/// `memory.budget_tokens`, at which 40 hits were measured to fill the block
/// (a LoCoMo turn's line costs about 40 tokens, one per three bytes, and
/// the five strongest hits bring up to four neighbours each).
pub const HITS_BUDGET_TOKENS: usize = 2000;

/// How many turns the long-term search asks for: `memory.hits` at a budget
/// of [`HITS_BUDGET_TOKENS`] or less, and in proportion above it (80 at
/// 4,000 tokens with the default 40), so a larger budget has candidates to
/// fill it; never fewer than `memory.hits`.
pub fn hits(m: &MemoryConfig) -> usize {
    m.hits.max(m.hits.saturating_mul(m.budget_tokens) / HITS_BUDGET_TOKENS)
}

/// What to retrieve for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    /// The thread whose newest turns are the short-term memory.
    pub thread_id: Option<Uuid>,
    /// The long-term search text; empty: no long-term search.
    pub query: String,
    /// The thread's turns first, with the whole budget (`recent`).
    pub recent: bool,
    /// Items inside this range come first (`period`).
    pub time_range: Option<(DateTime<Utc>, DateTime<Utc>)>,
}

impl MemoryPlan {
    /// Whether the plan needs the retrieval statement at all.
    pub fn needs_statement(&self) -> bool {
        self.thread_id.is_some() || !self.query.trim().is_empty()
    }

    /// The retrieved items in the order the assembler packs them: the
    /// thread's turns as retrieved (newest first), then the long-term items
    /// with those inside the time range (if any) ahead of the rest, each
    /// group in retrieval order.
    pub fn arrange(&self, items: Vec<MemoryItem>) -> Vec<MemoryItem> {
        let Some((from, to)) = self.time_range else {
            return items;
        };
        let inside = |i: &MemoryItem| {
            let end = i.period_end.unwrap_or(i.created_at);
            i.created_at <= to && end >= from
        };
        let (thread, rest): (Vec<_>, Vec<_>) = items.into_iter().partition(|i| i.why == FoundAs::Thread);
        let (mut out, outside): (Vec<_>, Vec<_>) = rest.into_iter().partition(inside);
        let mut all = thread;
        all.append(&mut out);
        all.extend(outside);
        all
    }
}

/// The plan for a query, its thread and its analysis (`None`: the query
/// alone is searched).
pub fn plan(analysis: Option<&Analysis>, query: &str, thread: Option<Uuid>, now: DateTime<Utc>) -> MemoryPlan {
    let Some(a) = analysis else {
        return MemoryPlan {
            thread_id: thread,
            query: query.to_owned(),
            recent: false,
            time_range: None,
        };
    };
    let query = if a.needs_context() {
        let mut q = query.to_owned();
        for k in a.search_keywords() {
            q.push(' ');
            q.push_str(k);
        }
        q
    } else {
        String::new()
    };
    MemoryPlan {
        thread_id: thread,
        query,
        recent: a.context_type() == "recent",
        time_range: if a.needs_context() { a.time_range(now) } else { None },
    }
}

/// The plan of a stage input (the assemble stage's, or the fused one's).
pub fn plan_for(input: &StageInput, now: DateTime<Utc>) -> MemoryPlan {
    plan(input.read_analysis().as_ref(), &input.user_query, input.thread_id, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MemoryKind;

    fn analysis(json: &str) -> Analysis {
        Analysis::parse(json).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn no_context_means_no_long_term_search_but_the_thread_stays() {
        let a = analysis(r#"{"needs_context": false, "context_type": "none", "search_keywords": ["x"]}"#);
        let t = Uuid::new_v4();
        let p = plan(Some(&a), "Where is my sister moving?", Some(t), Utc::now());
        assert!(p.query.is_empty());
        assert_eq!(p.thread_id, Some(t));
        assert!(p.needs_statement());
        let p = plan(Some(&a), "hello", None, Utc::now());
        assert!(!p.needs_statement(), "no search and no thread: no statement");
    }

    #[test]
    fn the_search_is_the_query_and_the_keywords() {
        let a =
            analysis(r#"{"needs_context": true, "context_type": "topic", "search_keywords": ["lisbon", "sister"]}"#);
        let p = plan(Some(&a), "Where is she moving?", None, Utc::now());
        assert_eq!(p.query, "Where is she moving? lisbon sister");
        assert!(!p.recent);
        let r = analysis(r#"{"needs_context": true, "context_type": "recent"}"#);
        assert!(plan(Some(&r), "q", None, Utc::now()).recent);
        assert_eq!(plan(None, "q", None, Utc::now()).query, "q");
    }

    #[test]
    fn the_hits_grow_with_the_budget_never_below_the_setting() {
        let m = |budget_tokens, hits| MemoryConfig {
            budget_tokens,
            hits,
            ..MemoryConfig::default()
        };
        assert_eq!(hits(&MemoryConfig::default()), MemoryConfig::default().hits);
        assert_eq!(hits(&m(2000, 40)), 40);
        assert_eq!(hits(&m(4000, 40)), 80);
        assert_eq!(hits(&m(1000, 40)), 40);
        assert_eq!(hits(&m(4000, 1)), 2);
        assert_eq!(
            hits(&m(2000, 1)),
            1,
            "a setting below the default holds at the default budget"
        );
    }

    #[test]
    fn a_time_range_moves_items_inside_it_first() {
        let at = |d: i64| DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::days(d);
        let item = |id: i64, why: FoundAs, day: i64| MemoryItem {
            kind: MemoryKind::Turn,
            id,
            why,
            score: 1.0,
            hit_id: id,
            thread_id: None,
            message_type: Some("user_query".into()),
            content: String::new(),
            created_at: at(day),
            period_end: None,
        };
        let p = MemoryPlan {
            thread_id: None,
            query: "q".into(),
            recent: false,
            time_range: Some((at(10), at(20))),
        };
        let got = p.arrange(vec![
            item(1, FoundAs::Thread, 1),
            item(2, FoundAs::Hit, 1),
            item(3, FoundAs::Hit, 15),
            item(4, FoundAs::Neighbour, 12),
        ]);
        let ids: Vec<i64> = got.iter().map(|i| i.id).collect();
        assert_eq!(ids, [1, 3, 4, 2]);
    }
}
