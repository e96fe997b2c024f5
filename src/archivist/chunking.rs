//! Chunking: a batch of a user's pending logs into the model calls that
//! summarise it.
//!
//! Guarantees: every log of the batch is in exactly one chunk, in order
//! within its thread; logs are grouped by thread (in order of first
//! appearance; logs without a thread form one group); no chunk's messages
//! exceed the token budget, except that a single message longer than the
//! budget is cut to it (its id is still covered, so its record still
//! accounts for it). Counting uses the archivist model's tokenizer or the
//! conservative estimate ([`TokenCounter`]).

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::json;
use uuid::Uuid;

use crate::llm::TokenCounter;
use crate::repo::archive::PendingLog;

/// One message of a chunk, as sent to the model.
#[derive(Debug, Clone)]
pub(super) struct ChunkMessage<'a> {
    pub(super) log: &'a PendingLog,
    /// The content, cut to the budget when one message alone exceeds it.
    pub(super) content: &'a str,
}

/// Groups logs by thread (in order of first appearance; logs without a
/// thread form one group) and splits each group so that no chunk's messages
/// exceed `budget` tokens. A single message longer than the budget is cut
/// to it (its id is still covered).
pub(super) fn plan_chunks<'a>(
    logs: &'a [PendingLog],
    counter: &TokenCounter,
    budget: usize,
) -> Vec<Vec<ChunkMessage<'a>>> {
    /// Tokens of a message's envelope (type, time, JSON punctuation).
    const ENVELOPE: usize = 24;
    let mut groups: Vec<(Option<Uuid>, Vec<&PendingLog>)> = Vec::new();
    for log in logs {
        match groups.iter_mut().find(|(t, _)| *t == log.thread_id) {
            Some((_, g)) => g.push(log),
            None => groups.push((log.thread_id, vec![log])),
        }
    }
    let room = budget.saturating_sub(ENVELOPE).max(1);
    let mut chunks = Vec::new();
    for (_, group) in groups {
        let mut current: Vec<ChunkMessage<'a>> = Vec::new();
        let mut used = 0usize;
        for log in group {
            let content = counter.truncate(&log.content, room);
            let tokens = counter.count(content) + ENVELOPE;
            if !current.is_empty() && used + tokens > budget {
                chunks.push(std::mem::take(&mut current));
                used = 0;
            }
            current.push(ChunkMessage { log, content });
            used += tokens;
        }
        if !current.is_empty() {
            chunks.push(current);
        }
    }
    chunks
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The archivist's input for one chunk: its period and its messages.
pub(super) fn render_chunk(chunk: &[ChunkMessage<'_>]) -> String {
    let start = chunk.iter().map(|m| m.log.created_at).min().unwrap_or_else(Utc::now);
    let end = chunk.iter().map(|m| m.log.created_at).max().unwrap_or_else(Utc::now);
    json!({
        "start_date": rfc3339(start),
        "end_date": rfc3339(end),
        "raw_logs": chunk.iter().map(|m| json!({
            "message_type": m.log.message_type,
            "content": m.content,
            "created_at": rfc3339(m.log.created_at),
        })).collect::<Vec<_>>(),
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use chrono::DateTime;
    use uuid::Uuid;

    use super::*;
    use crate::archivist::summary::parse_summary;
    use crate::llm::ChatRequest;

    fn log(id: i64, thread: Option<u128>, content: &str) -> PendingLog {
        PendingLog {
            id,
            user_seq: id,
            thread_id: thread.map(Uuid::from_u128),
            request_id: None,
            message_type: "user_query".into(),
            content: content.into(),
            created_at: DateTime::from_timestamp(1_700_000_000 + id, 0).unwrap_or_default(),
        }
    }

    fn ids(chunks: &[Vec<ChunkMessage<'_>>]) -> Vec<Vec<i64>> {
        chunks.iter().map(|c| c.iter().map(|m| m.log.id).collect()).collect()
    }

    #[test]
    fn groups_by_thread_in_order_of_first_appearance() {
        let logs = vec![
            log(1, Some(1), "a"),
            log(2, Some(2), "b"),
            log(3, Some(1), "c"),
            log(4, None, "d"),
            log(5, Some(2), "e"),
            log(6, None, "f"),
        ];
        let chunks = plan_chunks(&logs, &TokenCounter::estimate(), 1000);
        assert_eq!(ids(&chunks), vec![vec![1, 3], vec![2, 5], vec![4, 6]]);
    }

    #[test]
    fn splits_a_long_thread_by_the_budget_and_cuts_a_huge_message() {
        let long = "x".repeat(300); // 100 estimated tokens
        let logs: Vec<PendingLog> = (1..=5).map(|i| log(i, Some(1), &long)).collect();
        let chunks = plan_chunks(&logs, &TokenCounter::estimate(), 300);
        assert_eq!(ids(&chunks), vec![vec![1, 2], vec![3, 4], vec![5]]);
        let huge = vec![log(1, None, &"y".repeat(3000))];
        let chunks = plan_chunks(&huge, &TokenCounter::estimate(), 100);
        assert_eq!(chunks.len(), 1);
        assert!(chunks[0][0].content.len() < 300);
    }

    #[test]
    fn the_offline_archivist_answer_validates() {
        let logs = vec![log(1, None, "How do I prune tomato plants?"), log(2, None, "Weekly.")];
        let chunks = plan_chunks(&logs, &TokenCounter::estimate(), 1000);
        let req = ChatRequest::new(Some("Archivist".into()), render_chunk(&chunks[0]));
        let answer = crate::llm::offline::archive(&req, Utc::now()).to_string();
        let s = parse_summary(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
        assert_eq!(s.time_bucket_start, logs[0].created_at);
        assert_eq!(s.time_bucket_end, logs[1].created_at);
    }
}
