//! The step history (`pipeline_steps`): one row per finished stage attempt,
//! written by [`super::attempts`] (finish, reclaim); read here.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde::Serialize;
use tokio_postgres::Row;
use uuid::Uuid;

use super::{FromRow, rows_as};
use crate::db::Error;

const FOR_REQUEST: &str = include_str!("../../sql/queries/show_steps.sql");

/// This file's statements, for [`super::all`].
pub(super) const STATEMENTS: &[(&str, &str)] = &[("show_steps", FOR_REQUEST)];

/// One finished stage attempt.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub stage: String,
    pub attempt: i32,
    pub worker: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub outcome: String,
    pub error_class: Option<String>,
    pub error_message: Option<String>,
    pub model: Option<String>,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
    pub latency_ms: Option<i32>,
}

impl FromRow for Step {
    fn from_row(r: &Row) -> Result<Step, Error> {
        Ok(Step {
            stage: r.try_get("stage")?,
            attempt: r.try_get("attempt")?,
            worker: r.try_get("worker")?,
            started_at: r.try_get("started_at")?,
            finished_at: r.try_get("finished_at")?,
            outcome: r.try_get("outcome")?,
            error_class: r.try_get("error_class")?,
            error_message: r.try_get("error_message")?,
            model: r.try_get("model")?,
            prompt_tokens: r.try_get("prompt_tokens")?,
            completion_tokens: r.try_get("completion_tokens")?,
            latency_ms: r.try_get("latency_ms")?,
        })
    }
}

/// The step history of one request, in order.
pub async fn for_request(client: &impl GenericClient, id: Uuid) -> Result<Vec<Step>, Error> {
    let stmt = client.prepare_cached(FOR_REQUEST).await?;
    rows_as(&client.query(&stmt, &[&id]).await?)
}
