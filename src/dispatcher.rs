//! The engine of `maasd`: wake or sweep → claim → run stage → record.
//!
//! - One dispatcher loop per stage. A wake (notification, a freed slot, a
//!   finished previous stage, the sweep) makes it claim as many due rows as
//!   it has free slots, in batches, with `FOR UPDATE SKIP LOCKED`. Wakes
//!   coalesce; a notification that finds no free slot is not lost, because
//!   the row stays due and the next freed slot claims it.
//! - Each claimed row runs as its own task under a per-stage semaphore.
//!   Results go to the completer, which writes them in batches, fenced on the
//!   lease token, together with the step history (group commit: one
//!   statement per batch, whatever the mix of stages and outcomes).
//! - A heartbeat renews every lease this process holds in one statement;
//!   a lease found lost cancels its stage.
//! - The sweep takes back expired leases and wakes every dispatcher, so a
//!   due row is worked on within one sweep interval even if every
//!   notification was lost.
//! - Retries are durable: the row waits in its ready status until
//!   `run_after`; the in-memory timer that wakes us then is only a doorbell.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use futures_util::FutureExt;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use uuid::Uuid;

use crate::config::Config;
use crate::db::Pool;
use crate::error::Disposition;
use crate::listener::{Event, ListenerHandler, PayloadError};
use crate::model::{Outcome, Prompts, StageKind, Status};
use crate::repo::{self, Claimed, Finished};
use crate::stage::{Pipeline, StageError, StageInput, StageOutput, StageSuccess};

/// A claimed row counts as recovered by the sweep (no notification brought
/// it) when the sweep's wake claimed it after it had been due this long.
const MISSED_AFTER: Duration = Duration::from_secs(1);

/// Result batches written at once: one commits while the next executes.
/// More would only split the results into smaller batches (every statement
/// costs the database a fixed setup on top of its rows).
const WRITERS: usize = 2;

/// How long a busy stage waits for enough free slots to make a claim
/// worthwhile (see `dispatch_loop`).
const CLAIM_LINGER: Duration = Duration::from_millis(5);

/// Counters of one daemon, read by tests, logs and metrics.
#[derive(Debug, Default)]
pub struct Stats {
    pub claimed: [AtomicU64; 3],
    pub succeeded: [AtomicU64; 3],
    pub retried: AtomicU64,
    pub failed: AtomicU64,
    pub released: AtomicU64,
    pub lease_lost: AtomicU64,
    pub reclaimed: AtomicU64,
    pub sweep_recovered: AtomicU64,
    pub notifications: AtomicU64,
    pub junk_payloads: AtomicU64,
    pub listener_connects: AtomicU64,
    pub listener_reconnects: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

struct StageSlot {
    sem: Arc<Semaphore>,
    wake: Notify,
    /// Set by the sweep before it wakes the dispatcher.
    swept: AtomicBool,
    /// Set by every other wake (a notification, a finished stage).
    rung: AtomicBool,
    /// Set while the dispatcher waits for free slots (it found none, or too
    /// few to claim): only then does a freed slot wake it.
    starved: AtomicBool,
}

/// A row this process holds: running, or finished and waiting to be
/// written. Its stage slot is held until the result is written, so the
/// per-stage concurrency bounds all outstanding work, unwritten results
/// included (without that, a fast stage could run ahead of the writer).
struct InFlight {
    token: i64,
    cancel: CancellationToken,
    finished: bool,
    /// The stage slot this row holds (while a chained row waits, the slot
    /// of the stage it finished), and whose slot it is.
    slot: OwnedSemaphorePermit,
    slot_of: StageKind,
}

/// How a claimed row holds its stage slot.
enum Slot {
    /// A slot of its stage.
    Ready(OwnedSemaphorePermit),
    /// A chained row that found no free slot: the slot of the stage it
    /// finished, traded for one of its own when one frees.
    After {
        previous: OwnedSemaphorePermit,
        from: StageKind,
    },
}

/// The orchestrator core of one `maasd` process.
pub struct Engine {
    pool: Pool,
    cfg: Arc<Config>,
    worker: Arc<str>,
    pipeline: Arc<dyn Pipeline>,
    slots: [StageSlot; 3],
    inflight: Mutex<HashMap<Uuid, InFlight>>,
    results: mpsc::UnboundedSender<Finished>,
    results_rx: Mutex<Option<mpsc::UnboundedReceiver<Finished>>>,
    /// Cancels running stages (end of the grace period).
    hard_stop: CancellationToken,
    /// Set when shutdown starts: no more claims, chained ones included.
    stopping: CancellationToken,
    tasks: TaskTracker,
    sweep_now: Notify,
    listening: AtomicBool,
    prompts: Mutex<Option<(Instant, Arc<Prompts>)>>,
    /// The listener loop's last sign of life, in ms since `born`: the
    /// liveness check behind the systemd watchdog.
    born: Instant,
    alive_ms: AtomicU64,
    events: broadcast::Sender<Event>,
    pub stats: Stats,
}

impl Engine {
    pub fn new(pool: Pool, cfg: Arc<Config>, pipeline: Arc<dyn Pipeline>, worker: String) -> Arc<Engine> {
        let (results, results_rx) = mpsc::unbounded_channel();
        let slot = |stage| StageSlot {
            sem: Arc::new(Semaphore::new(cfg.concurrency.of(stage))),
            wake: Notify::new(),
            swept: AtomicBool::new(false),
            rung: AtomicBool::new(false),
            starved: AtomicBool::new(false),
        };
        let slots = [
            slot(StageKind::Analyze),
            slot(StageKind::Assemble),
            slot(StageKind::Respond),
        ];
        let (events, _) = broadcast::channel(4096);
        Arc::new(Engine {
            pool,
            cfg,
            worker: worker.into(),
            pipeline,
            slots,
            inflight: Mutex::new(HashMap::new()),
            results,
            results_rx: Mutex::new(Some(results_rx)),
            hard_stop: CancellationToken::new(),
            stopping: CancellationToken::new(),
            tasks: TaskTracker::new(),
            sweep_now: Notify::new(),
            listening: AtomicBool::new(false),
            prompts: Mutex::new(None),
            born: Instant::now(),
            alive_ms: AtomicU64::new(0),
            events,
            stats: Stats::default(),
        })
    }

    pub fn worker(&self) -> &str {
        &self.worker
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Every valid notification, for live subscribers.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// True while the LISTEN session is up.
    pub fn is_listening(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    /// How long since the listener loop last showed progress (a health
    /// query answered, a LISTEN set up, a reconnect attempted).
    pub fn listener_silence(&self) -> Duration {
        let last = Duration::from_millis(self.alive_ms.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(last)
    }

    fn mark_alive(&self) {
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.alive_ms.store(now, Ordering::Relaxed);
    }

    fn slot(&self, stage: StageKind) -> &StageSlot {
        &self.slots[stage.index()]
    }

    /// A row may have become due in `stage`.
    pub fn wake(&self, stage: StageKind) {
        let slot = self.slot(stage);
        slot.rung.store(true, Ordering::Relaxed);
        slot.wake.notify_one();
    }

    /// A slot of `stage` was freed: wakes its dispatcher if it waits for one.
    /// (The dispatcher marks itself starved before it looks at the free
    /// slots, and the slot is freed before this looks at the mark, so a
    /// freed slot and a starving dispatcher never miss each other.)
    fn freed(&self, stage: StageKind) {
        let slot = self.slot(stage);
        if slot.starved.load(Ordering::SeqCst) {
            slot.wake.notify_one();
        }
    }

    /// Runs the engine until `shutdown` fires, then stops claiming, lets
    /// running stages finish within the grace period, releases the leases of
    /// those that did not (without spending their attempt), writes every
    /// result, and returns.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let Some(results_rx) = self.results_rx.lock().ok().and_then(|mut g| g.take()) else {
            tracing::error!("engine: run called twice");
            return;
        };
        let completer_done = CancellationToken::new();
        let heartbeat_done = CancellationToken::new();
        let completer = tokio::spawn(self.clone().completer(results_rx, completer_done.clone()));
        let heartbeat = tokio::spawn(self.clone().heartbeat(heartbeat_done.clone()));
        let listener = tokio::spawn(crate::listener::run(
            self.cfg.clone(),
            self.clone() as Arc<dyn ListenerHandler>,
            shutdown.clone(),
        ));
        let sweep = tokio::spawn(self.clone().sweeper(shutdown.clone()));
        let dispatchers: Vec<_> = StageKind::ALL
            .into_iter()
            .map(|stage| tokio::spawn(self.clone().dispatch_loop(stage, shutdown.clone())))
            .collect();

        shutdown.cancelled().await;
        self.stopping.cancel();
        tracing::info!(
            grace_secs = self.cfg.grace_secs,
            "shutdown: no longer claiming; waiting for running stages"
        );
        for d in dispatchers {
            let _ = d.await;
        }
        let _ = listener.await;
        let _ = sweep.await;
        self.tasks.close();
        if tokio::time::timeout(self.cfg.grace(), self.tasks.wait()).await.is_err() {
            let left = self.tasks.len();
            tracing::warn!(
                stages = left,
                "shutdown: grace period over; releasing the remaining leases"
            );
            self.hard_stop.cancel();
            self.tasks.wait().await;
        }
        completer_done.cancel();
        let _ = completer.await;
        heartbeat_done.cancel();
        let _ = heartbeat.await;
        tracing::info!("shutdown: all results written");
    }

    async fn dispatch_loop(self: Arc<Self>, stage: StageKind, shutdown: CancellationToken) {
        let slot = self.slot(stage);
        let backoff_builder = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(5))
            .with_jitter()
            .without_max_times();
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
            loop {
                if shutdown.is_cancelled() {
                    return;
                }
                slot.starved.store(true, Ordering::SeqCst);
                if slot.sem.available_permits() == 0 {
                    break; // a freed slot wakes us
                }
                // A busy stage frees its slots one result at a time; claiming
                // each as it frees would make a statement per row. Linger a
                // moment for a worthwhile batch (an idle stage claims at once).
                let conc = self.cfg.concurrency.of(stage);
                let worthwhile = self.cfg.claim_batch.min(conc / 4).max(1);
                if slot.sem.available_permits() < worthwhile.min(conc) {
                    let until = tokio::time::Instant::now() + CLAIM_LINGER;
                    while slot.sem.available_permits() < worthwhile {
                        tokio::select! {
                            biased;
                            _ = shutdown.cancelled() => return,
                            _ = slot.wake.notified() => {}
                            _ = tokio::time::sleep_until(until) => break,
                        }
                    }
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
                // Prompts first: a row is only claimed when its stage can run.
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
                match claimed {
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

    /// Starts a claimed row: tracks it (so heartbeats renew its lease and
    /// its own notifications do not wake a dispatcher), then runs it.
    fn start(self: &Arc<Self>, stage: StageKind, row: Claimed, prompts: Arc<Prompts>, slot: Slot) {
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

    /// Runs one claimed row through its stage and hands the result to the
    /// completer.
    async fn execute(
        self: Arc<Self>,
        stage: StageKind,
        mut row: Claimed,
        prompts: Arc<Prompts>,
        cancel: CancellationToken,
        waiting_from: Option<StageKind>,
    ) {
        // A row chained without a free slot in this stage still holds the
        // slot of the stage it finished; it trades that for one of this
        // stage's as soon as one frees (the lease is renewed meanwhile).
        if let Some(from) = waiting_from {
            let acquired = tokio::select! {
                p = self.slot(stage).sem.clone().acquire_owned() => p.ok(),
                _ = cancel.cancelled() => None,
            };
            let Some(permit) = acquired else {
                if self.hard_stop.is_cancelled() {
                    let finished = self.record(stage, &row, Attempt::Released, Duration::ZERO);
                    self.hand_over(finished);
                } else {
                    self.forget(row.id, row.lease_token); // the heartbeat found the lease lost
                }
                return;
            };
            let previous = self.inflight.lock().ok().and_then(|mut map| {
                map.get_mut(&row.id).map(|f| {
                    f.slot_of = stage;
                    std::mem::replace(&mut f.slot, permit)
                })
            });
            drop(previous);
            self.freed(from);
        }
        let span = tracing::debug_span!("stage", request.id = %row.id, %stage, attempt = row.attempt);
        let input = StageInput {
            request_id: row.id,
            user_id: row.user_id,
            thread_id: row.thread_id,
            user_query: row.user_query.clone(),
            attempt: u32::try_from(row.attempt).unwrap_or(1),
            analysis: row.analysis.clone(),
            context: row.context.clone(),
            memory: std::mem::take(&mut row.memory),
            prompts,
        };
        let started = Instant::now();
        let result = async {
            tokio::select! {
                r = self.run_guarded(stage, &input) => Some(r),
                _ = cancel.cancelled() => None,
            }
        }
        .instrument(span.clone())
        .await;
        let latency = started.elapsed();
        let result = match result {
            None if self.hard_stop.is_cancelled() => Attempt::Released,
            None => {
                // The heartbeat found the lease lost; someone else owns the row.
                self.forget(row.id, row.lease_token);
                return;
            }
            Some(Err(e)) => Attempt::Failed(e),
            Some(Ok(ok)) => Attempt::Succeeded(ok),
        };
        let mut finished = self.record(stage, &row, result, latency);
        if stage == StageKind::Analyze && finished.outcome == Outcome::Succeeded && !row.debug {
            finished.fused = self
                .fuse(input, finished.analysis.clone())
                .instrument(span.clone())
                .await;
        }
        let _guard = span.enter();
        self.hand_over(finished);
    }

    /// Runs the assemble stage right after a successful analyze, when the
    /// pipeline says it can run on what the analyzer was given
    /// ([`Pipeline::fuse_assemble`]; the engine does not read the analysis).
    /// Its result is written with the analysis in one statement (one commit
    /// and one row version fewer per request). When it cannot run here, or
    /// fails, the assemble stage runs on its own as usual.
    async fn fuse(&self, input: StageInput, analysis: Option<serde_json::Value>) -> Option<repo::FusedAssemble> {
        let input = self.pipeline.fuse_assemble(input, analysis)?;
        let started = Instant::now();
        let out = self.run_guarded(StageKind::Assemble, &input).await;
        let latency_ms = i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX);
        match out {
            Ok(StageSuccess {
                output: StageOutput::Context(context),
                usage,
            }) => Some(repo::FusedAssemble {
                context,
                tokens: usage.prompt_tokens.and_then(|t| i32::try_from(t).ok()),
                latency_ms,
            }),
            _ => None,
        }
    }

    /// Runs one stage within the stage timeout; a timeout or a panic is a
    /// retryable stage error like any other.
    async fn run_guarded(&self, stage: StageKind, input: &StageInput) -> Result<StageSuccess, StageError> {
        let run = AssertUnwindSafe(self.pipeline.run(stage, input)).catch_unwind();
        match tokio::time::timeout(self.cfg.stage_timeout(), run).await {
            Err(_) => Err(StageError::retry(
                "stage_timeout",
                format!("{stage} did not finish within {} s", self.cfg.stage_timeout_secs),
            )),
            Ok(Err(panic)) => Err(StageError::retry("panic", panic_message(&panic))),
            Ok(Ok(result)) => result,
        }
    }

    /// Marks a row's stage finished and gives its result to the completer.
    fn hand_over(&self, finished: Finished) {
        let (id, token) = (finished.id, finished.lease_token);
        if let Ok(mut map) = self.inflight.lock()
            && let Some(f) = map.get_mut(&id)
            && f.token == token
        {
            f.finished = true;
        }
        if self.results.send(finished).is_err() {
            tracing::error!("completer is gone; the lease will expire and the sweep will retry");
            self.forget(id, token);
        }
    }

    fn record(&self, stage: StageKind, row: &Claimed, attempt: Attempt, latency: Duration) -> Finished {
        let mut f = Finished {
            id: row.id,
            lease_token: row.lease_token,
            stage,
            outcome: Outcome::Succeeded,
            new_status: stage.done_status(),
            attempt: row.attempt,
            started_at: row.claimed_at,
            analysis: None,
            context: None,
            answer: None,
            error_class: None,
            error_message: None,
            delay: Duration::ZERO,
            model: None,
            prompt_tokens: None,
            completion_tokens: None,
            latency_ms: Some(i32::try_from(latency.as_millis()).unwrap_or(i32::MAX)),
            fused: None,
        };
        let usage = match attempt {
            Attempt::Succeeded(StageSuccess { output, usage }) => {
                match (stage, output) {
                    (StageKind::Analyze, StageOutput::Analysis(v)) => f.analysis = Some(v),
                    (StageKind::Assemble, StageOutput::Context(c)) => f.context = Some(c),
                    (StageKind::Respond, StageOutput::Answer(a)) => f.answer = Some(a),
                    (_, other) => {
                        return self.record(
                            stage,
                            row,
                            Attempt::Failed(StageError::fail(
                                "internal",
                                format!("{stage} produced the wrong kind of output: {other:?}"),
                            )),
                            latency,
                        );
                    }
                }
                tracing::debug!(request.id = %row.id, %stage, attempt = row.attempt, "stage succeeded");
                usage
            }
            Attempt::Released => {
                f.outcome = Outcome::Released;
                f.new_status = stage.ready_status();
                f.error_class = Some("shutdown".into());
                f.error_message = Some("released at shutdown before the stage finished".into());
                bump(&self.stats.released);
                return f;
            }
            Attempt::Failed(e) => {
                let attempts = u32::try_from(row.attempt).unwrap_or(u32::MAX);
                f.error_class = Some(e.class.to_string());
                let limit = match e.disposition {
                    Disposition::Retry {
                        max_attempts: Some(m), ..
                    } => m.min(self.cfg.max_attempts),
                    _ => self.cfg.max_attempts,
                };
                match e.disposition {
                    Disposition::Defer { after } => {
                        f.outcome = Outcome::Deferred;
                        f.new_status = stage.ready_status();
                        f.delay = after;
                        f.error_message = Some(format!(
                            "{stage} deferred ({}): {}; trying again in {} ms without spending an attempt",
                            e.class,
                            e.message,
                            after.as_millis()
                        ));
                        tracing::info!(request.id = %row.id, %stage, class = %e.class, retry_in_ms = millis(after),
                            "stage deferred");
                    }
                    Disposition::Retry { after, .. } if attempts < limit => {
                        f.outcome = Outcome::Retrying;
                        f.new_status = stage.ready_status();
                        f.delay = after.unwrap_or_else(|| self.cfg.retry_delay(attempts));
                        f.error_message = Some(format!(
                            "{stage} attempt {attempts} of {limit} failed ({}): {}; retrying in {} ms",
                            e.class,
                            e.message,
                            f.delay.as_millis()
                        ));
                        tracing::warn!(request.id = %row.id, %stage, attempt = attempts, class = %e.class,
                            error = %e.message, retry_in_ms = millis(f.delay), "stage failed; will retry");
                    }
                    Disposition::Retry { .. } => {
                        f.outcome = Outcome::Failed;
                        f.new_status = Status::Failed;
                        f.error_message = Some(format!(
                            "{stage} failed after {attempts} attempts ({}): {}",
                            e.class, e.message
                        ));
                        tracing::warn!(request.id = %row.id, %stage, attempt = attempts, class = %e.class,
                            error = %e.message, "stage failed; attempts exhausted");
                    }
                    Disposition::Fail => {
                        f.outcome = Outcome::Failed;
                        f.new_status = Status::Failed;
                        f.error_message = Some(format!("{stage} failed ({}): {}", e.class, e.message));
                        tracing::warn!(request.id = %row.id, %stage, attempt = attempts, class = %e.class,
                            error = %e.message, "stage failed permanently");
                    }
                }
                e.usage
            }
        };
        f.model = usage.model;
        f.prompt_tokens = usage.prompt_tokens.and_then(|t| i32::try_from(t).ok());
        f.completion_tokens = usage.completion_tokens.and_then(|t| i32::try_from(t).ok());
        f
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

    /// Drops a row this process held under lease `token`, freeing its
    /// stage slot.
    fn forget(&self, id: Uuid, token: i64) {
        if let Some(f) = self.take(id, token) {
            let stage = f.slot_of;
            drop(f);
            self.freed(stage);
        }
    }

    /// Stops tracking a row held under lease `token` (not a newer claim of
    /// the same row); its stage slot is freed when the entry drops.
    fn take(&self, id: Uuid, token: i64) -> Option<InFlight> {
        self.inflight.lock().ok().and_then(|mut map| {
            if map.get(&id).is_some_and(|f| f.token == token) {
                map.remove(&id)
            } else {
                None
            }
        })
    }

    /// Writes results in batches until `done` fires and the queue is empty.
    async fn completer(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<Finished>, done: CancellationToken) {
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

    /// Writes one batch, retrying while the database is unreachable, for at
    /// most one lease period: past that the leases have expired, and the
    /// sweep (here or elsewhere) will retry the stages.
    async fn flush(self: Arc<Self>, mut batch: Vec<Finished>) {
        // Every multi-row writer locks rows in ascending id order, so two of
        // them (flushes, heartbeats) never deadlock.
        batch.sort_unstable_by_key(|f| f.id);
        let deadline = Instant::now() + self.cfg.lease();
        let mut backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(2))
            .with_jitter()
            .without_max_times()
            .build();
        // Chain: rows that finished a stage and have a free slot in their
        // next stage here are claimed for it by the finishing statement.
        let (mut chains, mut permits) = self.chain_candidates(&batch);
        let reserved = permits.each_ref().map(Option::is_some);
        // While rows may be chained, shutdown must wait for them to start.
        let _tracking = (!chains.is_empty()).then(|| self.tasks.token());
        let applied = loop {
            let res = match self.pool.get().await {
                Ok(client) => {
                    repo::finish_batch(
                        &client,
                        &self.worker,
                        &batch,
                        |f| chains.get(&f.id).copied(),
                        self.cfg.lease(),
                    )
                    .await
                }
                Err(e) => Err(e.into()),
            };
            match res {
                Ok(done) => break done,
                Err(e) if Instant::now() < deadline => {
                    // Retry without chaining: the simplest statement first.
                    chains.clear();
                    permits = [None, None, None];
                    let delay = backoff.next().unwrap_or(Duration::from_secs(1));
                    tracing::warn!(results = batch.len(), error = %e, retry_in_ms = millis(delay),
                        "could not write stage results; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(e) => {
                    tracing::error!(results = batch.len(), error = %e,
                        "could not write stage results within the lease; the sweep will retry these stages");
                    for f in &batch {
                        self.forget(f.id, f.lease_token);
                    }
                    return;
                }
            }
        };
        let now = chrono::Utc::now();
        let applied: HashMap<Uuid, repo::Applied> = applied.into_iter().map(|a| (a.id, a)).collect();
        let mut chained = Vec::new();
        // Stages where a slot was freed, and where a row became due.
        let mut freed = [false; 3];
        let mut woken = [false; 3];
        for f in &batch {
            let mut held = self.take(f.id, f.lease_token);
            if let Some(h) = &held {
                freed[h.slot_of.index()] = true;
            }
            let Some(done) = applied.get(&f.id) else {
                bump(&self.stats.lease_lost);
                tracing::warn!(request.id = %f.id, stage = %f.stage, attempt = f.attempt, outcome = f.outcome.as_str(),
                    "lease lost before the result was written; result discarded, the row is unchanged");
                continue;
            };
            crate::metrics::observe_result(f, done.created_at, now);
            let next = match (&f.fused, done.fused) {
                (Some(fused), true) => {
                    let assemble = StageKind::Assemble.index();
                    bump(&self.stats.claimed[assemble]);
                    bump(&self.stats.succeeded[assemble]);
                    crate::metrics::observe_stage(StageKind::Assemble, Outcome::Succeeded, fused.latency_ms);
                    StageKind::Assemble.next()
                }
                _ => f.stage.next(),
            };
            match f.outcome {
                Outcome::Succeeded => {
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
                Outcome::Retrying | Outcome::Deferred => {
                    bump(&self.stats.retried);
                    self.wake_later(f.stage, f.delay);
                }
                Outcome::Failed => bump(&self.stats.failed),
                Outcome::Released | Outcome::LeaseExpired => {}
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

    /// The rows of `batch` to claim for their next stage in the finishing
    /// statement (every success with a next stage, unless shutting down),
    /// and the free slots of those stages reserved for them.
    fn chain_candidates(&self, batch: &[Finished]) -> (HashMap<Uuid, StageKind>, [Option<OwnedSemaphorePermit>; 3]) {
        let mut permits: [Option<OwnedSemaphorePermit>; 3] = [None, None, None];
        let mut chains = HashMap::new();
        if self.stopping.is_cancelled() || self.cached_prompts().is_none() {
            return (chains, permits);
        }
        for f in batch {
            if f.outcome == Outcome::Succeeded
                && let Some(next) = f.next_stage()
            {
                chains.insert(f.id, next);
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

    fn cached_prompts(&self) -> Option<Arc<Prompts>> {
        self.prompts
            .lock()
            .ok()
            .and_then(|g| g.as_ref().map(|(_, p)| p.clone()))
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

    /// Renews every lease this process holds, every third of the lease.
    async fn heartbeat(self: Arc<Self>, done: CancellationToken) {
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
            match renewed {
                Ok(renewed) => {
                    if renewed.len() == held.len() {
                        continue;
                    }
                    let renewed: std::collections::HashSet<Uuid> = renewed.into_iter().collect();
                    if let Ok(map) = self.inflight.lock() {
                        for (id, token) in &held {
                            if renewed.contains(id) {
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
                Err(e) => tracing::warn!(leases = held.len(), error = %e, "heartbeat failed; leases not renewed"),
            }
        }
    }

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
                tracing::warn!(error = %e, "sweep failed");
            }
        }
    }

    /// One sweep: take back expired leases, then wake every dispatcher.
    pub async fn sweep_once(&self) -> Result<usize, crate::db::Error> {
        let client = self.pool.get().await?;
        let mut total = 0;
        loop {
            let batch = repo::reclaim_expired(&client, self.cfg.max_attempts, 500).await?;
            for r in &batch {
                tracing::warn!(request.id = %r.id, was = %r.was, now = %r.new_status, "sweep: lease expired; row taken back");
            }
            total += batch.len();
            self.stats.reclaimed.fetch_add(batch.len() as u64, Ordering::Relaxed);
            if batch.len() < 500 {
                break;
            }
        }
        drop(client);
        for stage in StageKind::ALL {
            let slot = self.slot(stage);
            slot.swept.store(true, Ordering::Relaxed);
            slot.wake.notify_one();
        }
        tracing::trace!(reclaimed = total, "sweep done");
        Ok(total)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

enum Attempt {
    Succeeded(StageSuccess),
    Failed(StageError),
    Released,
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let msg = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("the stage panicked: {msg}")
}

impl ListenerHandler for Engine {
    fn connected(&self, reconnect: bool) {
        self.mark_alive();
        self.listening.store(true, Ordering::Relaxed);
        bump(&self.stats.listener_connects);
        if reconnect {
            bump(&self.stats.listener_reconnects);
        }
        // LISTEN is in place: now look.
        self.sweep_now.notify_one();
    }

    fn alive(&self) {
        self.mark_alive();
    }

    fn disconnected(&self, reason: &str) {
        self.listening.store(false, Ordering::Relaxed);
        tracing::warn!(reason, "listener disconnected; relying on the sweep until it is back");
    }

    fn event(&self, event: Event) {
        bump(&self.stats.notifications);
        // A row this process holds was chained past that status: nothing
        // to claim (the notification only announces the status it passed).
        let ours = || self.inflight.lock().is_ok_and(|map| map.contains_key(&event.id));
        if let Some(stage) = event.status.dispatches()
            && !ours()
        {
            self.wake(stage);
        }
        let _ = self.events.send(event);
    }

    fn junk(&self, payload: &str, error: &PayloadError) {
        bump(&self.stats.junk_payloads);
        let shown: String = payload.chars().take(120).collect();
        tracing::warn!(payload = %shown, %error, "listener: skipped a notification that is not a pipeline event");
    }
}
