//! Aggregates and server state for `maasctl stats` and `maasctl doctor`:
//! backlog, finished requests, leases by daemon, undelivered callbacks,
//! the daemons' LISTEN sessions, the server version and its notification
//! queue. Read-only, except [`notify`] and [`listen`] (the doctor's round
//! trip on a private channel).

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde::Serialize;
use tokio_postgres::Row;

use super::{FromRow, rows_as, secs};
use crate::db::Error;

const BACKLOG: &str = include_str!("../../sql/queries/stats_backlog.sql");
const FINISHED: &str = include_str!("../../sql/queries/stats_finished.sql");
const LEASES: &str = include_str!("../../sql/queries/stats_leases.sql");
const CALLBACKS: &str = include_str!("../../sql/queries/stats_callbacks.sql");
const DAEMONS: &str = include_str!("../../sql/queries/stats_daemons.sql");
const SERVER_VERSION: &str = include_str!("../../sql/queries/server_version.sql");
const NOTIFY_QUEUE_USAGE: &str = include_str!("../../sql/queries/notify_queue_usage.sql");
const NOTIFY: &str = include_str!("../../sql/queries/notify.sql");

/// This file's statements, for [`super::all`].
pub(super) const STATEMENTS: &[(&str, &str)] = &[
    ("stats_backlog", BACKLOG),
    ("stats_finished", FINISHED),
    ("stats_leases", LEASES),
    ("stats_callbacks", CALLBACKS),
    ("stats_daemons", DAEMONS),
    ("server_version", SERVER_VERSION),
    ("notify_queue_usage", NOTIFY_QUEUE_USAGE),
    ("notify", NOTIFY),
];

/// Unfinished requests of one status.
#[derive(Debug, Clone, Serialize)]
pub struct Backlog {
    pub status: String,
    pub total: i64,
    pub due: i64,
    pub held: i64,
    /// Seconds the oldest due row has waited.
    pub oldest_due_secs: Option<f64>,
}

impl FromRow for Backlog {
    fn from_row(r: &Row) -> Result<Backlog, Error> {
        Ok(Backlog {
            status: r.try_get("status")?,
            total: r.try_get("total")?,
            due: r.try_get("due")?,
            held: r.try_get("held")?,
            oldest_due_secs: r.try_get("oldest_due_secs")?,
        })
    }
}

pub async fn backlog(client: &impl GenericClient) -> Result<Vec<Backlog>, Error> {
    let stmt = client.prepare_cached(BACKLOG).await?;
    rows_as(&client.query(&stmt, &[]).await?)
}

/// Terminal requests by status in the last `window`: (status, count).
pub async fn finished(client: &impl GenericClient, window: Duration) -> Result<Vec<(String, i64)>, Error> {
    let stmt = client.prepare_cached(FINISHED).await?;
    client
        .query(&stmt, &[&secs(window)])
        .await?
        .iter()
        .map(|r| Ok((r.try_get("status")?, r.try_get("n")?)))
        .collect()
}

/// In-flight leases of one daemon.
#[derive(Debug, Clone, Serialize)]
pub struct Leases {
    pub owner: String,
    pub held: i64,
    pub expired: i64,
    pub earliest_expiry: DateTime<Utc>,
}

impl FromRow for Leases {
    fn from_row(r: &Row) -> Result<Leases, Error> {
        Ok(Leases {
            owner: r.try_get("owner")?,
            held: r.try_get("held")?,
            expired: r.try_get("expired")?,
            earliest_expiry: r.try_get("earliest_expiry")?,
        })
    }
}

pub async fn leases(client: &impl GenericClient) -> Result<Vec<Leases>, Error> {
    let stmt = client.prepare_cached(LEASES).await?;
    rows_as(&client.query(&stmt, &[]).await?)
}

/// Undelivered callbacks.
#[derive(Debug, Clone, Serialize)]
pub struct CallbackStats {
    pub pending: i64,
    pub dead: i64,
    pub oldest_pending_secs: Option<f64>,
}

impl FromRow for CallbackStats {
    fn from_row(r: &Row) -> Result<CallbackStats, Error> {
        Ok(CallbackStats {
            pending: r.try_get("pending")?,
            dead: r.try_get("dead")?,
            oldest_pending_secs: r.try_get("oldest_pending_secs")?,
        })
    }
}

pub async fn callbacks(client: &impl GenericClient) -> Result<CallbackStats, Error> {
    let stmt = client.prepare_cached(CALLBACKS).await?;
    CallbackStats::from_row(&client.query_one(&stmt, &[]).await?)
}

/// A daemon's LISTEN session.
#[derive(Debug, Clone, Serialize)]
pub struct DaemonSession {
    pub client: String,
    pub since: DateTime<Utc>,
}

impl FromRow for DaemonSession {
    fn from_row(r: &Row) -> Result<DaemonSession, Error> {
        Ok(DaemonSession {
            client: r.try_get("client")?,
            since: r.try_get("since")?,
        })
    }
}

pub async fn daemons(client: &impl GenericClient) -> Result<Vec<DaemonSession>, Error> {
    let stmt = client.prepare_cached(DAEMONS).await?;
    rows_as(&client.query(&stmt, &[]).await?)
}

/// The server's version (`server_version`).
pub async fn server_version(client: &impl GenericClient) -> Result<String, Error> {
    let stmt = client.prepare_cached(SERVER_VERSION).await?;
    Ok(client.query_one(&stmt, &[]).await?.try_get("server_version")?)
}

/// How full the server's notification queue is, 0 to 1.
pub async fn notification_queue_usage(client: &impl GenericClient) -> Result<f64, Error> {
    let stmt = client.prepare_cached(NOTIFY_QUEUE_USAGE).await?;
    Ok(client.query_one(&stmt, &[]).await?.try_get("usage")?)
}

/// Sends `payload` on `channel`.
pub async fn notify(client: &impl GenericClient, channel: &str, payload: &str) -> Result<(), Error> {
    let stmt = client.prepare_cached(NOTIFY).await?;
    client.execute(&stmt, &[&channel, &payload]).await?;
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
