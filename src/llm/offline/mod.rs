//! The offline provider: deterministic, in-process, no key, no network.
//!
//! It exists so that a fresh install (and every test that is not about a
//! provider) runs the whole pipeline without credentials. Its answers are
//! labelled: the responder's text starts with `[offline]`, the analysis
//! carries `"offline": true`, the archivist's summary starts with
//! `[offline]`, and the model is reported as `offline` unless configured
//! otherwise. The same request always yields the same answer, with one
//! exception: an archivist input that contains no timestamp at all gets the
//! current time as its bucket.
//!
//! What each role returns:
//! - **analyzer** — the analysis JSON of the Analyzer prompt:
//!   `needs_context`, `context_type` (`none` | `recent` | `topic` |
//!   `period`), `time_scope`, `search_keywords`, `context_found`
//!   (`lsm_record_id`, `period`, `relevance`). The query is the `user_query`
//!   (or `query`) field when the last user message is a JSON object, the
//!   text inside `<current_query>…</current_query>` when present, else the
//!   whole last user message. LSM records are JSON objects with an `id` and a
//!   `summary` (optionally `tags`, `time_bucket_start`, `time_bucket_end`)
//!   found anywhere in the system prompt or the messages — a whole message
//!   that is JSON, or a line of one. `needs_context` is true when there
//!   are records, or when the request's `earlier_turns` is above 0 and the
//!   query could use them (a personal reference, the past, a name);
//!   keywords are the query's distinct words of four or more letters (stop words dropped, at most 8); the record sharing the
//!   most keywords is `context_found` (ties: the first listed).
//!   `time_scope` is a date the query names, in ISO form (`in May 2023` →
//!   `2023-05`, `May 8, 2023` → `2023-05-08`, `in 2022` → `2022`,
//!   `summer 2023` → `2023-06/2023-08`), else a relative phrase it uses, as
//!   written (`last week`, `3 days ago`, `на прошлой неделе`: the request's
//!   time decides them), else `none` (found by
//!   [`timescope::find`](crate::timescope::find)); every one of them is a
//!   form [`Analysis::time_range`](crate::stage::Analysis::time_range) reads.
//!   `context_type` is `period` when there is such a scope or the query asks
//!   when something happened ("when did …", "когда"), `recent` when it is
//!   about the latest conversation ("what did I just say", "earlier",
//!   "последн…"); otherwise `topic` when the record found shares a keyword,
//!   `recent` when it shares none, `none` without records.
//! - **archivist** — the Archivist prompt's JSON: `time_bucket_start` and
//!   `time_bucket_end` (the earliest and latest timestamps in the input,
//!   RFC 3339), `tags` (the five most frequent words) and `summary`.
//! - **responder** — `[offline] You asked: "<query>". …`, naming the key
//!   terms and whether a history block (`<context_from_history>`) came with
//!   the query.
//!
//! Knobs (`[llm.offline]`): `latency_ms` delays each answer (a latency at or
//! above the role timeout becomes a timeout error),
//! `fail_when_query_contains` makes calls whose last user message contains
//! the marker fail with the retryable [`LlmError::Injected`], and
//! `stream_pace_ms` is the pause between two words of a streamed answer
//! (the first word goes at once; latency and stream together stay within
//! the role timeout, else the call is a timeout error).
//!
//! Layout: this file holds the provider and its dispatch by role;
//! `analyzer`, `archivist` and `responder` one role each; `request` reads
//! a request (texts, query), `words` picks keywords.

use std::time::Duration;

use chrono::Utc;
use serde_json::json;

use super::client::Completion;
use super::config::RoleSettings;
use super::{ChatRequest, Delta, DeltaSink, LlmError, ProviderKind, Role};

mod analyzer;
mod archivist;
mod request;
mod responder;
mod words;

pub(crate) use analyzer::analyze;
pub(crate) use archivist::archive;
pub(crate) use responder::respond;

/// The offline provider with its knobs.
#[derive(Debug, Clone)]
pub(crate) struct Offline {
    latency: Duration,
    pace: Duration,
    fail_marker: Option<String>,
}

impl Offline {
    pub(crate) fn new(latency: Duration, pace: Duration, fail_marker: Option<String>) -> Offline {
        Offline {
            latency,
            pace,
            fail_marker,
        }
    }

    /// The role's answer; with a sink, also sent to it word by word.
    pub(crate) async fn chat(
        &self,
        role: Role,
        settings: &RoleSettings,
        req: &ChatRequest,
        sink: Option<&DeltaSink>,
    ) -> Result<Completion, LlmError> {
        let done = self.answer(role, settings, req).await?;
        if let Some(sink) = sink {
            let left = settings.timeout.saturating_sub(self.latency);
            if tokio::time::timeout(left, self.stream(&done.text, sink)).await.is_err() {
                return Err(LlmError::Timeout {
                    provider: ProviderKind::Offline.as_str(),
                    message: format!(
                        "streaming at {} ms a word outlasts the role timeout",
                        self.pace.as_millis()
                    ),
                });
            }
        }
        Ok(done)
    }

    /// Sends `text` to `sink` a word (with the space after it) at a time,
    /// the pace apart.
    async fn stream(&self, text: &str, sink: &DeltaSink) {
        for (i, word) in text.split_inclusive(char::is_whitespace).enumerate() {
            if i > 0 && !self.pace.is_zero() {
                tokio::time::sleep(self.pace).await;
            }
            // A caller that stopped listening still gets the whole answer.
            let _ = sink.send(Delta::Text(word.to_owned()));
        }
    }

    async fn answer(&self, role: Role, settings: &RoleSettings, req: &ChatRequest) -> Result<Completion, LlmError> {
        if !self.latency.is_zero() {
            if self.latency >= settings.timeout {
                tokio::time::sleep(settings.timeout).await;
                return Err(LlmError::Timeout {
                    provider: ProviderKind::Offline.as_str(),
                    message: format!(
                        "simulated latency {} ms exceeds the role timeout",
                        self.latency.as_millis()
                    ),
                });
            }
            tokio::time::sleep(self.latency).await;
        }
        if let Some(marker) = &self.fail_marker {
            if req.last_user_message().is_some_and(|m| m.contains(marker)) {
                return Err(LlmError::Injected);
            }
        }
        let text = match role {
            Role::Analyzer => analyze(req).to_string(),
            Role::Archivist => archive(req, Utc::now()).to_string(),
            Role::Responder => respond(req),
        };
        Ok(Completion {
            prompt_tokens: Some(approx_tokens(req.prompt_chars())),
            completion_tokens: Some(approx_tokens(text.len())),
            text,
            model: None,
        })
    }
}

/// About four bytes a token: a usage figure for metrics, not a tokenizer.
fn approx_tokens(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(4)).unwrap_or(u32::MAX)
}

/// A valid analysis in the Analyzer prompt's shape, for fake providers in
/// benchmarks and drills that answer every role with the same text.
pub fn analysis_example() -> String {
    json!({
        "needs_context": false,
        "context_type": "none",
        "time_scope": "none",
        "search_keywords": [],
        "context_found": null,
    })
    .to_string()
}
