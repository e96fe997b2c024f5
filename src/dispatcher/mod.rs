//! The engine of `maasd`: wake or sweep → claim → run stage → record.
//!
//! Guarantees of the engine as a whole (each file states its own part):
//! - A row is worked on only under a lease this process holds; every write
//!   of a result is fenced on that lease's token (`complete.rs`).
//! - Per-stage concurrency bounds all outstanding work of a stage, unwritten
//!   results included (`lease.rs`: a row holds its stage slot until its
//!   result is written).
//! - A due row is claimed within one sweep interval even if every
//!   notification was lost (`sweep.rs`); a notification is only a doorbell.
//! - Retries are durable: the row waits in its ready status until
//!   `run_after`; the in-memory timer that wakes us then is only a doorbell.
//!   What an attempt's outcome does to its request is one pure function,
//!   [`policy::decide`].
//! - Shutdown stops claiming, lets running stages finish within the grace
//!   period, releases the leases of those that did not (without spending
//!   their attempt) and writes every result before [`Engine::run`] returns.
//!
//! Files: `claim.rs` (dispatch loops, claiming, the prompt cache),
//! `execute.rs` (one attempt under timeout and panic guard, its record),
//! `retrieve.rs` (the memory an assemble stage packs),
//! `policy.rs` (the attempt policy), `complete.rs` (group commit and
//! chaining), `lease.rs` (the in-flight map and the heartbeat), `sweep.rs`
//! (the catch-up sweep, a [`crate::service::Service`]), `publish.rs` (a
//! streamed answer's pieces to `answer_deltas`).

mod claim;
mod complete;
mod contention;
mod execute;
mod lease;
mod liveness;
pub mod policy;
pub mod publish;
mod retrieve;
pub mod sweep;
mod tenant_tokens;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::config::Config;
use crate::db::Pool;
use crate::listener::{Event, ListenerHandler, Notifier};
use crate::llm::embed::Embedder;
use crate::model::{Prompts, StageKind};
use crate::repo::Finished;
use crate::stage::Pipeline;

pub use crate::metrics::Stats;
pub use complete::sanitise_result;
pub use policy::{ClaimFacts, Decision, Policy, StageOutcome, decide};
pub use sweep::Sweep;

use lease::InFlight;

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

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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

/// The orchestrator core of one `maasd` process.
pub struct Engine {
    pool: Pool,
    cfg: Arc<Config>,
    policy: Policy,
    worker: Arc<str>,
    pipeline: Arc<dyn Pipeline>,
    slots: [StageSlot; 3],
    inflight: Mutex<HashMap<Uuid, InFlight>>,
    /// Respond stages started right after a fused assemble, kept (since
    /// when) for the respond stage of their request (`execute.rs`).
    early: Mutex<HashMap<Uuid, (Instant, execute::EarlyRespond)>>,
    results: mpsc::UnboundedSender<Finished>,
    results_rx: Mutex<Option<mpsc::UnboundedReceiver<Finished>>>,
    /// Cancels running stages (end of the grace period).
    hard_stop: CancellationToken,
    /// Set when shutdown starts: no more claims, chained ones included.
    stopping: CancellationToken,
    tasks: TaskTracker,
    sweep_now: Notify,
    prompts: Mutex<Option<(Instant, Arc<Prompts>)>>,
    notifier: Arc<Notifier>,
    pub stats: Arc<Stats>,
    /// Progress of the claim loops and the sweep, for the watchdog.
    liveness: liveness::Liveness,
    /// Tenant names for the per-tenant token metric.
    tenant_names: Arc<tenant_tokens::Names>,
    /// Embeds a request's query for the semantic part of its memory
    /// search, when `[llm.embedding]` is on.
    embedder: Option<Embedder>,
}

impl Engine {
    /// An engine that follows `notifier` (which its [`run`](Engine::run)
    /// feeds from the LISTEN session) and counts into the notifier's stats;
    /// with `embedder` (`[llm.embedding]` on), the memory search of each
    /// request has its semantic part.
    pub fn new(
        pool: Pool,
        cfg: Arc<Config>,
        pipeline: Arc<dyn Pipeline>,
        worker: String,
        notifier: Arc<Notifier>,
        embedder: Option<Embedder>,
    ) -> Arc<Engine> {
        let (results, results_rx) = mpsc::unbounded_channel();
        crate::metrics::register_poison(crate::sanitize::Poison::ALL.map(|p| p.as_str()));
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
        Arc::new(Engine {
            pool,
            policy: Policy::from_config(&cfg),
            cfg,
            worker: worker.into(),
            pipeline,
            slots,
            inflight: Mutex::new(HashMap::new()),
            early: Mutex::new(HashMap::new()),
            results,
            results_rx: Mutex::new(Some(results_rx)),
            hard_stop: CancellationToken::new(),
            stopping: CancellationToken::new(),
            tasks: TaskTracker::new(),
            sweep_now: Notify::new(),
            prompts: Mutex::new(None),
            stats: notifier.stats().clone(),
            notifier,
            liveness: liveness::Liveness::new(),
            tenant_names: tenant_tokens::Names::new(),
            embedder,
        })
    }

    pub fn worker(&self) -> &str {
        &self.worker
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The LISTEN session's broadcast and health.
    pub fn notifier(&self) -> &Arc<Notifier> {
        &self.notifier
    }

    /// Every valid notification, for live subscribers.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.notifier.subscribe()
    }

    /// True while the LISTEN session is up.
    pub fn is_listening(&self) -> bool {
        self.notifier.is_listening()
    }

    /// How long since the listener loop last showed progress.
    pub fn listener_silence(&self) -> Duration {
        self.notifier.silence()
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
    /// result, and returns. The LISTEN session runs inside; the periodic
    /// sweep is a service of its own ([`Sweep`]).
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
            self.notifier.clone(),
            self.clone() as Arc<dyn ListenerHandler>,
            shutdown.clone(),
        ));
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
}

impl ListenerHandler for Engine {
    fn connected(&self, _reconnect: bool) {
        // LISTEN is in place: now look.
        self.sweep_now.notify_one();
    }

    fn disconnected(&self, reason: &str) {
        tracing::warn!(reason, "listener disconnected; relying on the sweep until it is back");
    }

    fn event(&self, event: &Event) {
        // A status passed inside the statement that moved the row on (its
        // result was written, maybe the whole request): nothing to claim.
        // Woken for it, every idle stage would run an empty claim after
        // each fused request, beside the next request's pickup.
        // A row this process still holds: its result was just written
        // unchained, and the completer wakes that stage itself.
        let ours = || self.inflight.lock().is_ok_and(|map| map.contains_key(&event.id));
        if let Some(stage) = event.status.dispatches()
            && !event.passed
            && !ours()
        {
            self.wake(stage);
        }
    }
}
