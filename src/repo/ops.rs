//! The statements behind operating maas: operator commands (cancel, retry,
//! continue, pause/resume, prompts), `maasctl stats`, callback deliveries
//! and retention. Like the rest of `repo`, each is a named file in
//! `sql/queries/`, embedded and prepared once per connection.

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::db::Error;

pub const CANCEL_RUN: &str = include_str!("../../sql/queries/cancel_run.sql");
pub const CONTINUE_RUN: &str = include_str!("../../sql/queries/continue_run.sql");
pub const RETRY_FAILED: &str = include_str!("../../sql/queries/retry_failed.sql");
pub const FAILED_IDS: &str = include_str!("../../sql/queries/failed_ids.sql");
pub const RUN_STATUS: &str = include_str!("../../sql/queries/run_status.sql");
pub const CONTROL_GET: &str = include_str!("../../sql/queries/control_get.sql");
pub const CONTROL_SET: &str = include_str!("../../sql/queries/control_set.sql");
pub const LIST_RUNS: &str = include_str!("../../sql/queries/list_runs.sql");
pub const SHOW_ACTIONS: &str = include_str!("../../sql/queries/show_actions.sql");
pub const SHOW_CALLBACKS: &str = include_str!("../../sql/queries/show_callbacks.sql");
pub const STATS_BACKLOG: &str = include_str!("../../sql/queries/stats_backlog.sql");
pub const STATS_FINISHED: &str = include_str!("../../sql/queries/stats_finished.sql");
pub const STATS_LEASES: &str = include_str!("../../sql/queries/stats_leases.sql");
pub const STATS_CALLBACKS: &str = include_str!("../../sql/queries/stats_callbacks.sql");
pub const STATS_DAEMONS: &str = include_str!("../../sql/queries/stats_daemons.sql");
pub const PROMPTS_LIST: &str = include_str!("../../sql/queries/prompts_list.sql");
pub const PROMPTS_SHOW: &str = include_str!("../../sql/queries/prompts_show.sql");
pub const PROMPTS_LOCK: &str = include_str!("../../sql/queries/prompts_lock.sql");
pub const PROMPTS_DEACTIVATE: &str = include_str!("../../sql/queries/prompts_deactivate.sql");
pub const PROMPTS_INSERT: &str = include_str!("../../sql/queries/prompts_insert.sql");
pub const PROMPTS_ACTIVATE: &str = include_str!("../../sql/queries/prompts_activate.sql");
pub const RECORD_ACTION: &str = include_str!("../../sql/queries/record_action.sql");
pub const RETENTION_RUNS: &str = include_str!("../../sql/queries/retention_runs.sql");
pub const RETENTION_ACTIONS: &str = include_str!("../../sql/queries/retention_actions.sql");
pub const CALLBACKS_CLAIM: &str = include_str!("../../sql/queries/callbacks_claim.sql");
pub const CALLBACKS_DELIVERED: &str = include_str!("../../sql/queries/callbacks_delivered.sql");
pub const CALLBACKS_FAILED: &str = include_str!("../../sql/queries/callbacks_failed.sql");

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

// ---- operator commands -------------------------------------------------

/// Cancels a run: `None` for an unknown id, else the status it had and
/// whether this call cancelled it (false: it was already terminal).
pub async fn cancel_run(
    client: &impl GenericClient,
    id: Uuid,
    actor: &str,
    reason: Option<&str>,
) -> Result<Option<(String, bool)>, Error> {
    let stmt = client.prepare_cached(CANCEL_RUN).await?;
    let Some(r) = client.query_opt(&stmt, &[&id, &actor, &reason]).await? else {
        return Ok(None);
    };
    Ok(Some((r.try_get(0)?, r.try_get(1)?)))
}

/// Releases a held debug run: `None` for an unknown id, else its status,
/// its debug flag, and whether this call released it.
pub async fn continue_run(
    client: &impl GenericClient,
    id: Uuid,
    actor: &str,
    reason: Option<&str>,
) -> Result<Option<(String, bool, bool)>, Error> {
    let stmt = client.prepare_cached(CONTINUE_RUN).await?;
    let Some(r) = client.query_opt(&stmt, &[&id, &actor, &reason]).await? else {
        return Ok(None);
    };
    Ok(Some((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
}

/// A FAILED run sent back to a ready status.
#[derive(Debug, Clone, Serialize)]
pub struct Retried {
    pub id: Uuid,
    /// The ready status it went back to.
    pub status: String,
    /// The stage that will run again.
    pub stage: String,
    /// The error it had.
    pub error: Option<String>,
}

/// Retries FAILED runs (`ids`, or all when `None`), at most `max` of them.
pub async fn retry_failed(
    client: &impl GenericClient,
    ids: Option<&[Uuid]>,
    max: usize,
    actor: &str,
    reason: Option<&str>,
) -> Result<Vec<Retried>, Error> {
    let stmt = client.prepare_cached(RETRY_FAILED).await?;
    let ids: Option<Vec<Uuid>> = ids.map(<[Uuid]>::to_vec);
    let rows = client.query(&stmt, &[&ids, &limit(max), &actor, &reason]).await?;
    rows.iter()
        .map(|r| {
            Ok(Retried {
                id: r.try_get(0)?,
                status: r.try_get(1)?,
                stage: r.try_get(2)?,
                error: r.try_get(3)?,
            })
        })
        .collect()
}

/// Every FAILED run's id, oldest failure first.
pub async fn failed_ids(client: &impl GenericClient) -> Result<Vec<Uuid>, Error> {
    let stmt = client.prepare_cached(FAILED_IDS).await?;
    let rows = client.query(&stmt, &[]).await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// The status of a run, `None` for an unknown id.
pub async fn run_status(client: &impl GenericClient, id: Uuid) -> Result<Option<String>, Error> {
    let stmt = client.prepare_cached(RUN_STATUS).await?;
    Ok(client
        .query_opt(&stmt, &[&id])
        .await?
        .map(|r| r.try_get(0))
        .transpose()?)
}

/// Whether claiming is paused cluster-wide, and the last change.
#[derive(Debug, Clone, Serialize)]
pub struct ControlState {
    pub paused: bool,
    pub reason: Option<String>,
    pub changed_by: Option<String>,
    pub changed_at: Option<DateTime<Utc>>,
}

pub async fn control_get(client: &impl GenericClient) -> Result<ControlState, Error> {
    let stmt = client.prepare_cached(CONTROL_GET).await?;
    Ok(match client.query_opt(&stmt, &[]).await? {
        Some(r) => ControlState {
            paused: r.try_get(0)?,
            reason: r.try_get(1)?,
            changed_by: r.try_get(2)?,
            changed_at: Some(r.try_get(3)?),
        },
        None => ControlState {
            paused: false,
            reason: None,
            changed_by: None,
            changed_at: None,
        },
    })
}

/// Sets the pause flag; returns whether it was paused before.
pub async fn control_set(
    client: &impl GenericClient,
    paused: bool,
    reason: Option<&str>,
    actor: &str,
) -> Result<bool, Error> {
    let stmt = client.prepare_cached(CONTROL_SET).await?;
    Ok(client.query_one(&stmt, &[&paused, &reason, &actor]).await?.try_get(0)?)
}

/// Records an operator action that concerns no single run.
pub async fn record_action(
    client: &impl GenericClient,
    action: &str,
    actor: &str,
    reason: Option<&str>,
    detail: &Value,
) -> Result<(), Error> {
    let stmt = client.prepare_cached(RECORD_ACTION).await?;
    client.execute(&stmt, &[&action, &actor, &reason, detail]).await?;
    Ok(())
}

// ---- inspection ------------------------------------------------------------

/// Filters of `maasctl requests list`; `None` means any.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub statuses: Option<Vec<String>>,
    pub user_id: Option<Uuid>,
    /// Unchanged for longer than this.
    pub older_than: Option<Duration>,
    pub limit: usize,
}

/// One line of `maasctl requests list`.
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    pub id: Uuid,
    pub status: String,
    pub user_id: Uuid,
    pub attempt: i32,
    pub debug: bool,
    pub held: bool,
    pub has_callback: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub run_after: DateTime<Utc>,
    pub lease_owner: Option<String>,
    pub error: Option<String>,
    pub query: String,
}

pub async fn list_runs(client: &impl GenericClient, f: &ListFilter) -> Result<Vec<RunRow>, Error> {
    let stmt = client.prepare_cached(LIST_RUNS).await?;
    let older: Option<f64> = f.older_than.map(secs);
    client
        .query(&stmt, &[&f.statuses, &f.user_id, &older, &limit(f.limit)])
        .await?
        .iter()
        .map(|r| {
            Ok(RunRow {
                id: r.try_get(0)?,
                status: r.try_get(1)?,
                user_id: r.try_get(2)?,
                attempt: r.try_get(3)?,
                debug: r.try_get(4)?,
                held: r.try_get(5)?,
                has_callback: r.try_get(6)?,
                created_at: r.try_get(7)?,
                updated_at: r.try_get(8)?,
                run_after: r.try_get(9)?,
                lease_owner: r.try_get(10)?,
                error: r.try_get(11)?,
                query: r.try_get(12)?,
            })
        })
        .collect()
}

/// One operator action on a run.
#[derive(Debug, Clone, Serialize)]
pub struct ActionView {
    pub action: String,
    pub actor: String,
    pub reason: Option<String>,
    pub from_status: Option<String>,
    pub to_status: Option<String>,
    pub detail: Option<Value>,
    pub at: DateTime<Utc>,
}

pub async fn show_actions(client: &impl GenericClient, id: Uuid) -> Result<Vec<ActionView>, Error> {
    let stmt = client.prepare_cached(SHOW_ACTIONS).await?;
    client
        .query(&stmt, &[&id])
        .await?
        .iter()
        .map(|r| {
            Ok(ActionView {
                action: r.try_get(0)?,
                actor: r.try_get(1)?,
                reason: r.try_get(2)?,
                from_status: r.try_get(3)?,
                to_status: r.try_get(4)?,
                detail: r.try_get(5)?,
                at: r.try_get(6)?,
            })
        })
        .collect()
}

/// One callback delivery of a run.
#[derive(Debug, Clone, Serialize)]
pub struct CallbackView {
    pub id: i64,
    pub event: String,
    pub url: String,
    pub state: String,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub delivered_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

pub async fn show_callbacks(client: &impl GenericClient, id: Uuid) -> Result<Vec<CallbackView>, Error> {
    let stmt = client.prepare_cached(SHOW_CALLBACKS).await?;
    client
        .query(&stmt, &[&id])
        .await?
        .iter()
        .map(|r| {
            Ok(CallbackView {
                id: r.try_get(0)?,
                event: r.try_get(1)?,
                url: r.try_get(2)?,
                state: r.try_get(3)?,
                attempts: r.try_get(4)?,
                next_attempt_at: r.try_get(5)?,
                last_status: r.try_get(6)?,
                last_error: r.try_get(7)?,
                delivered_at: r.try_get(8)?,
                created_at: r.try_get(9)?,
            })
        })
        .collect()
}

// ---- stats -------------------------------------------------------------

/// Unfinished runs of one status.
#[derive(Debug, Clone, Serialize)]
pub struct Backlog {
    pub status: String,
    pub total: i64,
    pub due: i64,
    pub held: i64,
    /// Seconds the oldest due row has waited.
    pub oldest_due_secs: Option<f64>,
}

pub async fn stats_backlog(client: &impl GenericClient) -> Result<Vec<Backlog>, Error> {
    let stmt = client.prepare_cached(STATS_BACKLOG).await?;
    client
        .query(&stmt, &[])
        .await?
        .iter()
        .map(|r| {
            Ok(Backlog {
                status: r.try_get(0)?,
                total: r.try_get(1)?,
                due: r.try_get(2)?,
                held: r.try_get(3)?,
                oldest_due_secs: r.try_get(4)?,
            })
        })
        .collect()
}

/// Terminal runs by status in the last `window`.
pub async fn stats_finished(client: &impl GenericClient, window: Duration) -> Result<Vec<(String, i64)>, Error> {
    let stmt = client.prepare_cached(STATS_FINISHED).await?;
    client
        .query(&stmt, &[&secs(window)])
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
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

pub async fn stats_leases(client: &impl GenericClient) -> Result<Vec<Leases>, Error> {
    let stmt = client.prepare_cached(STATS_LEASES).await?;
    client
        .query(&stmt, &[])
        .await?
        .iter()
        .map(|r| {
            Ok(Leases {
                owner: r.try_get(0)?,
                held: r.try_get(1)?,
                expired: r.try_get(2)?,
                earliest_expiry: r.try_get(3)?,
            })
        })
        .collect()
}

/// Undelivered callbacks.
#[derive(Debug, Clone, Serialize)]
pub struct CallbackStats {
    pub pending: i64,
    pub dead: i64,
    pub oldest_pending_secs: Option<f64>,
}

pub async fn stats_callbacks(client: &impl GenericClient) -> Result<CallbackStats, Error> {
    let stmt = client.prepare_cached(STATS_CALLBACKS).await?;
    let r = client.query_one(&stmt, &[]).await?;
    Ok(CallbackStats {
        pending: r.try_get(0)?,
        dead: r.try_get(1)?,
        oldest_pending_secs: r.try_get(2)?,
    })
}

/// A daemon's LISTEN session.
#[derive(Debug, Clone, Serialize)]
pub struct DaemonSession {
    pub client: String,
    pub since: DateTime<Utc>,
}

pub async fn stats_daemons(client: &impl GenericClient) -> Result<Vec<DaemonSession>, Error> {
    let stmt = client.prepare_cached(STATS_DAEMONS).await?;
    client
        .query(&stmt, &[])
        .await?
        .iter()
        .map(|r| {
            Ok(DaemonSession {
                client: r.try_get(0)?,
                since: r.try_get(1)?,
            })
        })
        .collect()
}

// ---- prompts -------------------------------------------------------------

/// The prompts of one role.
#[derive(Debug, Clone, Serialize)]
pub struct PromptSummary {
    pub role: String,
    pub versions: i64,
    pub active_version: Option<i32>,
    pub latest_version: i32,
    pub active_since: Option<DateTime<Utc>>,
    pub active_chars: Option<i32>,
}

pub async fn prompts_list(client: &impl GenericClient) -> Result<Vec<PromptSummary>, Error> {
    let stmt = client.prepare_cached(PROMPTS_LIST).await?;
    client
        .query(&stmt, &[])
        .await?
        .iter()
        .map(|r| {
            Ok(PromptSummary {
                role: r.try_get(0)?,
                versions: r.try_get(1)?,
                active_version: r.try_get(2)?,
                latest_version: r.try_get(3)?,
                active_since: r.try_get(4)?,
                active_chars: r.try_get(5)?,
            })
        })
        .collect()
}

/// One prompt version.
#[derive(Debug, Clone, Serialize)]
pub struct Prompt {
    pub role: String,
    pub version: i32,
    pub active: bool,
    pub created_at: DateTime<Utc>,
    pub text: String,
}

/// Version `version` of `role`'s prompt, or the active one.
pub async fn prompts_show(
    client: &impl GenericClient,
    role: &str,
    version: Option<i32>,
) -> Result<Option<Prompt>, Error> {
    let stmt = client.prepare_cached(PROMPTS_SHOW).await?;
    let Some(r) = client.query_opt(&stmt, &[&role, &version]).await? else {
        return Ok(None);
    };
    Ok(Some(Prompt {
        role: role.to_owned(),
        version: r.try_get(0)?,
        active: r.try_get(1)?,
        created_at: r.try_get(2)?,
        text: r.try_get(3)?,
    }))
}

/// Adds `text` as the next version of `role`'s prompt and activates it, in
/// the caller's transaction. Returns (previously active version, new version).
pub async fn prompts_set(client: &impl GenericClient, role: &str, text: &str) -> Result<(Option<i32>, i32), Error> {
    let lock = client.prepare_cached(PROMPTS_LOCK).await?;
    client.execute(&lock, &[&role]).await?;
    let off = client.prepare_cached(PROMPTS_DEACTIVATE).await?;
    let was: Option<i32> = client
        .query_opt(&off, &[&role])
        .await?
        .map(|r| r.try_get(0))
        .transpose()?;
    let ins = client.prepare_cached(PROMPTS_INSERT).await?;
    let new: i32 = client.query_one(&ins, &[&role, &text]).await?.try_get(0)?;
    Ok((was, new))
}

/// Activates an existing version of `role`'s prompt, in the caller's
/// transaction. Returns (previously active version, whether the version exists).
pub async fn prompts_activate(
    client: &impl GenericClient,
    role: &str,
    version: i32,
) -> Result<(Option<i32>, bool), Error> {
    let lock = client.prepare_cached(PROMPTS_LOCK).await?;
    client.execute(&lock, &[&role]).await?;
    let off = client.prepare_cached(PROMPTS_DEACTIVATE).await?;
    let was: Option<i32> = client
        .query_opt(&off, &[&role])
        .await?
        .map(|r| r.try_get(0))
        .transpose()?;
    let on = client.prepare_cached(PROMPTS_ACTIVATE).await?;
    let found = client.query_opt(&on, &[&role, &version]).await?.is_some();
    Ok((was, found))
}

// ---- retention -------------------------------------------------------------

/// Deletes up to `batch` terminal runs finished more than `keep` ago.
pub async fn retention_runs(client: &impl GenericClient, keep: Duration, batch: usize) -> Result<i64, Error> {
    let stmt = client.prepare_cached(RETENTION_RUNS).await?;
    Ok(client
        .query_one(&stmt, &[&secs(keep), &limit(batch)])
        .await?
        .try_get(0)?)
}

/// Deletes up to `batch` run-less operator actions older than `keep`.
pub async fn retention_actions(client: &impl GenericClient, keep: Duration, batch: usize) -> Result<i64, Error> {
    let stmt = client.prepare_cached(RETENTION_ACTIONS).await?;
    Ok(client
        .query_one(&stmt, &[&secs(keep), &limit(batch)])
        .await?
        .try_get(0)?)
}

// ---- callbacks -------------------------------------------------------------

/// A callback delivery claimed for one attempt.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: i64,
    pub run_id: Uuid,
    pub url: String,
    pub event: String,
    /// The JSON body, exactly as it will be sent and signed.
    pub body: String,
    /// This attempt's number, 1-based.
    pub attempt: i32,
}

/// Claims up to `batch` due deliveries, each leased for `lease`.
pub async fn callbacks_claim(
    client: &impl GenericClient,
    batch: usize,
    lease: Duration,
) -> Result<Vec<Delivery>, Error> {
    let stmt = client.prepare_cached(CALLBACKS_CLAIM).await?;
    let rows = client.query(&stmt, &[&limit(batch), &secs(lease)]).await?;
    rows.iter()
        .map(|r| {
            Ok(Delivery {
                id: r.try_get(0)?,
                run_id: r.try_get(1)?,
                url: r.try_get(2)?,
                event: r.try_get(3)?,
                body: r.try_get(4)?,
                attempt: r.try_get(5)?,
            })
        })
        .collect()
}

pub async fn callbacks_delivered(client: &impl GenericClient, id: i64, status: i32) -> Result<(), Error> {
    let stmt = client.prepare_cached(CALLBACKS_DELIVERED).await?;
    client.execute(&stmt, &[&id, &status]).await?;
    Ok(())
}

/// Records a failed attempt; `retry_in` is ignored when `dead`.
pub async fn callbacks_failed(
    client: &impl GenericClient,
    d: &Delivery,
    status: Option<i32>,
    error: &str,
    retry_in: Duration,
    dead: bool,
) -> Result<(), Error> {
    let stmt = client.prepare_cached(CALLBACKS_FAILED).await?;
    let retry = if dead { 0.0 } else { secs(retry_in) };
    client
        .execute(&stmt, &[&d.id, &d.attempt, &status, &error, &retry, &dead])
        .await?;
    Ok(())
}
