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
//! - Sub-queries: with a long-term search, each of the analysis'
//!   `sub_queries` (at most four) is one more search text, and its
//!   `entities` joined are one more after them (the search statement
//!   takes one text, an OR of its lexemes: the entities as a text of their
//!   own find the turns that name them without changing the query's
//!   ranking). Each is searched like the query (same limits and time
//!   range, no thread turns) and [`merge`] takes every search's hits in
//!   turn by rank, the query's first in each round. Without sub-queries or entities the plan, its statement and
//!   its order are exactly the query's.

use std::collections::HashSet;

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
    /// Further long-term search texts, searched beside `query`: the
    /// analysis' sub-queries, then its entities as one text; empty without
    /// a long-term search. At most [`MAX_SUB_QUERIES`](super::analysis::MAX_SUB_QUERIES) + 1.
    pub sub_queries: Vec<String>,
    /// The query speaks of its user in the first person
    /// ([`speaks_of_self`](crate::person::speaks_of_self)):
    /// the user's own turns score as a named speaker's in every search of
    /// the plan.
    pub first_person: bool,
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
            sub_queries: Vec::new(),
            first_person: crate::person::speaks_of_self(query),
        };
    };
    let first = a.needs_context() && crate::person::speaks_of_self(query);
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
        sub_queries: if a.needs_context() { sub_queries(a) } else { Vec::new() },
        first_person: first,
    }
}

/// The analysis' sub-queries, then its entities joined as one more text.
fn sub_queries(a: &Analysis) -> Vec<String> {
    let mut texts = a.sub_queries().to_vec();
    if !a.entities().is_empty() {
        texts.push(a.entities().join(" "));
    }
    texts
}

/// Whether two retrieved items are the same turn or record.
fn key(item: &MemoryItem) -> (bool, i64) {
    (item.is_record(), item.id)
}

/// The items of the query's search (`main`, as retrieved) and of its
/// sub-queries (`more`, one list per sub-query as retrieved) as one list in
/// packing order: the thread's turns first, as `main` has them; then the
/// long-term items of every search taken in turn, round robin by rank: the
/// query's first hit (with its window: the neighbours it brought), then
/// the first of each sub-query, then the query's second, and so on. A
/// question of several parts gets each part's strongest evidence before
/// any part's weaker one: with the query's hits first, a user whose
/// history fills the budget from the question alone got nothing of the
/// sub-queries. A turn or record already taken is dropped. With no
/// sub-query, `main` unchanged.
pub fn merge(main: Vec<MemoryItem>, more: Vec<Vec<MemoryItem>>) -> Vec<MemoryItem> {
    if more.is_empty() {
        return main;
    }
    let (mut out, rest): (Vec<MemoryItem>, Vec<MemoryItem>) = main.into_iter().partition(|i| i.why == FoundAs::Thread);
    let mut seen: HashSet<(bool, i64)> = out.iter().map(key).collect();
    // Each search's windows in rank order: a hit with its neighbours, or a
    // record alone.
    let mut ranked: Vec<_> = std::iter::once(rest)
        .chain(more)
        .map(|items| windows(items).into_iter())
        .collect();
    loop {
        let mut taken = false;
        for windows in &mut ranked {
            let Some(window) = windows.next() else { continue };
            taken = true;
            for item in window {
                if seen.insert(key(&item)) {
                    out.push(item);
                }
            }
        }
        if !taken {
            return out;
        }
    }
}

/// A search's long-term items grouped by what brought them (a hit's
/// window, or a record alone), in the order of the first of each group.
fn windows(items: Vec<MemoryItem>) -> Vec<Vec<MemoryItem>> {
    let mut groups: Vec<((bool, i64), Vec<MemoryItem>)> = Vec::new();
    for item in items.into_iter().filter(|i| i.why != FoundAs::Thread) {
        let by = if item.is_record() {
            (true, item.id)
        } else {
            (false, item.hit_id)
        };
        match groups.iter_mut().find(|(k, _)| *k == by) {
            Some((_, group)) => group.push(item),
            None => groups.push((by, vec![item])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
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
    fn a_question_in_the_first_person_asks_about_the_users_own_turns() {
        let a = analysis(r#"{"needs_context": true, "context_type": "topic"}"#);
        assert!(plan(Some(&a), "What did I paint?", None, Utc::now()).first_person);
        assert!(plan(None, "my dog", None, Utc::now()).first_person);
        let none = analysis(r#"{"needs_context": false, "context_type": "none"}"#);
        assert!(
            !plan(Some(&none), "What did I paint?", None, Utc::now()).first_person,
            "no long-term search"
        );
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

    fn at(d: i64) -> DateTime<Utc> {
        DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::days(d)
    }

    fn item(id: i64, why: FoundAs, day: i64) -> MemoryItem {
        MemoryItem {
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
        }
    }

    #[test]
    fn sub_queries_and_entities_are_searched_only_with_a_long_term_search() {
        let a = analysis(
            r#"{"needs_context": true, "context_type": "topic", "sub_queries": ["John visited Paris", "John Seattle"],
                "entities": ["John", "Paris"]}"#,
        );
        let p = plan(Some(&a), "Which cities has John been to?", None, Utc::now());
        assert_eq!(p.query, "Which cities has John been to?");
        assert_eq!(p.sub_queries, ["John visited Paris", "John Seattle", "John Paris"]);
        let off = analysis(r#"{"needs_context": false, "context_type": "none", "sub_queries": ["x"]}"#);
        assert!(plan(Some(&off), "q", None, Utc::now()).sub_queries.is_empty());
        let plain = analysis(r#"{"needs_context": true, "context_type": "topic"}"#);
        assert!(plan(Some(&plain), "q", None, Utc::now()).sub_queries.is_empty());
    }

    #[test]
    fn merge_takes_the_query_and_its_sub_queries_in_turn_by_rank() {
        let near = |id: i64, hit: i64| MemoryItem {
            hit_id: hit,
            ..item(id, FoundAs::Neighbour, 1)
        };
        let record = |id: i64| MemoryItem {
            kind: MemoryKind::Record,
            ..item(id, FoundAs::Record, 1)
        };
        let main = vec![item(1, FoundAs::Thread, 1), item(2, FoundAs::Hit, 1), near(3, 2)];
        let first = vec![
            item(10, FoundAs::Hit, 1),
            near(11, 10),
            item(12, FoundAs::Hit, 1),
            record(2),
        ];
        let second = vec![
            item(2, FoundAs::Hit, 1),
            near(20, 2),
            item(21, FoundAs::Hit, 1),
            item(10, FoundAs::Hit, 1),
        ];
        let got: Vec<(i64, bool)> = merge(main.clone(), vec![first, second])
            .iter()
            .map(|i| (i.id, i.is_record()))
            .collect();
        assert_eq!(
            got,
            [
                // the thread's turn first
                (1, false),
                // rank 1: the query's hit 2 with its neighbour 3, the
                // first's hit 10 with its neighbour, the second's hit 2
                // (taken already) with its new neighbour 20
                (2, false),
                (3, false),
                (10, false),
                (11, false),
                (20, false),
                // rank 2: the first's 12, the second's 21
                (12, false),
                (21, false),
                // rank 3: the first's record 2 (not turn 2), the second's
                // 10 taken already
                (2, true),
            ]
        );
        assert_eq!(merge(main.clone(), Vec::new()), main, "no sub-query: unchanged");
    }

    #[test]
    fn a_time_range_moves_items_inside_it_first() {
        let p = MemoryPlan {
            thread_id: None,
            query: "q".into(),
            recent: false,
            time_range: Some((at(10), at(20))),
            sub_queries: Vec::new(),
            first_person: false,
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
