//! Whether the engine makes progress, for the systemd watchdog.
//!
//! Guarantees: [`Engine::stall`] names a stall when
//! - a claim (pool wait and statement) of a stage has run longer than
//!   `engine_stall_secs`;
//! - a stage's dispatcher has not answered a wake of the sweep within that
//!   time (its loop is stuck elsewhere, or gone);
//! - the sweep has not finished a pass (successful or failed) within its
//!   interval plus that time.
//!
//! Otherwise the engine is progressing or idle with nothing due (a sweep
//! woke every dispatcher, each looked and found nothing or claimed), and
//! `None` is returned. A failing claim (database away) is not a stall: the
//! loop answers and backs off, and restarting would not help.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::Engine;
use crate::model::StageKind;

/// Milliseconds since `origin`; 0 means "not set".
#[derive(Debug)]
pub(super) struct Liveness {
    origin: Instant,
    /// When a claim of each stage began (0: none running).
    claim_since: [AtomicU64; 3],
    /// When each dispatcher last began a pass after a wake.
    pass_at: [AtomicU64; 3],
    /// When the sweep last woke the dispatchers.
    swept_at: AtomicU64,
    /// When the sweep last finished a pass.
    sweep_done_at: AtomicU64,
}

impl Liveness {
    pub(super) fn new() -> Liveness {
        Liveness {
            origin: Instant::now(),
            claim_since: Default::default(),
            pass_at: Default::default(),
            swept_at: AtomicU64::new(0),
            sweep_done_at: AtomicU64::new(0),
        }
    }

    /// Now, in milliseconds since the origin, at least 1.
    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    pub(super) fn claim_started(&self, stage: StageKind) {
        self.claim_since[stage.index()].store(self.now(), Ordering::Relaxed);
    }

    pub(super) fn claim_ended(&self, stage: StageKind) {
        self.claim_since[stage.index()].store(0, Ordering::Relaxed);
    }

    pub(super) fn pass(&self, stage: StageKind) {
        self.pass_at[stage.index()].store(self.now(), Ordering::Relaxed);
    }

    pub(super) fn swept(&self) {
        let now = self.now();
        self.sweep_done_at.store(now, Ordering::Relaxed);
        self.swept_at.store(now, Ordering::Relaxed);
    }

    pub(super) fn sweep_failed(&self) {
        self.sweep_done_at.store(self.now(), Ordering::Relaxed);
    }

    /// The stall, if any (see the module docs).
    fn stall(&self, limit: Duration, sweep_every: Duration) -> Option<String> {
        let now = self.now();
        let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        for stage in StageKind::ALL {
            let since = self.claim_since[stage.index()].load(Ordering::Relaxed);
            if since != 0 && now.saturating_sub(since) > limit_ms {
                return Some(format!(
                    "the {stage} claim has run for {} ms",
                    now.saturating_sub(since)
                ));
            }
            let swept = self.swept_at.load(Ordering::Relaxed);
            let pass = self.pass_at[stage.index()].load(Ordering::Relaxed);
            if swept != 0 && pass < swept && now.saturating_sub(swept) > limit_ms {
                return Some(format!(
                    "the {stage} dispatcher has not answered the sweep's wake of {} ms ago",
                    now.saturating_sub(swept)
                ));
            }
        }
        // The first pass comes one interval after the start.
        let done = self.sweep_done_at.load(Ordering::Relaxed);
        let every_ms = u64::try_from(sweep_every.mul_f64(1.1).as_millis()).unwrap_or(u64::MAX);
        if now.saturating_sub(done) > every_ms.saturating_add(limit_ms) {
            return Some(format!(
                "the sweep has not finished a pass for {} ms",
                now.saturating_sub(done)
            ));
        }
        None
    }
}

impl Engine {
    /// Why the engine counts as wedged now, or `None` while it progresses or
    /// is idle with nothing due (see the module docs).
    pub fn stall(&self) -> Option<String> {
        self.liveness.stall(self.cfg.engine_stall(), self.cfg.sweep_interval())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_running_too_long_and_an_unanswered_wake_are_stalls() {
        let l = Liveness::new();
        let limit = Duration::from_millis(50);
        let every = Duration::from_secs(3600);
        assert_eq!(l.stall(limit, every), None);
        l.claim_started(StageKind::Respond);
        std::thread::sleep(Duration::from_millis(80));
        assert!(l.stall(limit, every).is_some_and(|s| s.contains("respond claim")));
        l.claim_ended(StageKind::Respond);
        l.swept();
        for stage in [StageKind::Analyze, StageKind::Assemble] {
            l.pass(stage);
        }
        assert_eq!(l.stall(limit, every), None, "a fresh wake is not yet a stall");
        std::thread::sleep(Duration::from_millis(80));
        assert!(l.stall(limit, every).is_some_and(|s| s.contains("respond dispatcher")));
        l.pass(StageKind::Respond);
        assert_eq!(l.stall(limit, every), None);
        // A sweep that stops finishing passes.
        assert!(
            l.stall(limit, Duration::from_millis(10))
                .is_some_and(|s| s.contains("sweep"))
        );
    }
}
