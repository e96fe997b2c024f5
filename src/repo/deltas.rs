//! `answer_deltas`: the pieces of streamed answers, written in batches by
//! the daemon that runs the respond stage and read by any daemon whose
//! client missed some (`sql/0022_answer_streaming.sql`). Only requests that
//! asked to stream (`pipeline_runs.stream`) reach these statements.

use std::time::Duration;

use uuid::Uuid;

use super::{GenericClient, secs};
use crate::db::Error;

super::statements! {
    PUBLISH = "delta_publish",
    AFTER = "delta_after",
    CLEANUP = "delta_cleanup",
}

/// Largest notification payload written with its text inline (the server
/// refuses payloads of 8,000 bytes and more); a longer piece is sent as a
/// pointer to its row.
pub const INLINE_PAYLOAD_BYTES: i32 = 7900;

super::row_struct! {
    /// One stored piece of an answer.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct DeltaRow {
        pub attempt: i32,
        pub seq: i32,
        /// The text that follows the previous piece; `None` for a restart.
        pub text: Option<String>,
    }
}

/// One batch of attempt `attempt` of request `id`: `pieces` numbered from
/// `first_seq` (`None` is a restart), stored and notified in one statement.
pub async fn publish(
    client: &impl GenericClient,
    id: Uuid,
    attempt: i32,
    first_seq: i32,
    pieces: &[Option<String>],
) -> Result<(), Error> {
    let seqs: Vec<i32> = (first_seq..).take(pieces.len()).collect();
    super::execute(client, PUBLISH, &[&id, &attempt, &seqs, &pieces, &INLINE_PAYLOAD_BYTES]).await?;
    Ok(())
}

/// The pieces of request `id` after (`attempt`, `seq`), in order, at most
/// `limit`.
pub async fn after(
    client: &impl GenericClient,
    id: Uuid,
    attempt: i32,
    seq: i32,
    limit: usize,
) -> Result<Vec<DeltaRow>, Error> {
    super::query_as(client, AFTER, &[&id, &attempt, &seq, &super::as_limit(limit)]).await
}

/// Deletes request `id`'s pieces up to `attempt`, and every piece older
/// than `max_age` (left by a daemon that died before its cleanup).
pub async fn cleanup(client: &impl GenericClient, id: Uuid, attempt: i32, max_age: Duration) -> Result<u64, Error> {
    super::execute(client, CLEANUP, &[&id, &attempt, &secs(max_age)]).await
}
