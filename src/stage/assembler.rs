//! The assemble stage: the seed's context "pie" — the system prompt, a
//! history block with the period and summary of the memory the analysis
//! found (only the user's own: the claim reads it with the user's id), and
//! the current query — within a token budget. The history is truncated
//! first; the query never.

use super::{StageError, StageInput, StageOutput, StageSuccess, Usage};
use crate::llm::TokenCounter;
use crate::model::{MemoryRecord, PromptRole};

pub fn run(counter: &TokenCounter, max_tokens: usize, input: &StageInput) -> Result<StageSuccess, StageError> {
    let Some(system) = input.prompts.get(PromptRole::Responder) else {
        return Err(StageError::fail(
            "no_prompt",
            format!("no active {} prompt in system_prompts", PromptRole::Responder),
        ));
    };
    let intro = input.prompts.get(PromptRole::Assembler).unwrap_or_default();
    let wanted = input.read_analysis().and_then(|a| a.record_id());
    let record = wanted.and_then(|id| input.memory.iter().find(|m| m.id == id));
    let context = assemble(counter, max_tokens, system, intro, record, &input.user_query);
    let tokens = counter.count(&context);
    Ok(StageSuccess {
        output: StageOutput::Context(context),
        usage: Usage {
            model: None,
            prompt_tokens: u32::try_from(tokens).ok(),
            completion_tokens: None,
        },
    })
}

/// Builds the pie, truncating the history summary to fit `max_tokens`.
pub fn assemble(
    counter: &TokenCounter,
    max_tokens: usize,
    system: &str,
    intro: &str,
    record: Option<&MemoryRecord>,
    query: &str,
) -> String {
    let head = format!("<system>\n{system}\n</system>\n\n");
    let tail = format!("<current_query>\n{query}\n</current_query>");
    let Some(record) = record else {
        return format!("{head}{tail}");
    };
    let period = format!(
        "Period: {} — {}",
        record.time_bucket_start.format("%Y-%m-%d %H:%M UTC"),
        record.time_bucket_end.format("%Y-%m-%d %H:%M UTC")
    );
    let open = if intro.is_empty() {
        format!("<context_from_history>\n{period}\n")
    } else {
        format!("<context_from_history>\n{intro}\n{period}\n")
    };
    let close = "\n</context_from_history>\n\n";
    let fixed = counter.count(&head) + counter.count(&open) + counter.count(close) + counter.count(&tail);
    let room = max_tokens.saturating_sub(fixed);
    if room == 0 {
        // Not even the frame of a history block fits: drop it.
        return format!("{head}{tail}");
    }
    let summary = counter.truncate(&record.summary, room);
    format!("{head}{open}{summary}{close}{tail}")
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn record(summary: &str) -> MemoryRecord {
        MemoryRecord {
            id: 1,
            time_bucket_start: chrono::Utc
                .with_ymd_and_hms(2026, 5, 1, 9, 0, 0)
                .single()
                .unwrap_or_default(),
            time_bucket_end: chrono::Utc
                .with_ymd_and_hms(2026, 5, 7, 18, 0, 0)
                .single()
                .unwrap_or_default(),
            tags: vec!["trip".into()],
            summary: summary.into(),
        }
    }

    #[test]
    fn the_pie_has_system_history_and_query() {
        let c = TokenCounter::estimate();
        let pie = assemble(
            &c,
            10_000,
            "SYS",
            "INTRO",
            Some(&record("went to Lisbon")),
            "Where did I go?",
        );
        assert!(pie.starts_with("<system>\nSYS\n</system>"));
        assert!(pie.contains(
            "<context_from_history>\nINTRO\nPeriod: 2026-05-01 09:00 UTC — 2026-05-07 18:00 UTC\nwent to Lisbon"
        ));
        assert!(pie.ends_with("<current_query>\nWhere did I go?\n</current_query>"));
        let bare = assemble(&c, 10_000, "SYS", "INTRO", None, "Where did I go?");
        assert!(!bare.contains("context_from_history"));
    }

    #[test]
    fn history_is_truncated_first_and_the_query_never() {
        let c = TokenCounter::estimate();
        let long = "memory ".repeat(2_000);
        let query = "q ".repeat(300);
        let pie = assemble(&c, 800, "SYS", "", Some(&record(&long)), &query);
        assert!(c.count(&pie) <= 800, "{}", c.count(&pie));
        assert!(pie.contains(&query), "the query is whole");
        assert!(pie.contains("<context_from_history>"));
        // A query bigger than the budget is still sent whole, without history.
        let huge = "q ".repeat(2_000);
        let pie = assemble(&c, 800, "SYS", "", Some(&record(&long)), &huge);
        assert!(pie.contains(&huge));
        assert!(!pie.contains("memory"));
    }
}
