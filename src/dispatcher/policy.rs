//! The attempt policy: what the outcome of one attempt does to its request.
//!
//! - [`decide`] is pure: no I/O, no clock, no randomness. The jitter of a
//!   backoff is drawn by the caller and passed in [`ClaimFacts`], so the
//!   same inputs always give the same [`Decision`].
//! - A success moves the request to its stage's done status. A release (the
//!   grace period ended) returns it to the stage's ready status and spends
//!   no attempt.
//! - [`Disposition::Defer`] never spends an attempt, whatever the count.
//! - [`Disposition::Retry`] spends one: the request waits in its ready
//!   status for the failure's own delay (a rate limit's `Retry-After`) or
//!   else the exponential backoff from `retry_base_ms`, while its attempt
//!   is below the limit (`max_attempts`, or the failure's lower own limit);
//!   at the limit it is `FAILED`.
//! - [`Disposition::Fail`] makes it `FAILED` at once.
//!
//! How provider failures map to dispositions (timeouts, 429, outages,
//! invalid JSON, token limits) is the stages' and the LLM layer's knowledge
//! (`stage::from_llm`); the table test below walks every row of the error
//! policy (docs/configuration.md) through both steps' results.

use std::time::Duration;

use crate::config::Config;
use crate::error::Disposition;
use crate::model::{Outcome, StageKind, Status};

/// What the engine knows of the claim an attempt ran under.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClaimFacts {
    /// The 1-based attempt of this stage that just ran.
    pub attempt: u32,
    /// The backoff's jitter factor for this attempt, in [½, 1]
    /// ([`crate::backoff::jitter`]).
    pub jitter: f64,
}

/// The configured limits of the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Attempts of one stage before the request is `FAILED`.
    pub max_attempts: u32,
    /// The first retry's delay; doubled per attempt.
    pub retry_base: Duration,
    /// The longest retry delay.
    pub retry_max: Duration,
}

impl Policy {
    pub fn from_config(cfg: &Config) -> Policy {
        Policy {
            max_attempts: cfg.max_attempts,
            retry_base: Duration::from_millis(cfg.retry_base_ms),
            retry_max: Duration::from_secs(cfg.retry_max_secs),
        }
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageOutcome {
    Succeeded,
    Failed(Disposition),
    /// Stopped at the end of the grace period, before it finished.
    Released,
}

/// What happens to the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The stage is done: the request moves to `status`.
    Advance { status: Status },
    /// The attempt is spent; the request waits in `status` for `after`,
    /// then the stage runs again (attempt `limit` is the last).
    Retry {
        status: Status,
        after: Duration,
        limit: u32,
    },
    /// Nothing was spent; the request waits in `status` for `after`.
    Defer { status: Status, after: Duration },
    /// The request is `FAILED`: after `attempts` of `limit` attempts
    /// (`exhausted`), or at once (a permanent failure).
    Fail { exhausted: Option<u32> },
    /// The lease is given back; the request waits in `status`, its
    /// attempt unspent.
    Release { status: Status },
}

impl Decision {
    /// The outcome recorded in the step history.
    pub fn outcome(&self) -> Outcome {
        match self {
            Decision::Advance { .. } => Outcome::Succeeded,
            Decision::Retry { .. } => Outcome::Retrying,
            Decision::Defer { .. } => Outcome::Deferred,
            Decision::Fail { .. } => Outcome::Failed,
            Decision::Release { .. } => Outcome::Released,
        }
    }

    /// The request's status after the decision.
    pub fn status(&self) -> Status {
        match *self {
            Decision::Advance { status }
            | Decision::Retry { status, .. }
            | Decision::Defer { status, .. }
            | Decision::Release { status } => status,
            Decision::Fail { .. } => Status::Failed,
        }
    }

    /// How long the request waits before its stage runs again.
    pub fn delay(&self) -> Duration {
        match *self {
            Decision::Retry { after, .. } | Decision::Defer { after, .. } => after,
            _ => Duration::ZERO,
        }
    }
}

/// The attempt policy (see the module doc).
pub fn decide(stage: StageKind, claim: &ClaimFacts, outcome: &StageOutcome, policy: &Policy) -> Decision {
    let disposition = match *outcome {
        StageOutcome::Succeeded => {
            return Decision::Advance {
                status: stage.done_status(),
            };
        }
        StageOutcome::Released => {
            return Decision::Release {
                status: stage.ready_status(),
            };
        }
        StageOutcome::Failed(d) => d,
    };
    let limit = match disposition {
        Disposition::Retry {
            max_attempts: Some(m), ..
        } => m.min(policy.max_attempts),
        _ => policy.max_attempts,
    };
    match disposition {
        Disposition::Defer { after } => Decision::Defer {
            status: stage.ready_status(),
            after,
        },
        Disposition::Retry { after, .. } if claim.attempt < limit => Decision::Retry {
            status: stage.ready_status(),
            after: after.unwrap_or_else(|| {
                crate::backoff::exponential(policy.retry_base, policy.retry_max, claim.attempt, claim.jitter)
            }),
            limit,
        },
        Disposition::Retry { .. } => Decision::Fail { exhausted: Some(limit) },
        Disposition::Fail => Decision::Fail { exhausted: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::DEFAULT_RATE_LIMIT_WAIT;

    #[allow(non_snake_case)]
    fn MS(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[allow(non_snake_case)]
    fn SECS(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    /// The documented defaults' shape: 3 tries, 1 s base, capped at 30 s.
    const POLICY: Policy = Policy {
        max_attempts: 3,
        retry_base: Duration::from_secs(1),
        retry_max: Duration::from_secs(30),
    };

    /// A transient failure (LLM timeout, stage timeout, panic, connection
    /// error, 5xx, 529, an invalid provider response): backoff, up to the limit.
    const TRANSIENT: Disposition = Disposition::Retry {
        after: None,
        max_attempts: None,
    };

    /// The analyzer's invalid JSON: exactly one retry.
    const INVALID_JSON: Disposition = Disposition::Retry {
        after: None,
        max_attempts: Some(2),
    };

    fn rate_limited(after: Duration) -> Disposition {
        Disposition::Retry {
            after: Some(after),
            max_attempts: None,
        }
    }

    fn facts(attempt: u32, jitter: f64) -> ClaimFacts {
        ClaimFacts { attempt, jitter }
    }

    fn retry(stage: StageKind, after: Duration, limit: u32) -> Decision {
        Decision::Retry {
            status: stage.ready_status(),
            after,
            limit,
        }
    }

    #[test]
    fn every_row_of_the_error_policy() {
        use StageKind::{Analyze, Assemble, Respond};
        use StageOutcome::{Failed, Released, Succeeded};
        #[rustfmt::skip]
        let rows: Vec<(&str, StageKind, ClaimFacts, StageOutcome, Policy, Decision)> = vec![
            // A success moves the request on.
            ("analyze succeeds", Analyze, facts(1, 1.0), Succeeded, POLICY, Decision::Advance { status: Status::Analyzed }),
            ("assemble succeeds", Assemble, facts(2, 1.0), Succeeded, POLICY, Decision::Advance { status: Status::Ready }),
            ("respond succeeds", Respond, facts(3, 1.0), Succeeded, POLICY, Decision::Advance { status: Status::Completed }),
            // LLM timeout, connection error, 5xx, 529: max_attempts tries
            // with exponential backoff and jitter.
            ("timeout, 1st try: base delay", Respond, facts(1, 1.0), Failed(TRANSIENT), POLICY, retry(Respond, SECS(1), 3)),
            ("timeout, 1st try: jittered", Respond, facts(1, 0.5), Failed(TRANSIENT), POLICY, retry(Respond, MS(500), 3)),
            ("timeout, 2nd try: doubled", Analyze, facts(2, 1.0), Failed(TRANSIENT), POLICY, retry(Analyze, SECS(2), 3)),
            ("timeout, 3rd try: attempts exhausted", Analyze, facts(3, 1.0), Failed(TRANSIENT), POLICY, Decision::Fail { exhausted: Some(3) }),
            ("timeout past the limit (lowered config)", Analyze, facts(5, 1.0), Failed(TRANSIENT), POLICY, Decision::Fail { exhausted: Some(3) }),
            ("backoff capped at retry_max", Respond, facts(9, 1.0), Failed(TRANSIENT), Policy { max_attempts: 12, ..POLICY }, retry(Respond, SECS(30), 12)),
            ("one try allowed: no retry", Respond, facts(1, 1.0), Failed(TRANSIENT), Policy { max_attempts: 1, ..POLICY }, Decision::Fail { exhausted: Some(1) }),
            // 429: honour Retry-After, else 60 s; each counts a try.
            ("429 with Retry-After", Respond, facts(1, 0.5), Failed(rate_limited(SECS(7))), POLICY, retry(Respond, SECS(7), 3)),
            ("429 without Retry-After: 60 s", Analyze, facts(2, 1.0), Failed(rate_limited(DEFAULT_RATE_LIMIT_WAIT)), POLICY, retry(Analyze, SECS(60), 3)),
            ("429 on the last try: exhausted", Respond, facts(3, 1.0), Failed(rate_limited(SECS(7))), POLICY, Decision::Fail { exhausted: Some(3) }),
            // This daemon's cool-down after a 429, and a provider outage:
            // deferred, no attempt spent, whatever the count.
            ("cool-down after a 429: deferred", Respond, facts(1, 1.0), Failed(Disposition::Defer { after: SECS(1) }), POLICY, Decision::Defer { status: Status::Ready, after: SECS(1) }),
            ("provider outage: deferred at the limit", Analyze, facts(3, 1.0), Failed(Disposition::Defer { after: MS(500) }), POLICY, Decision::Defer { status: Status::New, after: MS(500) }),
            ("provider outage: deferred past the limit", Assemble, facts(7, 1.0), Failed(Disposition::Defer { after: SECS(10) }), POLICY, Decision::Defer { status: Status::Analyzed, after: SECS(10) }),
            // The analyzer's invalid JSON: exactly one retry.
            ("invalid JSON, 1st try: one retry", Analyze, facts(1, 1.0), Failed(INVALID_JSON), POLICY, retry(Analyze, SECS(1), 2)),
            ("invalid JSON, 2nd try: failed", Analyze, facts(2, 1.0), Failed(INVALID_JSON), POLICY, Decision::Fail { exhausted: Some(2) }),
            ("invalid JSON, config lower than its own limit", Analyze, facts(1, 1.0), Failed(INVALID_JSON), Policy { max_attempts: 1, ..POLICY }, Decision::Fail { exhausted: Some(1) }),
            // A token-limit error the stage could not cure by dropping the
            // history block, other 4xx, auth, spend limit or quota, a stage
            // that produced the wrong kind of output: FAILED at once.
            ("token limit after truncation: failed", Respond, facts(1, 1.0), Failed(Disposition::Fail), POLICY, Decision::Fail { exhausted: None }),
            ("other 4xx / quota: failed at once", Analyze, facts(1, 1.0), Failed(Disposition::Fail), Policy { max_attempts: 12, ..POLICY }, Decision::Fail { exhausted: None }),
            // Shutdown: the lease is given back, no attempt spent.
            ("released at the end of the grace period", Assemble, facts(3, 1.0), Released, POLICY, Decision::Release { status: Status::Analyzed }),
        ];
        for (name, stage, claim, outcome, policy, want) in rows {
            assert_eq!(decide(stage, &claim, &outcome, &policy), want, "{name}");
        }
    }

    #[test]
    fn decisions_map_to_outcomes_statuses_and_delays() {
        let d = retry(StageKind::Respond, SECS(2), 3);
        assert_eq!(
            (d.outcome(), d.status(), d.delay()),
            (Outcome::Retrying, Status::Ready, SECS(2))
        );
        let d = Decision::Defer {
            status: Status::New,
            after: MS(5),
        };
        assert_eq!(
            (d.outcome(), d.status(), d.delay()),
            (Outcome::Deferred, Status::New, MS(5))
        );
        let d = Decision::Fail { exhausted: Some(3) };
        assert_eq!(
            (d.outcome(), d.status(), d.delay()),
            (Outcome::Failed, Status::Failed, Duration::ZERO)
        );
        let d = Decision::Advance {
            status: Status::Completed,
        };
        assert_eq!((d.outcome(), d.status()), (Outcome::Succeeded, Status::Completed));
        let d = Decision::Release { status: Status::New };
        assert_eq!((d.outcome(), d.status()), (Outcome::Released, Status::New));
    }

    #[test]
    fn the_same_inputs_give_the_same_decision() {
        let claim = facts(2, 0.73);
        let outcome = StageOutcome::Failed(TRANSIENT);
        let first = decide(StageKind::Analyze, &claim, &outcome, &POLICY);
        for _ in 0..100 {
            assert_eq!(decide(StageKind::Analyze, &claim, &outcome, &POLICY), first);
        }
    }
}
