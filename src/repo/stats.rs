//! Aggregates and server state for `maasctl stats` and `maasctl doctor`:
//! backlog, finished requests, leases by daemon, undelivered callbacks,
//! the daemons' LISTEN sessions, the server version and its notification
//! queue; and the operator console's charts of the last hour (requests
//! finished, stage latency, model calls). Read-only, except [`notify`]
//! and [`listen`] (the doctor's round trip on a private channel).

use std::time::Duration;

use super::GenericClient;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::secs;
use crate::db::Error;
use crate::model::Status;

super::statements! {
    BACKLOG = "stats_backlog",
    FINISHED = "stats_finished",
    LEASES = "stats_leases",
    CALLBACKS = "stats_callbacks",
    DAEMONS = "stats_daemons",
    SERVER_VERSION = "server_version",
    NOTIFY_QUEUE_USAGE = "notify_queue_usage",
    NOTIFY = "notify",
    THROUGHPUT = "stats_throughput",
    STAGE_LATENCY = "stats_stage_latency",
    MODEL_CALLS = "stats_model_calls",
}

super::row_struct! {
    /// Unfinished requests of one status.
    #[derive(Debug, Clone, Serialize)]
    pub struct Backlog {
        pub status: Status,
        pub total: i64,
        pub due: i64,
        pub held: i64,
        /// Seconds the oldest due row has waited.
        pub oldest_due_secs: Option<f64>,
    }
}

pub async fn backlog(client: &impl GenericClient) -> Result<Vec<Backlog>, Error> {
    super::query_as(client, BACKLOG, &[]).await
}

/// Terminal requests by status in the last `window`: (status, count).
pub async fn finished(client: &impl GenericClient, window: Duration) -> Result<Vec<(Status, i64)>, Error> {
    super::status_counts(client, FINISHED, &[&secs(window)]).await
}

super::row_struct! {
    /// In-flight leases of one daemon.
    #[derive(Debug, Clone, Serialize)]
    pub struct Leases {
        pub owner: String,
        pub held: i64,
        pub expired: i64,
        pub earliest_expiry: DateTime<Utc>,
    }
}

pub async fn leases(client: &impl GenericClient) -> Result<Vec<Leases>, Error> {
    super::query_as(client, LEASES, &[]).await
}

super::row_struct! {
    /// Undelivered callbacks.
    #[derive(Debug, Clone, Serialize)]
    pub struct CallbackStats {
        pub pending: i64,
        pub dead: i64,
        pub oldest_pending_secs: Option<f64>,
    }
}

pub async fn callbacks(client: &impl GenericClient) -> Result<CallbackStats, Error> {
    super::query_one_as(client, CALLBACKS, &[]).await
}

super::row_struct! {
    /// A daemon's LISTEN session.
    #[derive(Debug, Clone, Serialize)]
    pub struct DaemonSession {
        pub client: String,
        pub since: DateTime<Utc>,
    }
}

pub async fn daemons(client: &impl GenericClient) -> Result<Vec<DaemonSession>, Error> {
    super::query_as(client, DAEMONS, &[]).await
}

/// The server's version (`server_version`).
pub async fn server_version(client: &impl GenericClient) -> Result<String, Error> {
    super::query_one_value(client, SERVER_VERSION, &[], "server_version").await
}

/// How full the server's notification queue is, 0 to 1.
pub async fn notification_queue_usage(client: &impl GenericClient) -> Result<f64, Error> {
    super::query_one_value(client, NOTIFY_QUEUE_USAGE, &[], "usage").await
}

/// Sends `payload` on `channel`.
pub async fn notify(client: &impl GenericClient, channel: &str, payload: &str) -> Result<(), Error> {
    super::execute(client, NOTIFY, &[&channel, &payload]).await?;
    Ok(())
}

/// Starts listening on `channel` in this session. The name goes into the
/// statement as an identifier, so only letters, digits and `_` are taken.
pub async fn listen(client: &tokio_postgres::Client, channel: &str) -> Result<(), Error> {
    if channel.is_empty() || !channel.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(Error::Unexpected(format!(
            "listen: {channel:?} is not a plain channel name"
        )));
    }
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    Ok(())
}

/// A round trip on the simple protocol (`SELECT 1`): the LISTEN session's
/// liveness check, which works through any pooler and prepares nothing.
pub async fn ping(client: &tokio_postgres::Client) -> Result<(), Error> {
    client.simple_query("SELECT 1").await?;
    Ok(())
}

// ---- the operator console's charts: the last hour in buckets, read
// through indexes that bound them (named in each statement's SQL:
// `pipeline_runs_finished_idx`, `pipeline_steps_finished_brin`), so none
// grows with the tables ---------------------------------------------------

super::row_struct! {
    /// Requests finished in one bucket of the last hour.
    #[derive(Debug, Clone, Serialize)]
    pub struct FinishedBucket {
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
    width: Duration,
) -> Result<Vec<FinishedBucket>, Error> {
    super::query_as(client, THROUGHPUT, &[&buckets, &secs(width)]).await
}

super::row_struct! {
    /// Latency of one stage's attempts in one bucket, in milliseconds.
    #[derive(Debug, Clone, Serialize)]
    pub struct LatencyBucket {
        pub stage: String,
        pub bucket: i32,
        pub p50: f64,
        pub p99: f64,
        pub n: i64,
    }
}

/// p50 and p99 of the stage attempts' latency per stage and bucket.
pub async fn stage_latency(
    client: &impl GenericClient,
    buckets: i32,
    width: Duration,
) -> Result<Vec<LatencyBucket>, Error> {
    super::query_as(client, STAGE_LATENCY, &[&buckets, &secs(width)]).await
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
pub async fn model_calls(client: &impl GenericClient, within: Duration) -> Result<Vec<ModelCalls>, Error> {
    super::query_as(client, MODEL_CALLS, &[&secs(within)]).await
}
