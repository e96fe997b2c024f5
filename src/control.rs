//! Operator control of requests and daemons, for `maasctl` and the HTTP
//! server alike (`POST /api/query/{id}/continue` calls [`continue_run`]).
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
//! - [`continue_run`]: a debug request resting in `ANALYZED` or `READY` is released
//!   to its next stage, and the doorbell rings.
//! - [`pause`] / [`resume`]: every daemon stops (resumes) claiming at its
//!   next claim; running stages finish. Resuming rings the doorbell.

use crate::repo::GenericClient;
use serde::Serialize;
use uuid::Uuid;

use crate::db;
use crate::model::{StageKind, Status, UnknownStatus};
use crate::repo::{self, requests};

pub use repo::control::ControlState;
pub use repo::requests::Retried;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Db(#[from] db::Error),
    #[error("the database holds a status this binary does not know: {0}")]
    Status(#[from] UnknownStatus),
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

/// What [`continue_run`] did.
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
pub async fn continue_run(
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
