//! Publishing a streamed answer: the pieces the respond stage sends on its
//! [`DeltaSink`] go to `answer_deltas` in batches, each batch one statement
//! that stores its rows and notifies `answer_deltas` (any daemon's live hub
//! listens; `docs/architecture.md`, "Answers that stream").
//!
//! - Only a respond stage of a request that asked to stream gets a sink;
//!   every other attempt costs nothing here.
//! - The first piece is written at once; later ones are gathered and
//!   written at most every [`BATCH_EVERY`], so a fast model costs about 33
//!   statements a second per stream, a slow one a statement per piece.
//! - Pieces are numbered per attempt from 1 (`seq`); a restart of the model
//!   call inside the attempt is a row of its own (no text), and the text
//!   gathered before it and not yet written is dropped (it is void).
//! - A batch that cannot be written is kept and tried again with the next:
//!   no number is ever skipped. Clients never depend on a piece: the
//!   terminal state carries the whole answer.
//! - When the stage ends (its sink dropped) the last batch goes out, and
//!   the engine waits for it (at most [`FLUSH_WAIT`]) before it writes the
//!   attempt's result: a client gets the answer's last pieces before the
//!   terminal state. The rows of this request up to this attempt are
//!   deleted 10 s (`KEEP`) later, time for a client that reconnects
//!   meanwhile to read them.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use uuid::Uuid;

use super::Engine;
use crate::db::Pool;
use crate::llm::{Delta, DeltaSink};
use crate::model::StageKind;
use crate::repo::{self, Claimed};
use crate::stage::StageInput;

/// Shortest time between two batches of one stream.
pub const BATCH_EVERY: Duration = Duration::from_millis(30);
/// Longest wait for a stream's last batch before the attempt's result is
/// written (a batch that cannot be written does not hold the request up).
pub const FLUSH_WAIT: Duration = Duration::from_secs(2);
/// How long a finished attempt's pieces stay readable.
const KEEP: Duration = Duration::from_secs(10);
/// Pieces older than this are deleted by any cleanup (a daemon that died
/// did not delete its own).
const ORPHAN_AGE: Duration = Duration::from_secs(3600);

impl Engine {
    /// The sink of a respond stage of a request that asked to stream (and
    /// its publisher, started here), with the signal that the publisher
    /// wrote the last piece after the sink was dropped; `None` for every
    /// other attempt.
    pub(super) fn delta_sink(&self, stage: StageKind, row: &Claimed) -> Option<(DeltaSink, oneshot::Receiver<()>)> {
        // (an answer that awaits review is not shown before it is approved)
        if stage != StageKind::Respond || !row.stream || row.review {
            return None;
        }
        let (sink, pieces) = mpsc::unbounded_channel();
        let (flushed, written) = oneshot::channel();
        let pool = self.pool.clone();
        tokio::spawn(publish(pool, row.id, row.attempt, pieces, BATCH_EVERY, Some(flushed)));
        Some((sink, written))
    }
}

/// Drops the stage's sink and waits (at most [`FLUSH_WAIT`]) for its
/// publisher's last batch: a streamed answer's last pieces go out before
/// the attempt's result is written, so its clients get them before the
/// terminal state.
pub(super) async fn last_pieces_out(input: &mut StageInput, written: Option<oneshot::Receiver<()>>) {
    input.deltas = None;
    if let Some(written) = written {
        let _ = tokio::time::timeout(FLUSH_WAIT, written).await;
    }
}

/// The pieces gathered for the next batch: text runs merged, `None` for a
/// restart.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch(pub Vec<Option<String>>);

impl Batch {
    /// Adds a piece: text joins the text before it; a restart voids the
    /// text not yet written.
    pub fn push(&mut self, delta: Delta) {
        match delta {
            Delta::Text(t) if t.is_empty() => {}
            Delta::Text(t) => match self.0.last_mut() {
                Some(Some(last)) => last.push_str(&t),
                _ => self.0.push(Some(t)),
            },
            Delta::Restart => {
                self.0.retain(Option::is_none);
                self.0.truncate(1);
                if self.0.is_empty() {
                    self.0.push(None);
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Writes the pieces of attempt `attempt` of request `id` as they come,
/// batched every `every`, until the stage drops its sink; then says so on
/// `flushed` and cleans up.
pub async fn publish(
    pool: Pool,
    id: Uuid,
    attempt: i32,
    mut pieces: mpsc::UnboundedReceiver<Delta>,
    every: Duration,
    flushed: Option<oneshot::Sender<()>>,
) {
    let mut batch = Batch::default();
    let mut next_seq = 1;
    let mut last_write: Option<Instant> = None;
    let mut open = true;
    while open {
        match pieces.recv().await {
            Some(d) => batch.push(d),
            None => open = false,
        }
        // Gather until the batch is due (at once for the first).
        if let Some(at) = last_write {
            let due = at + every;
            while open && Instant::now() < due {
                match tokio::time::timeout_at(due, pieces.recv()).await {
                    Ok(Some(d)) => batch.push(d),
                    Ok(None) => open = false,
                    Err(_) => break,
                }
            }
        }
        while let Ok(d) = pieces.try_recv() {
            batch.push(d);
        }
        if batch.is_empty() {
            continue;
        }
        last_write = Some(Instant::now());
        match write(&pool, id, attempt, next_seq, &batch).await {
            Ok(()) => {
                next_seq += i32::try_from(batch.0.len()).unwrap_or(i32::MAX);
                batch = Batch::default();
            }
            Err(e) => {
                tracing::warn!(request.id = %id, error = %e, "stream: could not write a batch; keeping it for the next")
            }
        }
    }
    if let Some(flushed) = flushed {
        let _ = flushed.send(()); // the engine may have stopped waiting
    }
    if next_seq == 1 && batch.is_empty() {
        return; // nothing was written
    }
    tokio::time::sleep(KEEP).await;
    let cleaned = async {
        let client = pool.get().await?;
        repo::deltas::cleanup(&client, id, attempt, ORPHAN_AGE).await
    };
    if let Err(e) = cleaned.await {
        tracing::debug!(request.id = %id, error = %e, "stream: could not delete the pieces; a later cleanup will");
    }
}

async fn write(pool: &Pool, id: Uuid, attempt: i32, first_seq: i32, batch: &Batch) -> Result<(), crate::db::Error> {
    let client = pool.get().await?;
    repo::deltas::publish(&client, id, attempt, first_seq, &batch.0).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Delta {
        Delta::Text(s.into())
    }

    #[test]
    fn a_batch_merges_text_and_a_restart_voids_what_was_not_written() {
        let mut b = Batch::default();
        for d in [text("Hel"), text(""), text("lo")] {
            b.push(d);
        }
        assert_eq!(b.0, vec![Some("Hello".to_string())]);
        b.push(Delta::Restart);
        assert_eq!(b.0, vec![None]);
        b.push(text("Hi"));
        b.push(Delta::Restart);
        b.push(text("Hey"));
        assert_eq!(b.0, vec![None, Some("Hey".to_string())]);
    }
}
