//! The one backoff rule of the crate: exponential from a base, capped, with
//! jitter, so work that failed together does not come back together.
//!
//! - [`exponential`] is pure (the jitter is an argument): the attempt
//!   policy and its tests use it without a random source.
//! - [`retry_delay`] draws the jitter in [½, 1]: durable retries (stage
//!   attempts, callback deliveries) whose delay is stored in a row.
//! - [`reconnect`] builds the in-memory backoff of reconnect and retry loops
//!   (the LISTEN session, claims, result writes): unbounded tries, full
//!   jitter, reset by building it again.

use std::time::Duration;

use backon::ExponentialBuilder;

/// The delay after failed attempt `attempt` (1-based): `base` doubled per
/// earlier attempt, capped at `cap`, times `jitter` (expected in [½, 1]).
pub fn exponential(base: Duration, cap: Duration, attempt: u32, jitter: f64) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
    exp.min(cap).mul_f64(jitter)
}

/// A jitter factor in [½, 1] for [`exponential`].
pub fn jitter() -> f64 {
    rand::random_range(0.5..=1.0)
}

/// [`exponential`] with a fresh [`jitter`].
pub fn retry_delay(base: Duration, cap: Duration, attempt: u32) -> Duration {
    exponential(base, cap, attempt, jitter())
}

/// Capped exponential backoff with jitter and no limit on tries, from `min`
/// to `max`; `build()` it again to start over.
pub fn reconnect(min: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_per_attempt_up_to_the_cap() {
        let (base, cap) = (Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(exponential(base, cap, 0, 1.0), base);
        assert_eq!(exponential(base, cap, 1, 1.0), base);
        assert_eq!(exponential(base, cap, 2, 1.0), base * 2);
        assert_eq!(exponential(base, cap, 3, 0.5), base * 2);
        assert_eq!(exponential(base, cap, 5, 1.0), cap);
        assert_eq!(exponential(base, cap, u32::MAX, 1.0), cap);
    }

    #[test]
    fn drawn_jitter_stays_within_half_and_whole() {
        for attempt in 1..10 {
            let d = retry_delay(Duration::from_millis(100), Duration::from_secs(60), attempt);
            let full = exponential(Duration::from_millis(100), Duration::from_secs(60), attempt, 1.0);
            assert!(d >= full / 2 && d <= full, "{d:?} vs {full:?}");
        }
    }
}
