//! Admission: when a call may be sent.
//!
//! Three limits stand between [`Llm::chat`](super::Llm::chat) and the wire:
//!
//! 1. **Cooling**, one per provider endpoint (the configuration gives each
//!    provider one base URL and one key: one account's rate limits), shared
//!    by every role that uses it. Each 429 pushes the endpoint's "cooling
//!    until" instant to at least now + the provider's `Retry-After` (or
//!    [`DEFAULT_COOLING`] when it gave none, capped at [`MAX_COOLING`]). A
//!    provider that is rate limiting thus slows every call this daemon makes
//!    to it, not just the one that got the 429.
//! 2. **Concurrency**: a semaphore per role (`max_concurrency`).
//! 3. **Requests per minute**: a governor GCRA limiter per role
//!    (`requests_per_minute`), bursting up to the per-minute figure.
//!
//! Every wait is bounded by one *admission deadline*, the role timeout from
//! the start of the call, so no caller is held for long. A cool-down or rpm
//! wait that would end after the deadline is not started: the call returns
//! [`LlmError::Throttled`] at once, unsent, with the remaining wait as
//! `retry_after`. A concurrency slot is waited for until the deadline, then
//! the call returns `Throttled` without a hint. Either way the caller
//! defers the request durably (a `run_after` column) instead of holding a
//! task, a lease and a dispatcher slot, and no attempt is counted. Short
//! waits — a cool-down of a few seconds, a slot that frees up — are cheaper
//! in place than a round trip through the database.
//!
//! An **outage** cools an endpoint too. The first connection that fails
//! (refused, reset, no route) counts a try of its request, as the
//! error table says, and pauses every call to the endpoint for
//! [`OUTAGE_FIRST_PAUSE`]. Connections that fail after that, while the
//! endpoint is known to be down, are the outage's and not their requests':
//! they return [`LlmError::Outage`], which defers the request without
//! counting a try, and each round of them doubles the pause (up to
//! [`OUTAGE_MAX_PAUSE`]). Any HTTP answer ends the outage. So a provider
//! that is down for a minute delays requests by a minute instead of failing
//! every one that reached it; one that stays down past
//! [`OUTAGE_PATIENCE`] fails them again, each after its tries, so a wrong
//! base URL is not waited on forever.
//!
//! Why [`DEFAULT_COOLING`] is 5 s and not the 60 s the caller waits for a
//! 429 without a hint: the shared cool-down only has to stop a burst from
//! hammering a provider that has just said no; one unexplained 429 should
//! not stall every role for a minute. The request that got the 429 still
//! waits the caller's full default.

use std::sync::Mutex;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::LlmError;
use super::config::RoleSettings;

/// Cool-down after a 429 that carried no `Retry-After` and no Gemini
/// `RetryInfo`.
pub const DEFAULT_COOLING: Duration = Duration::from_secs(5);

/// The longest cool-down a provider's hint can impose on this daemon.
pub const MAX_COOLING: Duration = Duration::from_secs(600);

/// The pause after the first failed connection of an outage.
pub const OUTAGE_FIRST_PAUSE: Duration = Duration::from_millis(500);

/// The longest pause between two rounds of connections during an outage.
pub const OUTAGE_MAX_PAUSE: Duration = Duration::from_secs(10);

/// How long an outage defers requests without counting their tries.
pub const OUTAGE_PATIENCE: Duration = Duration::from_secs(600);

/// The shared cool-down of one provider endpoint.
#[derive(Debug, Default)]
pub(crate) struct Cooling {
    state: Mutex<CoolingState>,
}

#[derive(Debug, Default)]
struct CoolingState {
    /// Every call waits until then.
    until: Option<Instant>,
    /// What set `until` last.
    why: Why,
    outage: Option<Outage>,
}

/// Why an endpoint cools down.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Why {
    #[default]
    RateLimited,
    Unreachable,
}

impl Why {
    fn as_str(self) -> &'static str {
        match self {
            Why::RateLimited => "after a 429 from this provider",
            Why::Unreachable => "while this provider is unreachable",
        }
    }
}

/// An endpoint that could not be reached, since its first failed connection.
#[derive(Debug, Clone, Copy)]
struct Outage {
    since: Instant,
    /// The current pause and when it was set: a connection sent before
    /// then belongs to the round that set it.
    pause: Duration,
    paused_at: Instant,
}

/// What a failed connection means, from [`Cooling::unreachable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unreachable {
    /// It is the first failure of an outage (the endpoint was thought up).
    pub first: bool,
    /// Since the outage's first failure.
    pub down_for: Duration,
    /// Until calls to the endpoint are sent again.
    pub pause: Duration,
}

impl Cooling {
    fn lock(&self) -> std::sync::MutexGuard<'_, CoolingState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every later call waits until `until` (never shortening a cool-down
    /// already in force).
    fn hold_until(state: &mut CoolingState, until: Instant, why: Why) {
        if state.until.is_none_or(|u| u < until) {
            state.until = Some(until);
            state.why = why;
        }
    }

    /// Records a 429: every later call waits until `now + retry_after`
    /// (never shortening a cool-down already in force). Returns the
    /// cool-down applied.
    pub(crate) fn rate_limited(&self, retry_after: Option<Duration>) -> Duration {
        let pause = retry_after.unwrap_or(DEFAULT_COOLING).min(MAX_COOLING);
        Self::hold_until(&mut self.lock(), Instant::now() + pause, Why::RateLimited);
        pause
    }

    /// Records a connection to the endpoint that failed, for a call sent at
    /// `sent`. The first failure starts an outage; a failure of a call sent
    /// after the outage's last pause was set starts a new round, with twice
    /// the pause.
    pub(crate) fn unreachable(&self, sent: Instant) -> Unreachable {
        let now = Instant::now();
        let mut state = self.lock();
        let (outage, first) = match state.outage {
            None => (
                Outage {
                    since: now,
                    pause: OUTAGE_FIRST_PAUSE,
                    paused_at: now,
                },
                true,
            ),
            Some(o) if sent < o.paused_at => (o, false),
            Some(o) => (
                Outage {
                    pause: o.pause.saturating_mul(2).min(OUTAGE_MAX_PAUSE),
                    paused_at: now,
                    ..o
                },
                false,
            ),
        };
        state.outage = Some(outage);
        Self::hold_until(&mut state, outage.paused_at + outage.pause, Why::Unreachable);
        Unreachable {
            first,
            down_for: now.saturating_duration_since(outage.since),
            pause: state.until.map_or(Duration::ZERO, |u| u.saturating_duration_since(now)),
        }
    }

    /// Records an HTTP answer from the endpoint: any outage is over.
    pub(crate) fn reachable(&self) {
        let mut state = self.lock();
        if state.outage.take().is_some() && state.why == Why::Unreachable {
            state.until = None;
        }
    }

    /// The instant cooling ends, if it is still in force.
    #[cfg(test)]
    pub(crate) fn until(&self) -> Option<Instant> {
        self.lock().until.filter(|u| *u > Instant::now())
    }

    /// Waits out the cool-down if it ends by `deadline`, else refuses.
    async fn wait(&self, provider: &'static str, deadline: Instant) -> Result<(), LlmError> {
        loop {
            let (until, why) = {
                let state = self.lock();
                (state.until.filter(|u| *u > Instant::now()), state.why)
            };
            let Some(until) = until else { return Ok(()) };
            if until > deadline {
                return Err(LlmError::Throttled {
                    provider,
                    retry_after: Some(until.saturating_duration_since(Instant::now())),
                    message: format!("cooling down {}; request not sent", why.as_str()),
                });
            }
            tokio::time::sleep_until(until).await;
        }
    }
}

/// The limits of one role.
pub(crate) struct RoleLimits {
    semaphore: Semaphore,
    rpm: Option<DefaultDirectRateLimiter>,
    clock: DefaultClock,
}

impl std::fmt::Debug for RoleLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoleLimits")
            .field("available_permits", &self.semaphore.available_permits())
            .field("rpm", &self.rpm.is_some())
            .finish()
    }
}

impl RoleLimits {
    pub(crate) fn new(settings: &RoleSettings) -> RoleLimits {
        let permits = usize::try_from(settings.max_concurrency)
            .unwrap_or(Semaphore::MAX_PERMITS)
            .min(Semaphore::MAX_PERMITS);
        RoleLimits {
            semaphore: Semaphore::new(permits),
            rpm: settings
                .requests_per_minute
                .map(|n| DefaultDirectRateLimiter::direct(Quota::per_minute(n))),
            clock: DefaultClock::default(),
        }
    }

    /// Waits for the endpoint's cool-down, a concurrency slot and the rpm
    /// budget, in that order, all before `deadline`. The permit is held for
    /// the duration of the call.
    pub(crate) async fn admit<'a>(
        &'a self,
        provider: &'static str,
        cooling: &Cooling,
        deadline: Instant,
    ) -> Result<SemaphorePermit<'a>, LlmError> {
        // Refuse early, before queueing for a slot.
        cooling.wait(provider, deadline).await?;

        let permit = match tokio::time::timeout_at(deadline, self.semaphore.acquire()).await {
            Ok(Ok(permit)) => permit,
            // The semaphore is never closed; treat it like a full one.
            Ok(Err(_)) | Err(_) => {
                return Err(LlmError::Throttled {
                    provider,
                    retry_after: None,
                    message: "every max_concurrency slot of this role stayed busy for the \
                              whole role timeout; request not sent"
                        .to_owned(),
                });
            }
        };

        if let Some(rpm) = &self.rpm {
            loop {
                match rpm.check() {
                    Ok(()) => break,
                    Err(not_until) => {
                        let wait = not_until.wait_time_from(self.clock.now());
                        let ready = Instant::now() + wait;
                        if ready > deadline {
                            return Err(LlmError::Throttled {
                                provider,
                                retry_after: Some(wait),
                                message: "requests_per_minute of this role used up; \
                                          request not sent"
                                    .to_owned(),
                            });
                        }
                        tokio::time::sleep_until(ready).await;
                    }
                }
            }
        }

        // A 429 may have arrived while this call queued.
        cooling.wait(provider, deadline).await?;
        Ok(permit)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;

    #[tokio::test]
    async fn cooling_never_shortens_and_is_capped() {
        let cooling = Cooling::default();
        assert!(cooling.until().is_none());
        assert_eq!(cooling.rate_limited(None), DEFAULT_COOLING);
        let first = cooling.until().unwrap();
        assert_eq!(
            cooling.rate_limited(Some(Duration::from_secs(1))),
            Duration::from_secs(1)
        );
        assert_eq!(cooling.until(), Some(first));
        assert_eq!(cooling.rate_limited(Some(Duration::from_secs(86_400))), MAX_COOLING);
        assert!(cooling.until().unwrap() > first);
    }

    #[tokio::test]
    async fn an_outage_escalates_once_per_round_and_ends_with_an_answer() {
        let cooling = Cooling::default();
        let sent = Instant::now();
        let first = cooling.unreachable(sent);
        assert!(first.first);
        assert_eq!(first.pause, OUTAGE_FIRST_PAUSE);
        // Calls sent before the pause was set fail in the same round.
        let same = cooling.unreachable(sent);
        assert!(!same.first);
        assert!(same.pause <= OUTAGE_FIRST_PAUSE);
        // A call sent after it (a probe) starts the next round.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let probe = cooling.unreachable(Instant::now());
        assert!(!probe.first);
        assert!(probe.pause > OUTAGE_FIRST_PAUSE && probe.pause <= OUTAGE_FIRST_PAUSE * 2);
        assert!(probe.down_for >= Duration::from_millis(5));
        let mut pause = probe.pause;
        for _ in 0..10 {
            pause = cooling.unreachable(Instant::now() + Duration::from_secs(1)).pause;
        }
        assert!(pause <= OUTAGE_MAX_PAUSE && pause > OUTAGE_MAX_PAUSE / 2, "{pause:?}");
        let err = cooling
            .wait("openai", Instant::now() + Duration::from_millis(10))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("unreachable"), "{err}");
        // An answer ends the outage and its pause; the next failure is a
        // first again.
        cooling.reachable();
        assert!(cooling.until().is_none());
        assert!(cooling.unreachable(Instant::now()).first);
    }

    #[tokio::test]
    async fn an_answer_does_not_lift_a_rate_limit() {
        let cooling = Cooling::default();
        cooling.unreachable(Instant::now());
        cooling.rate_limited(Some(Duration::from_secs(60)));
        cooling.reachable();
        assert!(cooling.until().is_some(), "the 429's cool-down was lifted");
    }

    #[tokio::test]
    async fn cooling_past_the_deadline_refuses_at_once() {
        let cooling = Cooling::default();
        cooling.rate_limited(Some(Duration::from_secs(120)));
        let err = cooling
            .wait("openai", Instant::now() + Duration::from_secs(1))
            .await
            .unwrap_err();
        let wait = err.retry_after().unwrap();
        assert!(wait > Duration::from_secs(100) && wait <= Duration::from_secs(120));
    }
}
