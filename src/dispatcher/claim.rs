//! Claiming: one dispatch loop per stage, and the prompt cache.
//!
//! - A wake (notification, a freed slot, a finished previous stage, the
//!   sweep) makes the stage's loop claim as many due rows as it has free
//!   slots, in batches, with `FOR UPDATE SKIP LOCKED`. Wakes coalesce; a
//!   notification that finds no free slot is not lost, because the row
//!   stays due and the next freed slot claims it.
//! - A row is claimed only when its stage can run: the active prompts are
//!   read first (at most every `prompt_cache_secs`; the last known prompts
//!   serve while the database cannot be read).
//! - Every claimed row is tracked in the in-flight map before its stage
//!   starts, so the heartbeat renews its lease from the first tick.
//! - A failed claim is retried with backoff, never given up while running.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use tokio_util::sync::CancellationToken;

use super::lease::{InFlight, Slot};
use super::{CLAIM_LINGER, Engine, MISSED_AFTER, bump, millis};
use crate::model::{Prompts, StageKind};
use crate::repo::{self, Claimed};

impl Engine {
    pub(super) async fn dispatch_loop(self: Arc<Self>, stage: StageKind, shutdown: CancellationToken) {
        let slot = self.slot(stage);
        let backoff_builder = crate::backoff::reconnect(Duration::from_millis(50), Duration::from_secs(5));
        let mut backoff = backoff_builder.build();
        // Start with a pass: rows may be waiting from before we started, and
        // what it finds no notification delivered (a catch-up, like a sweep).
        slot.swept.store(true, Ordering::Relaxed);
        slot.wake.notify_one();
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = slot.wake.notified() => {}
            }
            // Rows claimed in a pass that only the sweep asked for were
            // found by the sweep; when other wakes came too, only rows that
            // had waited long count.
            let swept = slot.swept.swap(false, Ordering::Relaxed);
            let rung = slot.rung.swap(false, Ordering::Relaxed);
            self.liveness.pass(stage);
            loop {
                if shutdown.is_cancelled() {
                    return;
                }
                slot.starved.store(true, Ordering::SeqCst);
                if slot.sem.available_permits() == 0 {
                    break; // a freed slot wakes us
                }
                if !self.linger(stage, &shutdown).await {
                    return;
                }
                let free = slot.sem.available_permits().min(self.cfg.claim_batch);
                if free == 0 {
                    break;
                }
                let Ok(mut permits) = slot
                    .sem
                    .clone()
                    .try_acquire_many_owned(u32::try_from(free).unwrap_or(u32::MAX))
                else {
                    break;
                };
                match self.claim(stage, free).await {
                    Ok((rows, prompts)) => {
                        backoff = backoff_builder.build();
                        let n = rows.len();
                        if n < free {
                            // Nothing more is due: freed slots need not wake us.
                            slot.starved.store(false, Ordering::SeqCst);
                        }
                        for row in rows {
                            let Some(permit) = permits.split(1) else { break };
                            if swept && (!rung || row.due_for >= MISSED_AFTER) {
                                bump(&self.stats.sweep_recovered);
                                tracing::info!(request.id = %row.id, %stage, waited_ms = millis(row.due_for),
                                    "sweep: claimed a due row that no notification delivered");
                            }
                            self.start(stage, row, prompts.clone(), Slot::Ready(permit));
                        }
                        drop(permits);
                        if n < free {
                            break;
                        }
                    }
                    Err(e) => {
                        drop(permits);
                        let delay = backoff.next().unwrap_or(Duration::from_secs(5));
                        tracing::warn!(%stage, error = %e, retry_in_ms = millis(delay), "claim failed");
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(delay) => {}
                        }
                    }
                }
            }
        }
    }

    /// A busy stage frees its slots one result at a time; claiming each as
    /// it frees would make a statement per row. Lingers a moment for a
    /// worthwhile batch (an idle stage claims at once). False when
    /// `shutdown` fired meanwhile.
    async fn linger(&self, stage: StageKind, shutdown: &CancellationToken) -> bool {
        let slot = self.slot(stage);
        let conc = self.cfg.concurrency.of(stage);
        let worthwhile = self.cfg.claim_batch.min(conc / 4).max(1);
        if slot.sem.available_permits() < worthwhile.min(conc) {
            let until = tokio::time::Instant::now() + CLAIM_LINGER;
            while slot.sem.available_permits() < worthwhile {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return false,
                    _ = slot.wake.notified() => {}
                    _ = tokio::time::sleep_until(until) => break,
                }
            }
        }
        true
    }

    /// Claims up to `free` due rows of `stage`, with the active prompts
    /// they run with: the prompts first, so a row is only claimed when its
    /// stage can run. Counted in the claim metrics and the liveness.
    async fn claim(&self, stage: StageKind, free: usize) -> Result<(Vec<Claimed>, Arc<Prompts>), crate::db::Error> {
        self.liveness.pass(stage);
        self.liveness.claim_started(stage);
        let polled = Instant::now();
        let claimed = match (self.prompts().await, self.pool.get().await) {
            (Err(e), _) => Err(e),
            (Ok(prompts), Ok(client)) => repo::claim_next(
                &client,
                stage,
                free,
                &self.worker,
                self.cfg.lease(),
                self.cfg.memory_records,
            )
            .await
            .map(|rows| (rows, prompts)),
            (Ok(_), Err(e)) => Err(e.into()),
        };
        let rows = claimed.as_ref().ok().map(|(rows, _)| rows.len());
        crate::metrics::claim_poll(stage, rows, polled.elapsed());
        self.liveness.claim_ended(stage);
        claimed
    }

    /// Starts a claimed row: tracks it (so heartbeats renew its lease and
    /// its own notifications do not wake a dispatcher), then runs it.
    pub(super) fn start(self: &Arc<Self>, stage: StageKind, row: Claimed, prompts: Arc<Prompts>, slot: Slot) {
        bump(&self.stats.claimed[stage.index()]);
        let cancel = self.hard_stop.child_token();
        let (held, slot_of, waiting_from) = match slot {
            Slot::Ready(p) => (p, stage, None),
            Slot::After { previous, from } => (previous, from, Some(from)),
        };
        let superseded = self.inflight.lock().ok().and_then(|mut map| {
            map.insert(
                row.id,
                InFlight {
                    token: row.lease_token,
                    cancel: cancel.clone(),
                    finished: false,
                    slot: held,
                    slot_of,
                },
            )
        });
        // Only a claim that a database crash forgot (claim.sql) is claimed
        // again while this process still runs it: the old run's lease is
        // gone, so it stops (its result would be rejected anyway).
        if let Some(old) = superseded {
            bump(&self.stats.lease_lost);
            tracing::warn!(request.id = %row.id, old_token = old.token, new_token = row.lease_token,
                "claimed a row this process still ran under an older lease; the older run stops");
            old.cancel.cancel();
            let from = old.slot_of;
            drop(old);
            self.freed(from);
        }
        let engine = self.clone();
        self.tasks
            .spawn(engine.execute(stage, row, prompts, cancel, waiting_from));
    }

    /// The active prompts, read at most every `prompt_cache_secs`. If the
    /// database cannot be read, the last known prompts are used; with none
    /// known yet, the error is returned (and nothing is claimed).
    async fn prompts(&self) -> Result<Arc<Prompts>, crate::db::Error> {
        let ttl = Duration::from_secs(self.cfg.prompt_cache_secs);
        let cached = self.prompts.lock().ok().and_then(|g| g.clone());
        if let Some((at, p)) = &cached
            && at.elapsed() < ttl
        {
            return Ok(p.clone());
        }
        let fresh = match self.pool.get().await {
            Ok(client) => repo::active_prompts(&client).await,
            Err(e) => Err(e.into()),
        };
        match fresh {
            Ok(p) => {
                let p = Arc::new(p);
                if let Ok(mut g) = self.prompts.lock() {
                    *g = Some((Instant::now(), p.clone()));
                }
                Ok(p)
            }
            Err(e) => match cached {
                Some((_, p)) => {
                    tracing::warn!(error = %e, "cannot read system_prompts; using the last known prompts");
                    Ok(p)
                }
                None => Err(e),
            },
        }
    }

    /// The prompts last read, if any (no database read).
    pub(super) fn cached_prompts(&self) -> Option<Arc<Prompts>> {
        self.prompts
            .lock()
            .ok()
            .and_then(|g| g.as_ref().map(|(_, p)| p.clone()))
    }
}
