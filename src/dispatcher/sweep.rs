//! The catch-up sweep: takes back expired leases and wakes every
//! dispatcher, so a due row is claimed within one sweep interval even if
//! every notification was lost.
//!
//! - Runs every `sweep_secs` (jittered ±10 %, so daemons do not sweep in
//!   lockstep) and at once after the LISTEN session (re)connects.
//! - An expired lease goes back to its ready status (attempt spent) or to
//!   `FAILED` past `max_attempts`, in batches of [`RECLAIM_BATCH`] rows
//!   ([`reclaim_all`], which `maasctl sweep` uses too).
//! - A wait for a person (WAITING_USER_INPUT, AWAITING_REVIEW) whose limit
//!   passed ends as its tenant chose ([`expire_all_waits`], also
//!   `maasctl sweep`): every daemon sweeps, each wait ends once.
//! - A failed sweep is logged and tried again at the next tick.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::Engine;
use crate::model::StageKind;
use crate::repo::{self, GenericClient, Reclaimed};
use crate::service::Service;

/// Rows the sweep takes back per statement.
pub const RECLAIM_BATCH: usize = 500;

/// The sweep as a daemon service.
pub struct Sweep {
    engine: Arc<Engine>,
}

impl Sweep {
    pub fn new(engine: Arc<Engine>) -> Sweep {
        Sweep { engine }
    }
}

impl Service for Sweep {
    fn name(&self) -> &'static str {
        "sweep"
    }

    fn run(self: Arc<Self>, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        self.engine.clone().sweeper(shutdown).boxed()
    }
}

impl Engine {
    /// The periodic catch-up sweep (and on demand, after the listener connects).
    async fn sweeper(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let jitter = rand::random_range(0.9..=1.1);
            let period = self.cfg.sweep_interval().mul_f64(jitter);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
                _ = self.sweep_now.notified() => {}
            }
            if let Err(e) = self.sweep_once().await {
                self.liveness.sweep_failed();
                tracing::warn!(error = %e, "sweep failed");
            }
        }
    }

    /// One sweep: take back expired leases, end expired waits, then wake
    /// every dispatcher (a wait that went back to NEW is due at once).
    pub async fn sweep_once(&self) -> Result<usize, crate::db::Error> {
        let client = self.pool.get().await?;
        let total = reclaim_all(&client, self.cfg.max_attempts, |batch| {
            for r in batch {
                tracing::warn!(request.id = %r.id, was = %r.was, now = %r.new_status, "sweep: lease expired; row taken back");
            }
            self.stats.reclaimed.fetch_add(batch.len() as u64, Ordering::Relaxed);
        })
        .await?;
        expire_all_waits(&client, |batch| {
            for w in batch {
                tracing::info!(request.id = %w.id, was = %w.was, now = %w.new_status, "sweep: wait expired");
                crate::metrics::observe_expiry(w.was, w.new_status);
            }
        })
        .await?;
        drop(client);
        self.liveness.swept();
        for stage in StageKind::ALL {
            let slot = self.slot(stage);
            slot.swept.store(true, Ordering::Relaxed);
            slot.wake.notify_one();
        }
        tracing::trace!(reclaimed = total, "sweep done");
        Ok(total)
    }
}

/// Takes back every expired lease, [`RECLAIM_BATCH`] rows per statement,
/// handing each batch to `taken` as it goes; returns how many. The sweep
/// of the daemon and `maasctl sweep` both take leases back with it.
pub async fn reclaim_all(
    client: &impl GenericClient,
    max_attempts: u32,
    mut taken: impl FnMut(&[Reclaimed]),
) -> Result<usize, crate::db::Error> {
    let mut total = 0;
    loop {
        let batch = repo::reclaim_expired(client, max_attempts, RECLAIM_BATCH).await?;
        taken(&batch);
        total += batch.len();
        if batch.len() < RECLAIM_BATCH {
            return Ok(total);
        }
    }
}

/// Ends every wait whose limit passed, [`RECLAIM_BATCH`] rows per
/// statement, handing each batch to `ended` as it goes; returns how many.
pub async fn expire_all_waits(
    client: &impl GenericClient,
    mut ended: impl FnMut(&[repo::waits::Expired]),
) -> Result<usize, crate::db::Error> {
    let mut total = 0;
    loop {
        let batch = repo::waits::expire_waits(client, RECLAIM_BATCH).await?;
        ended(&batch);
        total += batch.len();
        if batch.len() < RECLAIM_BATCH {
            return Ok(total);
        }
    }
}
