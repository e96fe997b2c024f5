//! Every operator action, one function each, for every front end: the
//! console, `maasctl` and HTTP call the same function with their actor
//! (`console`, the operator's name, `http`), so an action does the same
//! thing and leaves the same row in `operator_actions` whoever asks.
//!
//! Every function is one conditional statement (or one transaction) against
//! the table, so it is safe whatever the daemons are doing, and every action
//! is recorded in `operator_actions` with who did it and why:
//!
//! - [`cancel`]: any non-terminal request → `CANCELLED`. An in-flight stage loses
//!   its lease at once; the daemon's heartbeat cancels the stage, and a result
//!   that still arrives is discarded by the fenced completion.
//! - [`retry`] / [`retry_all_failed`]: a `FAILED` request goes back to the ready
//!   status of the stage that failed (from the step history), attempts reset.
//! - [`continue_request`]: a debug request resting in `ANALYZED` or `READY` is
//!   released to its next stage, and the doorbell rings.
//! - [`pause`] / [`resume`]: every daemon stops (resumes) claiming at its
//!   next claim; running stages finish. Resuming rings the doorbell.
//! - [`set_prompt`] / [`activate_prompt`]: a role's prompt gets a new active
//!   version, or a kept one becomes active again (`prompt_set`,
//!   `prompt_activate`), in one transaction under the role's lock.
//! - [`archive_now`]: one manual archive run of one user, regardless of
//!   thresholds and cooldown, by the caller's [`Archivist`] (`archive_run`,
//!   with the run's outcome).

use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::archivist::{Archivist, ArchivistError, Progress, RunOptions, RunReport, Trigger};
use crate::db;
use crate::model::{OperatorAction, PromptRole, StageKind, Status, UnknownPromptRole};
use crate::repo::{self, GenericClient, audit, prompts, requests};

pub mod tenants;

pub use repo::control::ControlState;
pub use repo::requests::Retried;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Db(#[from] db::Error),
    #[error(transparent)]
    Archive(#[from] ArchivistError),
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        Error::Db(e.into())
    }
}

/// What [`cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum CancelOutcome {
    /// Cancelled; `was` is the status it had (an `-ING` status means a stage
    /// was running: its result will be discarded).
    Cancelled {
        was: Status,
    },
    /// Already `COMPLETED`, `FAILED` or `CANCELLED`: nothing changed.
    AlreadyFinished {
        status: Status,
    },
    NotFound,
}

/// Cancels a request unless it is finished.
pub async fn cancel(
    client: &impl GenericClient,
    id: Uuid,
    actor: &str,
    reason: Option<&str>,
) -> Result<CancelOutcome, Error> {
    Ok(match requests::cancel(client, id, actor, reason).await? {
        None => CancelOutcome::NotFound,
        Some(r) if r.cancelled => CancelOutcome::Cancelled { was: r.status },
        Some(r) => CancelOutcome::AlreadyFinished { status: r.status },
    })
}

/// What [`continue_request`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ContinueOutcome {
    /// Released: `next` will be claimed from `status`.
    Released {
        status: Status,
        next: StageKind,
    },
    /// Not resting: not a debug request, or not (yet) in `ANALYZED`/`READY`, or
    /// already released.
    NotHeld {
        status: Status,
        debug: bool,
    },
    NotFound,
}

/// Releases a debug request resting in `ANALYZED` or `READY` to its next stage.
pub async fn continue_request(
    client: &impl GenericClient,
    id: Uuid,
    actor: &str,
    reason: Option<&str>,
) -> Result<ContinueOutcome, Error> {
    Ok(match requests::continue_held(client, id, actor, reason).await? {
        None => ContinueOutcome::NotFound,
        Some(r) => {
            let status = r.status;
            match (r.released, status.dispatches()) {
                (true, Some(next)) => ContinueOutcome::Released { status, next },
                _ => ContinueOutcome::NotHeld { status, debug: r.debug },
            }
        }
    })
}

/// What [`retry`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RetryOutcome {
    /// Back in `status`; `stage` runs again with fresh attempts.
    Retried {
        status: Status,
        stage: StageKind,
    },
    /// Only `FAILED` requests are retried.
    NotFailed {
        status: Status,
    },
    NotFound,
}

/// Sends one `FAILED` request back to the ready status of the stage that failed.
pub async fn retry(
    client: &impl GenericClient,
    id: Uuid,
    actor: &str,
    reason: Option<&str>,
) -> Result<RetryOutcome, Error> {
    let done = requests::retry_failed(client, Some(&[id]), 1, actor, reason).await?;
    if let Some(r) = done.into_iter().next() {
        return Ok(RetryOutcome::Retried {
            status: r.status,
            stage: r.stage,
        });
    }
    Ok(match requests::status(client, id).await? {
        None => RetryOutcome::NotFound,
        Some(status) => RetryOutcome::NotFailed { status },
    })
}

/// Retries every request that is `FAILED` when the call starts, `batch` per
/// statement (each its own short transaction). The set is fixed first, so a
/// request that fails again meanwhile is not retried twice by one call.
pub async fn retry_all_failed(
    client: &impl GenericClient,
    actor: &str,
    reason: Option<&str>,
    batch: usize,
) -> Result<Vec<Retried>, Error> {
    let ids = requests::failed_ids(client).await?;
    let mut all: Vec<Retried> = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(batch.max(1)) {
        all.extend(requests::retry_failed(client, Some(chunk), chunk.len(), actor, reason).await?);
    }
    Ok(all)
}

/// Stops claiming in every daemon (running stages finish). Returns whether
/// it was already paused.
pub async fn pause(client: &impl GenericClient, actor: &str, reason: Option<&str>) -> Result<bool, Error> {
    Ok(repo::control::set(client, true, reason, actor).await?)
}

/// Resumes claiming in every daemon and rings the doorbell for due rows so
/// they are claimed at once. Returns whether it was paused.
pub async fn resume(client: &impl GenericClient, actor: &str, reason: Option<&str>) -> Result<bool, Error> {
    let was = repo::control::set(client, false, reason, actor).await?;
    requests::ring_due(client).await?;
    Ok(was)
}

/// Whether claiming is paused, and by whom.
pub async fn state(client: &impl GenericClient) -> Result<ControlState, Error> {
    Ok(repo::control::get(client).await?)
}

/// The role an operator names: a stored name in any case, with or without
/// `_` and `-`, or `responder` for `FinalResponder`.
pub fn parse_role(text: &str) -> Result<PromptRole, UnknownPromptRole> {
    let wanted = match text.trim().to_ascii_lowercase().replace(['_', '-'], "").as_str() {
        "responder" => "finalresponder".to_owned(),
        other => other.to_owned(),
    };
    PromptRole::ALL
        .into_iter()
        .find(|r| r.as_str().to_ascii_lowercase() == wanted)
        .ok_or_else(|| UnknownPromptRole(text.to_owned()))
}

/// A change of a role's active prompt, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptChange {
    pub role: PromptRole,
    /// The version now active.
    pub version: i32,
    /// The version active before, if any.
    pub previous: Option<i32>,
}

impl PromptChange {
    /// The `detail` of its `operator_actions` row.
    pub fn detail(&self) -> serde_json::Value {
        json!({"role": self.role.as_str(), "version": self.version, "previous": self.previous})
    }
}

/// Adds `text` as `role`'s next prompt version and makes it active, in one
/// transaction under the role's lock, recorded as `prompt_set` (with the
/// text's length in characters).
pub async fn set_prompt(
    client: &mut deadpool_postgres::Object,
    role: PromptRole,
    text: &str,
    actor: &str,
    reason: Option<&str>,
) -> Result<PromptChange, Error> {
    let tx = client.transaction().await.map_err(db::Error::from)?;
    let (previous, version) = prompts::set(&tx, role, text).await?;
    let change = PromptChange {
        role,
        version,
        previous,
    };
    let mut detail = change.detail();
    detail["chars"] = json!(text.chars().count());
    audit::record(&tx, OperatorAction::PromptSet, actor, reason, &detail).await?;
    tx.commit().await.map_err(db::Error::from)?;
    Ok(change)
}

/// Makes a kept version of `role`'s prompt active again, in one transaction
/// under the role's lock, recorded as `prompt_activate`. `None` when the
/// role has no such version: nothing changed, nothing recorded.
pub async fn activate_prompt(
    client: &mut deadpool_postgres::Object,
    role: PromptRole,
    version: i32,
    actor: &str,
    reason: Option<&str>,
) -> Result<Option<PromptChange>, Error> {
    let tx = client.transaction().await.map_err(db::Error::from)?;
    let (previous, found) = prompts::activate(&tx, role, version).await?;
    if !found {
        // Dropping the transaction rolls it back: the previous version stays active.
        return Ok(None);
    }
    let change = PromptChange {
        role,
        version,
        previous,
    };
    audit::record(&tx, OperatorAction::PromptActivate, actor, reason, &change.detail()).await?;
    tx.commit().await.map_err(db::Error::from)?;
    Ok(Some(change))
}

/// Archives `user`'s pending turns now with `archivist` (a manual run,
/// regardless of thresholds and cooldown; `progress` hears of it), then
/// records `archive_run` with the run's outcome. A run that could not start
/// (no Archivist prompt, no database) is an error and is not recorded; a
/// user that failed is in the report, recorded.
pub async fn archive_now(
    archivist: &Archivist,
    user: Uuid,
    actor: &str,
    reason: Option<&str>,
    progress: &dyn Progress,
    cancel: &CancellationToken,
) -> Result<RunReport, Error> {
    let opts = RunOptions {
        trigger: Trigger::Manual,
        user: Some(user),
        dry_run: false,
        tick: None,
    };
    let report = archivist.run(opts, progress, cancel).await?;
    let u = report.users.first();
    let detail = json!({
        "user_id": user,
        "run_id": report.archive_run_id,
        "outcome": u.map(|u| u.outcome.as_str()),
        "turns": report.logs,
        "records": report.records,
        "memory_version": u.and_then(|u| u.memory_version),
        "error": u.and_then(|u| u.error.clone()),
    });
    // A user forgotten while the run went on keeps no row about it.
    let mut client = archivist.pool().get().await.map_err(db::Error::from)?;
    let tx = client.transaction().await?;
    audit::record_about_user(&tx, OperatorAction::ArchiveRun, actor, reason, &detail, user).await?;
    tx.commit().await?;
    tracing::info!(user_id = %user, actor, outcome = ?u.map(|u| u.outcome), turns = report.logs,
        records = report.records, "archive now");
    Ok(report)
}

/// Who is acting, for the audit trail: `$MAAS_OPERATOR`, else the login
/// name (`$SUDO_USER`, `$USER`, `$LOGNAME`), else "unknown".
pub fn default_actor() -> String {
    ["MAAS_OPERATOR", "SUDO_USER", "USER", "LOGNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .map(|v| v.trim().to_owned())
        .find(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_read_as_operators_write_them() {
        assert_eq!(parse_role("responder").ok(), Some(PromptRole::Responder));
        assert_eq!(parse_role("Final_Responder").ok(), Some(PromptRole::Responder));
        assert_eq!(parse_role("ANALYZER").ok(), Some(PromptRole::Analyzer));
        assert_eq!(parse_role(" archivist ").ok(), Some(PromptRole::Archivist));
        assert!(parse_role("nobody").is_err());
    }
}
