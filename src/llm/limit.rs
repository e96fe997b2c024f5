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

/// The shared "cooling until" instant of one provider endpoint.
#[derive(Debug, Default)]
pub(crate) struct Cooling {
    until: Mutex<Option<Instant>>,
}

impl Cooling {
    /// Records a 429: every later call waits until `now + retry_after`
    /// (never shortening a cool-down already in force). Returns the
    /// cool-down applied.
    pub(crate) fn rate_limited(&self, retry_after: Option<Duration>) -> Duration {
        let pause = retry_after.unwrap_or(DEFAULT_COOLING).min(MAX_COOLING);
        let candidate = Instant::now() + pause;
        let mut until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        if until.is_none_or(|u| u < candidate) {
            *until = Some(candidate);
        }
        pause
    }

    /// The instant cooling ends, if it is still in force.
    pub(crate) fn until(&self) -> Option<Instant> {
        let until = *self.until.lock().unwrap_or_else(|p| p.into_inner());
        until.filter(|u| *u > Instant::now())
    }

    /// Waits out the cool-down if it ends by `deadline`, else refuses.
    async fn wait(&self, provider: &'static str, deadline: Instant) -> Result<(), LlmError> {
        while let Some(until) = self.until() {
            if until > deadline {
                return Err(LlmError::Throttled {
                    provider,
                    retry_after: Some(until.saturating_duration_since(Instant::now())),
                    message: "cooling down after a 429 from this provider; request not sent".to_owned(),
                });
            }
            tokio::time::sleep_until(until).await;
        }
        Ok(())
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
