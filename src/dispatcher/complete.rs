//! Group commit: results written in batches, fenced on their lease tokens.
//!
//! - One statement per batch, whatever the mix of stages and outcomes, with
//!   the step history; at most `WRITERS` batches in flight, so one commits
//!   while the next is gathered.
//! - A result whose lease was lost is discarded; the row is unchanged.
//! - A batch stopped by a lock held elsewhere is written in parts, so only
//!   the results that need the locked rows wait (`contention.rs`).
//! - A batch is retried while the database is unreachable for at most one
//!   lease period; past that the leases have expired and the sweep retries
//!   the stages. Every result is written (or given up) before the completer
//!   returns.
//! - Chaining: a success with a free slot in its next stage here is claimed
//!   for that stage by the finishing statement itself and started at once.
//! - One result cannot fail the others (invariant 9): every result is
//!   sanitised before it is written ([`sanitise_result`]: NULs removed, sizes
//!   and nesting capped; an analysis that cannot be stored fails its own
//!   request with the reason), and a batch the database still refuses for
//!   a reason other than a lost connection is written in halves, down to
//!   the offending result, which is written alone as a failure of its
//!   request naming the database's reason. Each such event counts in
//!   `maas_poison_total{kind}`.
//! - A retried or deferred row wakes its stage after its delay (the row's
//!   `run_after` is the truth; the timer is a doorbell).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::lease::Slot;
use super::{Engine, WRITERS, bump, millis};
use crate::model::{Outcome, StageKind, Status};
use crate::repo::{self, Claimed, Ended, Finished, Output, Unsuccessful};
use crate::sanitize::{
    self, MAX_ANALYSIS_BYTES, MAX_ANSWER_CHARS, MAX_CONTEXT_CHARS, MAX_ERROR_CHARS, MAX_MODEL_CHARS, Poison, Sanitised,
};

/// Parts of a contended batch written at once (see `contention.rs`).
const SPLIT_WRITERS: usize = 4;

/// The stage each result of a batch is chained to, by its row and the
/// lease token it was run under (a batch may hold a superseded attempt's result
/// for the same row).
type Chains = HashMap<(Uuid, i64), StageKind>;

/// How far [`Engine::write_retrying`] got with a batch.
enum Written {
    /// These results were written (the batch keeps only them).
    All(Vec<repo::Applied>),
    /// A lock stopped it before any was written; its parts were written
    /// apart, each with its own follow-up.
    Apart,
    /// None was written within the lease.
    None,
}

impl Engine {
    /// Writes results in batches until `done` fires and the queue is empty.
    pub(super) async fn completer(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<Finished>, done: CancellationToken) {
        let flushes = Arc::new(Semaphore::new(WRITERS));
        let writers = TaskTracker::new();
        loop {
            let first = tokio::select! {
                biased;
                msg = rx.recv() => msg,
                _ = done.cancelled() => rx.try_recv().ok(),
            };
            let Some(first) = first else { break };
            let mut batch = vec![first];
            while batch.len() < self.cfg.complete_batch {
                match rx.try_recv() {
                    Ok(f) => batch.push(f),
                    Err(_) => break,
                }
            }
            let Ok(permit) = flushes.clone().acquire_owned().await else {
                break;
            };
            let engine = self.clone();
            writers.spawn(async move {
                engine.flush(batch).await;
                drop(permit);
            });
        }
        writers.close();
        writers.wait().await;
    }

    /// Drops the results of attempts a newer claim of their row superseded here
    /// (a claim a database crash forgot, and the row claimed again: see
    /// [`Engine::start`]). Their lease is gone, so the database would refuse
    /// them anyway; dropped now, such a result cannot share a batch with the
    /// current attempt's result for the same row, nor end the respond stage
    /// that run started early.
    fn drop_superseded(&self, batch: &mut Vec<Finished>) {
        let Ok(map) = self.inflight.lock() else {
            return;
        };
        batch.retain(|f| {
            let current = map.get(&f.id).map(|held| held.token);
            let stale = current.is_some_and(|t| t != f.lease_token);
            // (counted as a lost lease when the newer claim started)
            if stale {
                tracing::warn!(request.id = %f.id, stage = %f.stage, attempt = f.attempt, outcome = f.outcome().as_str(),
                    lease_token = f.lease_token, current_token = current,
                    "result of an attempt a newer claim superseded; discarded, the row is unchanged");
            }
            !stale
        });
    }

    /// Writes one batch, retrying while the database is unreachable, for at
    /// most one lease period: past that the leases have expired, and the
    /// sweep (here or elsewhere) will retry the stages.
    async fn flush(self: Arc<Self>, mut batch: Vec<Finished>) {
        // Every multi-row writer locks rows in ascending id order, so two of
        // them (flushes, heartbeats) never deadlock.
        batch.sort_unstable_by_key(|f| f.id);
        self.drop_superseded(&mut batch);
        if batch.is_empty() {
            return;
        }
        for f in &mut batch {
            sanitise(f);
        }
        // Chain: rows that finished a stage and have a free slot in their
        // next stage here are claimed for it by the finishing statement.
        let (mut chains, mut permits) = self.chain_candidates(&batch);
        let reserved = permits.each_ref().map(Option::is_some);
        // While rows may be chained, shutdown must wait for them to start.
        let _tracking = (!chains.is_empty()).then(|| self.tasks.token());
        match self.write_retrying(&mut batch, &mut chains, &mut permits).await {
            Written::All(applied) => self.settle(&batch, applied, permits, reserved),
            Written::Apart => {
                drop(permits);
                for stage in StageKind::ALL {
                    if reserved[stage.index()] {
                        self.freed(stage);
                    }
                }
            }
            Written::None => {}
        }
    }

    /// Writes `batch` ([`Engine::write_split`]), retrying while the database
    /// is unreachable for at most one lease period; a retry drops the
    /// chaining (`chains`, `permits`): the simplest statement first. Past
    /// the lease the results not written are forgotten and `batch` keeps
    /// only those that were.
    async fn write_retrying(
        self: &Arc<Self>,
        batch: &mut Vec<Finished>,
        chains: &mut Chains,
        permits: &mut [Option<OwnedSemaphorePermit>; 3],
    ) -> Written {
        let deadline = Instant::now() + self.cfg.lease();
        let mut backoff = crate::backoff::reconnect(Duration::from_millis(50), Duration::from_secs(2)).build();
        let mut contended_tries = 0;
        // Results written so far: a split batch is written left to right, so
        // when the connection drops in the middle, `batch[..written]` is
        // committed and a retry writes only the rest.
        let mut done = Vec::new();
        let mut written = 0;
        loop {
            let res = match self.pool.get().await {
                Ok(client) => self
                    .write_split(&client, &mut batch[written..], chains, &mut done)
                    .await
                    .map_err(|(e, n)| {
                        written += n;
                        e
                    }),
                Err(e) => Err(e.into()),
            };
            let e = match res {
                Ok(()) => return Written::All(done),
                Err(e) => e,
            };
            let left = batch.len() - written;
            let contended = super::contention::contended(&e);
            if contended {
                for f in &mut batch[written..] {
                    super::contention::unfuse_respond(f);
                }
            }
            if left > 1 && contended {
                tracing::warn!(results = left, error = %e,
                    "a lock held by another transaction stopped the result batch; writing its parts apart");
                self.flush_apart(batch.split_off(written)).await;
                // The rows written before the lock get their usual follow-up.
                return if written > 0 {
                    Written::All(done)
                } else {
                    Written::Apart
                };
            }
            // A single result that logs a turn waits for the lock (no log
            // line, no deadline); see `contention.rs`.
            let turn_waits = left == 1 && contended && super::contention::logs_a_turn(&batch[written]);
            if turn_waits {
                contended_tries += 1;
                if contended_tries >= super::contention::LOG_TRIES {
                    super::contention::give_up_logging(self, &mut batch[written], &e);
                }
            } else if Instant::now() >= deadline {
                tracing::error!(results = left, error = %e,
                    "could not write stage results within the lease; the sweep will retry these stages");
                for f in &batch[written..] {
                    self.forget(f.id, f.lease_token);
                }
                batch.truncate(written);
                return if written == 0 {
                    Written::None
                } else {
                    Written::All(done)
                };
            }
            chains.clear();
            *permits = [None, None, None];
            let delay = backoff.next().unwrap_or(Duration::from_secs(1));
            if !turn_waits {
                tracing::warn!(results = batch.len(), error = %e, retry_in_ms = millis(delay),
                    "could not write stage results; retrying");
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// Writes the parts of a batch a lock stopped apart, a few at once
    /// (`contention.rs`).
    async fn flush_apart(self: &Arc<Self>, rest: Vec<Finished>) {
        let parts = super::contention::split(rest);
        let writes = parts.into_iter().map(|part| Box::pin(self.clone().flush(part)));
        futures_util::StreamExt::for_each_concurrent(futures_util::stream::iter(writes), SPLIT_WRITERS, |w| w).await;
    }

    /// What follows a written batch: its metrics, its rows chained to their
    /// next stage, its retries woken after their delay, its slots freed.
    fn settle(
        self: &Arc<Self>,
        batch: &[Finished],
        applied: Vec<repo::Applied>,
        mut permits: [Option<OwnedSemaphorePermit>; 3],
        reserved: [bool; 3],
    ) {
        let now = chrono::Utc::now();
        let applied: HashMap<(Uuid, i64), repo::Applied> =
            applied.into_iter().map(|a| ((a.id, a.result_token), a)).collect();
        let mut chained = Vec::new();
        // Stages where a slot was freed, and where a row became due.
        let mut freed = [false; 3];
        let mut woken = [false; 3];
        for f in batch {
            let mut held = self.take(f.id, f.lease_token);
            if let Some(h) = &held {
                freed[h.slot_of.index()] = true;
            }
            // A respond stage started early runs on only for a respond
            // stage of its request: the one this result was chained to, or
            // the one a claim starts for the request now due in READY (its
            // write was retried without chaining, or the daemon is stopping).
            if f.stage == StageKind::Analyze
                && !applied.get(&(f.id, f.lease_token)).is_some_and(|d| {
                    d.fused
                        && f.outcome() == Outcome::Succeeded
                        && matches!(d.chained, Some((StageKind::Respond, _)) | None)
                })
            {
                self.drop_early(f.id);
            }
            let Some(done) = applied.get(&(f.id, f.lease_token)) else {
                bump(&self.stats.lease_lost);
                tracing::warn!(request.id = %f.id, stage = %f.stage, attempt = f.attempt, outcome = f.outcome().as_str(),
                    "lease lost before the result was written; result discarded, the row is unchanged");
                continue;
            };
            crate::metrics::observe_result(f, done.created_at, now);
            let next = self.count_fused(f, done, now);
            if f.outcome() != Outcome::Succeeded {
                self.count_unsuccessful(f);
                continue;
            }
            bump(&self.stats.succeeded[f.stage.index()]);
            match (&done.chained, held.take()) {
                (Some((stage, row)), Some(held)) => chained.push((*stage, row.clone(), f.stage, held.slot)),
                (Some(_), None) => tracing::warn!(request.id = %f.id,
                    "a chained row is no longer tracked here; the sweep takes it back when its lease runs out"),
                (None, _) => {
                    if let Some(next) = next {
                        woken[next.index()] = true;
                    }
                }
            }
        }
        // After the loop above: a chained row has the same id as the result
        // it follows, and its entry must not be the one taken.
        self.start_chained(chained, &mut permits);
        drop(permits); // reserved slots no chained row took
        for stage in StageKind::ALL {
            if woken[stage.index()] {
                self.wake(stage);
            } else if freed[stage.index()] || reserved[stage.index()] {
                self.freed(stage);
            }
        }
    }

    /// Counts a fused assemble that was written with its analysis; the
    /// stage whose rows the result made due.
    fn count_fused(&self, f: &Finished, done: &repo::Applied, now: chrono::DateTime<chrono::Utc>) -> Option<StageKind> {
        let Some(fused) = f.fused().filter(|_| done.fused) else {
            return f.stage.next();
        };
        let respond = fused.respond.as_ref().filter(|_| done.responded);
        if respond.is_some() {
            crate::metrics::observe_completed(done.created_at, now);
        }
        let counted = [
            Some((StageKind::Assemble, fused.latency_ms)),
            respond.map(|r| (StageKind::Respond, r.latency_ms)),
        ];
        let mut last = StageKind::Assemble;
        for (stage, latency_ms) in counted.into_iter().flatten() {
            bump(&self.stats.claimed[stage.index()]);
            bump(&self.stats.succeeded[stage.index()]);
            crate::metrics::observe_stage(stage, Outcome::Succeeded, latency_ms);
            last = stage;
        }
        last.next()
    }

    /// Counts a written result other than a success; a retry wakes its
    /// stage after its delay.
    fn count_unsuccessful(self: &Arc<Self>, f: &Finished) {
        match f.outcome() {
            Outcome::Retrying | Outcome::Deferred => {
                bump(&self.stats.retried[f.stage.index()]);
                crate::metrics::stage_failure(f.stage, f.outcome(), f.error_class());
                self.wake_later(f.stage, f.delay());
            }
            Outcome::Failed => {
                bump(&self.stats.failed);
                crate::metrics::stage_failure(f.stage, f.outcome(), f.error_class());
            }
            Outcome::Succeeded | Outcome::Released | Outcome::LeaseExpired => {}
        }
    }

    /// Writes `batch` in one statement, adding what it applied to `done`; if
    /// the database refuses it for a reason other than a lost connection,
    /// writes each half the same way (left first), and a single refused
    /// result as a failure of its request (the reason names the database's
    /// error). A connection error is returned with how many results of
    /// `batch`, from its start, were written before it.
    fn write_split<'a>(
        &'a self,
        client: &'a deadpool_postgres::Client,
        batch: &'a mut [Finished],
        chains: &'a Chains,
        done: &'a mut Vec<repo::Applied>,
    ) -> BoxFuture<'a, Result<(), (crate::db::Error, usize)>> {
        async move {
            let lease = self.cfg.lease();
            let err = match repo::finish_batch(client, &self.worker, batch, |f| chains.get(&(f.id, f.lease_token)).copied(), lease).await {
                Ok(applied) => {
                    done.extend(applied);
                    return Ok(());
                }
                // A lock held elsewhere is no fault of these results: the
                // caller writes them apart and retries (`contention.rs`).
                Err(e) if e.is_connection() || super::contention::contended(&e) => return Err((e, 0)),
                Err(e) => e,
            };
            if batch.len() > 1 {
                tracing::warn!(results = batch.len(), error = %err,
                    "the database refused a batch of stage results; writing it in halves");
                let (a, b) = batch.split_at_mut(batch.len() / 2);
                let left = a.len();
                self.write_split(client, a, chains, done).await?;
                return self
                    .write_split(client, b, chains, done)
                    .await
                    .map_err(|(e, n)| (e, left + n));
            }
            let Some(f) = batch.first_mut() else {
                return Ok(());
            };
            crate::metrics::poison(Poison::Unwritable.as_str());
            tracing::warn!(request.id = %f.id, stage = %f.stage, attempt = f.attempt, error = %err,
                "the database refused this stage result; the request fails with the reason");
            let reason = format!("the {} stage's result could not be stored: {err}", f.stage);
            fail_unstorable(f, "unwritable_result", reason);
            let id = f.id;
            match repo::finish_batch(client, &self.worker, batch, |_| None, lease).await {
                Ok(applied) => {
                    done.extend(applied);
                    Ok(())
                }
                Err(e) if e.is_connection() => Err((e, 0)),
                Err(e) => {
                    tracing::error!(request.id = %id, error = %e,
                        "the database refused even the failure of this request; the sweep takes it back when its lease runs out");
                    Ok(())
                }
            }
        }
        .boxed()
    }

    /// The rows of `batch` to claim for their next stage in the finishing
    /// statement (every success with a next stage, unless shutting down),
    /// and the free slots of those stages reserved for them.
    fn chain_candidates(&self, batch: &[Finished]) -> (Chains, [Option<OwnedSemaphorePermit>; 3]) {
        let mut permits: [Option<OwnedSemaphorePermit>; 3] = [None, None, None];
        let mut chains = HashMap::new();
        if self.stopping.is_cancelled() || self.cached_prompts().is_none() {
            return (chains, permits);
        }
        for f in batch {
            if f.outcome() == Outcome::Succeeded
                && let Some(next) = f.next_stage()
            {
                chains.insert((f.id, f.lease_token), next);
            }
        }
        for next in [StageKind::Assemble, StageKind::Respond] {
            let wanted = chains.values().filter(|s| **s == next).count();
            let sem = self.slot(next).sem.clone();
            let n = wanted.min(sem.available_permits());
            if n > 0
                && let Ok(p) = sem.try_acquire_many_owned(u32::try_from(n).unwrap_or(u32::MAX))
            {
                permits[next.index()] = Some(p);
            }
        }
        (chains, permits)
    }

    /// Runs the rows the finishing statement claimed for their next stage:
    /// on a reserved slot while there are any, else on the slot of the stage
    /// they finished until one of their own frees.
    fn start_chained(
        self: &Arc<Self>,
        chained: Vec<(StageKind, Claimed, StageKind, OwnedSemaphorePermit)>,
        permits: &mut [Option<OwnedSemaphorePermit>; 3],
    ) {
        let Some(prompts) = self.cached_prompts() else {
            return;
        };
        for (stage, row, from, previous) in chained {
            let slot = match permits[stage.index()].as_mut().and_then(|p| p.split(1)) {
                Some(permit) => {
                    drop(previous);
                    Slot::Ready(permit)
                }
                None => Slot::After { previous, from },
            };
            self.start(stage, row, prompts.clone(), slot);
        }
    }

    fn wake_later(self: &Arc<Self>, stage: StageKind, delay: Duration) {
        let weak: Weak<Engine> = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(engine) = weak.upgrade() {
                engine.wake(stage);
            }
        });
    }
}

/// Sanitises a result before it is written ([`sanitise_result`]),
/// counting what was found; a result that cannot be stored becomes a
/// failure of its request with the reason.
fn sanitise(f: &mut Finished) {
    let found = sanitise_result(f);
    for p in &found.found {
        crate::metrics::poison(p.as_str());
    }
    if !found.found.is_empty() {
        tracing::warn!(request.id = %f.id, stage = %f.stage, attempt = f.attempt,
            found = ?found.found.iter().map(|p| p.as_str()).collect::<Vec<_>>(),
            "a stage result carried bad values");
    }
    if let Some(reason) = found.refused {
        fail_unstorable(
            f,
            "unstorable_reply",
            format!("the {} stage's reply cannot be stored: {reason}", f.stage),
        );
    }
}

/// Sanitises every text and JSON value of a stage result with the bounds
/// of [`crate::sanitize`]; an analysis still over [`MAX_ANALYSIS_BYTES`]
/// serialised, or not a JSON object, is refused ([`Sanitised::refused`]).
/// The result is otherwise unchanged (its values are cleaned in place, its
/// outcome kept); when it is refused the caller must not write its outputs.
pub fn sanitise_result(f: &mut Finished) -> Sanitised {
    let mut out = Sanitised::default();
    if let Some(model) = f.usage.model.as_mut() {
        sanitize::text(model, MAX_MODEL_CHARS, &mut out);
    }
    match &mut f.ended {
        Ended::Unsuccessful(u) => {
            sanitize::text(&mut u.error_class, MAX_ERROR_CHARS, &mut out);
            sanitize::text(&mut u.error_message, MAX_ERROR_CHARS, &mut out);
        }
        Ended::Succeeded(Output::Answer(answer) | Output::AnswerToReview(answer)) => {
            sanitize::text(answer, MAX_ANSWER_CHARS, &mut out);
        }
        Ended::Succeeded(Output::Context { context, sources }) => {
            sanitize::text(context, MAX_CONTEXT_CHARS, &mut out);
            if let Some(v) = sources.as_mut() {
                sanitize::json(v, &mut out);
            }
        }
        Ended::Succeeded(Output::Analysis { analysis, fused }) => {
            if let Some(fused) = fused.as_mut() {
                sanitize::text(&mut fused.context, MAX_CONTEXT_CHARS, &mut out);
                if let Some(v) = fused.context_sources.as_mut() {
                    sanitize::json(v, &mut out);
                }
            }
            sanitise_analysis(analysis, &mut out);
        }
    }
    out
}

/// Sanitises an analysis, and refuses one that cannot be stored.
fn sanitise_analysis(v: &mut serde_json::Value, out: &mut Sanitised) {
    sanitize::json(v, out);
    let size = serde_json::to_vec(v).map_or(usize::MAX, |b| b.len());
    if size > MAX_ANALYSIS_BYTES {
        out.note(Poison::Refused);
        out.refused = Some(format!(
            "the analysis is {size} bytes as JSON, more than the {MAX_ANALYSIS_BYTES} that are stored"
        ));
    } else if !v.is_object() {
        out.note(Poison::Refused);
        out.refused = Some("the analysis is not a JSON object".to_owned());
    }
}

/// Turns `f` into a permanent failure of its request with `reason`, its
/// outputs dropped.
fn fail_unstorable(f: &mut Finished, class: &str, reason: String) {
    let mut message = reason;
    let mut ignored = Sanitised::default();
    sanitize::text(&mut message, MAX_ERROR_CHARS, &mut ignored);
    f.fail_instead(Unsuccessful {
        outcome: Outcome::Failed,
        new_status: Status::Failed,
        delay: Duration::ZERO,
        error_class: class.to_owned(),
        error_message: message,
    });
}
