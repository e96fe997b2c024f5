//! Leases this process holds: the in-flight map and the heartbeat.
//!
//! - Every row this process holds (running, or finished and waiting to be
//!   written) has one entry, keyed by request id and guarded by its lease
//!   token: an entry is only ever taken by the holder of the same token,
//!   never by a newer claim of the same row.
//! - An entry holds its stage slot until the result is written, so the
//!   per-stage concurrency bounds all outstanding work.
//! - The heartbeat renews every held lease in one statement, every third of
//!   the lease (in ascending id order, like every multi-row writer, so it
//!   never deadlocks with a result write); a lease found lost cancels its
//!   running stage.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{Engine, bump};
use crate::model::StageKind;
use crate::repo;

/// A row this process holds: running, or finished and waiting to be
/// written. Its stage slot is held until the result is written, so the
/// per-stage concurrency bounds all outstanding work, unwritten results
/// included (without that, a fast stage could run ahead of the writer).
pub(super) struct InFlight {
    pub(super) token: i64,
    pub(super) cancel: CancellationToken,
    pub(super) finished: bool,
    /// The stage slot this row holds (while a chained row waits, the slot
    /// of the stage it finished), and whose slot it is.
    pub(super) slot: OwnedSemaphorePermit,
    pub(super) slot_of: StageKind,
}

/// How a claimed row holds its stage slot.
pub(super) enum Slot {
    /// A slot of its stage.
    Ready(OwnedSemaphorePermit),
    /// A chained row that found no free slot: the slot of the stage it
    /// finished, traded for one of its own when one frees.
    After {
        previous: OwnedSemaphorePermit,
        from: StageKind,
    },
}

impl Engine {
    /// Drops a row this process held under lease `token`, freeing its
    /// stage slot.
    pub(super) fn forget(&self, id: Uuid, token: i64) {
        self.drop_early(id);
        if let Some(f) = self.take(id, token) {
            let stage = f.slot_of;
            drop(f);
            self.freed(stage);
        }
    }

    /// Stops tracking a row held under lease `token` (not a newer claim of
    /// the same row); its stage slot is freed when the entry drops.
    pub(super) fn take(&self, id: Uuid, token: i64) -> Option<InFlight> {
        self.inflight.lock().ok().and_then(|mut map| {
            if map.get(&id).is_some_and(|f| f.token == token) {
                map.remove(&id)
            } else {
                None
            }
        })
    }

    /// Renews every lease this process holds, every third of the lease.
    pub(super) async fn heartbeat(self: Arc<Self>, done: CancellationToken) {
        let period = (self.cfg.lease() / 3).max(Duration::from_millis(200));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = done.cancelled() => return,
                _ = tick.tick() => {}
            }
            let mut held: Vec<(Uuid, i64)> = match self.inflight.lock() {
                Ok(map) => map.iter().map(|(id, f)| (*id, f.token)).collect(),
                Err(_) => continue,
            };
            held.sort_unstable();
            if held.is_empty() {
                continue;
            }
            let renewed = match self.pool.get().await {
                Ok(client) => repo::extend_leases(&client, &held, self.cfg.lease()).await,
                Err(e) => Err(e.into()),
            };
            let (renewed, unknown) = match renewed {
                Ok(renewed) => (renewed, HashSet::new()),
                Err(e) if held.len() > 1 && super::contention::contended(&e) => {
                    tracing::warn!(leases = held.len(), error = %e,
                        "a lock held by another transaction stopped the heartbeat; renewing leases one by one");
                    self.renew_apart(&held).await
                }
                Err(e) => {
                    tracing::warn!(leases = held.len(), error = %e, "heartbeat failed; leases not renewed");
                    continue;
                }
            };
            if renewed.len() == held.len() {
                continue;
            }
            let renewed: HashSet<Uuid> = renewed.into_iter().collect();
            if let Ok(map) = self.inflight.lock() {
                for (id, token) in &held {
                    if renewed.contains(id) || unknown.contains(id) {
                        continue;
                    }
                    if let Some(f) = map.get(id)
                        && f.token == *token
                        && !f.finished
                    {
                        bump(&self.stats.lease_lost);
                        tracing::warn!(request.id = %id, "lease lost while the stage was running; cancelling it");
                        f.cancel.cancel();
                    }
                }
            }
        }
    }
}
