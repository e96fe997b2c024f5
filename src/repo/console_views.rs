//! The operator console's reads beyond the request list: a user's memory
//! actions, a role's prompt versions and the prompt changes, and the
//! overview's last-hour aggregates (finished requests and stage latency
//! per bucket, model calls per stage and model). Read-only.
//!
//! Guarantees: every statement reads through an index that bounds it
//! (named in its SQL) — the user's actions by `detail->>'user_id'`, the
//! last hour by `pipeline_runs_finished_idx` and
//! `pipeline_steps_finished_brin` — so none grows with the tables.

use super::GenericClient;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::as_limit;
use crate::db::Error;

super::statements! {
    USER_ACTIONS = "console_user_actions",
    PROMPT_VERSIONS = "console_prompt_versions",
    PROMPT_ACTIONS = "console_prompt_actions",
    THROUGHPUT = "console_throughput",
    LATENCY = "console_latency",
    MODELS = "console_models",
}

/// An operator action that concerns no single request: the same row as
/// a request's ([`super::audit::Action`]), its statuses empty.
pub use super::audit::Action;

/// The newest `limit` actions about `user`'s memory, newest first.
pub async fn user_actions(client: &impl GenericClient, user: Uuid, limit: usize) -> Result<Vec<Action>, Error> {
    super::query_as(client, USER_ACTIONS, &[&user, &as_limit(limit)]).await
}

super::row_struct! {
    /// One kept version of a role's prompt (without its text).
    #[derive(Debug, Clone, Serialize)]
    pub struct PromptVersion {
        pub version: i32,
        pub active = "is_active": bool,
        pub created_at: DateTime<Utc>,
        pub chars: i32,
    }
}

/// Every version of `role`'s prompt, newest first.
pub async fn prompt_versions(client: &impl GenericClient, role: &str) -> Result<Vec<PromptVersion>, Error> {
    super::query_as(client, PROMPT_VERSIONS, &[&role]).await
}

/// The newest `limit` prompt changes (`prompt_set`, `prompt_activate`).
pub async fn prompt_actions(client: &impl GenericClient, limit: usize) -> Result<Vec<Action>, Error> {
    super::query_as(client, PROMPT_ACTIONS, &[&as_limit(limit)]).await
}

super::row_struct! {
    /// Requests finished in one bucket of the last hour.
    #[derive(Debug, Clone, Serialize)]
    pub struct Finished {
        pub bucket: i32,
        pub completed: i64,
        pub failed: i64,
        pub cancelled: i64,
    }
}

/// Requests finished in the last `buckets × width`, per bucket (0 the
/// oldest); buckets with none are left out.
pub async fn throughput(
    client: &impl GenericClient,
    buckets: i32,
    width: std::time::Duration,
) -> Result<Vec<Finished>, Error> {
    super::query_as(client, THROUGHPUT, &[&buckets, &super::secs(width)]).await
}

super::row_struct! {
    /// Latency of one stage's attempts in one bucket, in milliseconds.
    #[derive(Debug, Clone, Serialize)]
    pub struct Latency {
        pub stage: String,
        pub bucket: i32,
        pub p50: f64,
        pub p99: f64,
        pub n: i64,
    }
}

/// p50 and p99 of the stage attempts' latency per stage and bucket.
pub async fn latency(
    client: &impl GenericClient,
    buckets: i32,
    width: std::time::Duration,
) -> Result<Vec<Latency>, Error> {
    super::query_as(client, LATENCY, &[&buckets, &super::secs(width)]).await
}

super::row_struct! {
    /// Model calls of one stage and model within the window.
    #[derive(Debug, Clone, Serialize)]
    pub struct ModelCalls {
        pub stage: String,
        pub model: String,
        pub calls: i64,
        pub prompt_tokens: i64,
        pub completion_tokens: i64,
        pub rate_limited: i64,
    }
}

/// Model calls of the last `within`, by stage and model (every daemon's).
pub async fn models(client: &impl GenericClient, within: std::time::Duration) -> Result<Vec<ModelCalls>, Error> {
    super::query_as(client, MODELS, &[&super::secs(within)]).await
}
