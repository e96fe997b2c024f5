//! Retention: deleting old terminal requests (the schema removes the rows
//! that belong to them) and old operator actions that concern no request,
//! in bounded batches that skip locked rows.

use std::time::Duration;

use deadpool_postgres::GenericClient;

use super::{as_limit, secs};
use crate::db::Error;

const REQUESTS: &str = include_str!("../../sql/queries/retention_runs.sql");
const ACTIONS: &str = include_str!("../../sql/queries/retention_actions.sql");

/// This file's statements, for [`super::all`].
pub(super) const STATEMENTS: &[(&str, &str)] = &[("retention_runs", REQUESTS), ("retention_actions", ACTIONS)];

/// Deletes up to `batch` terminal requests finished more than `keep` ago;
/// returns how many.
pub async fn delete_requests(client: &impl GenericClient, keep: Duration, batch: usize) -> Result<i64, Error> {
    let stmt = client.prepare_cached(REQUESTS).await?;
    Ok(client
        .query_one(&stmt, &[&secs(keep), &as_limit(batch)])
        .await?
        .try_get("deleted")?)
}

/// Deletes up to `batch` request-less operator actions older than `keep`;
/// returns how many.
pub async fn delete_actions(client: &impl GenericClient, keep: Duration, batch: usize) -> Result<i64, Error> {
    let stmt = client.prepare_cached(ACTIONS).await?;
    Ok(client
        .query_one(&stmt, &[&secs(keep), &as_limit(batch)])
        .await?
        .try_get("deleted")?)
}
