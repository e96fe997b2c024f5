//! Retention: deleting old terminal requests (the schema removes the rows
//! that belong to them) and old operator actions that concern no request,
//! in bounded batches that skip locked rows.

use std::time::Duration;

use super::GenericClient;

use super::{as_limit, secs};
use crate::db::Error;

super::statements! {
    REQUESTS = "retention_requests",
    ACTIONS = "retention_actions",
    TURNS = "retention_turns",
    RECORDS = "retention_records",
}

/// Deletes up to `batch` terminal requests finished more than `keep` ago;
/// returns how many.
pub async fn delete_requests(client: &impl GenericClient, keep: Duration, batch: usize) -> Result<i64, Error> {
    super::query_one_value(client, REQUESTS, &[&secs(keep), &as_limit(batch)], "deleted").await
}

/// Deletes up to `batch` request-less operator actions older than `keep`;
/// returns how many.
pub async fn delete_actions(client: &impl GenericClient, keep: Duration, batch: usize) -> Result<i64, Error> {
    super::query_one_value(client, ACTIONS, &[&secs(keep), &as_limit(batch)], "deleted").await
}

/// Deletes up to `batch` turns older than `keep` (bumping their users'
/// memory versions); returns how many.
pub async fn delete_turns(client: &impl GenericClient, keep: Duration, batch: usize) -> Result<i64, Error> {
    super::query_one_value(client, TURNS, &[&secs(keep), &as_limit(batch)], "deleted").await
}

/// Deletes up to `batch` records whose period ended more than `keep` ago
/// (bumping their users' memory versions); returns how many.
pub async fn delete_records(client: &impl GenericClient, keep: Duration, batch: usize) -> Result<i64, Error> {
    super::query_one_value(client, RECORDS, &[&secs(keep), &as_limit(batch)], "deleted").await
}
