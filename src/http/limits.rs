//! The rate of failed authentications per peer address ([`AuthFailures`]):
//! a peer address that sent more wrong tokens than
//! `http.max_auth_failures_per_minute` (in a burst of as many) is refused
//! with 429 and `Retry-After` until its budget refills, before any token
//! lookup; its right tokens still pass. The table of addresses is bounded
//! (forgotten when full) and swept of addresses at full budget.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use crate::app::{AppError, Code};

/// Most peer addresses remembered by [`AuthFailures`]; the table is
/// emptied when full (an address then starts with a full budget).
const PEERS_LIMIT: usize = 100_000;

/// Failed authentications per peer address (GCRA, governor), and the
/// addresses refused until a given time.
pub struct AuthFailures {
    quota: Quota,
    limiter: Mutex<DefaultKeyedRateLimiter<IpAddr>>,
    blocked: Mutex<HashMap<IpAddr, Instant>>,
}

impl AuthFailures {
    /// `per_minute` failures per address, in a burst of as many.
    pub fn new(per_minute: u32) -> AuthFailures {
        let quota = Quota::per_minute(NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN));
        AuthFailures {
            quota,
            limiter: Mutex::new(DefaultKeyedRateLimiter::keyed(quota)),
            blocked: Mutex::new(HashMap::new()),
        }
    }

    /// 429 with `Retry-After` while `peer` is over its budget.
    pub fn check(&self, peer: Option<IpAddr>) -> Result<(), AppError> {
        let Some(peer) = peer else { return Ok(()) };
        let Ok(mut blocked) = self.blocked.lock() else {
            return Ok(());
        };
        match blocked.get(&peer) {
            Some(until) if *until > Instant::now() => Err(refusal(until.saturating_duration_since(Instant::now()))),
            Some(_) => {
                blocked.remove(&peer);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Counts one failure of `peer`; past the budget, the address is
    /// refused until a failure would be allowed again.
    pub fn failed(&self, peer: Option<IpAddr>) {
        let Some(peer) = peer else { return };
        let over = {
            let Ok(mut limiter) = self.limiter.lock() else { return };
            if limiter.len() >= PEERS_LIMIT {
                limiter.retain_recent();
                if limiter.len() >= PEERS_LIMIT {
                    *limiter = DefaultKeyedRateLimiter::keyed(self.quota);
                }
            }
            limiter.check_key(&peer).err()
        };
        if let Some(not_until) = over {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            if let Ok(mut blocked) = self.blocked.lock() {
                if blocked.len() >= PEERS_LIMIT {
                    let now = Instant::now();
                    blocked.retain(|_, until| *until > now);
                }
                blocked.insert(peer, Instant::now() + wait);
            }
            tracing::warn!(peer = %peer, "http: too many failed authentications from one address");
        }
    }
}

/// The 429 of an address over its budget of failed authentications.
fn refusal(wait: Duration) -> AppError {
    let secs = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
    AppError::too_many(
        Code::TooManyAuthFailures,
        "too many failed authentications from this address (http.max_auth_failures_per_minute); retry later",
    )
    .retry_after(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_past_its_failures_is_refused_and_others_are_not() {
        let f = AuthFailures::new(2);
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        f.failed(Some(a));
        f.failed(Some(a));
        assert!(f.check(Some(a)).is_ok(), "within the burst");
        f.failed(Some(a));
        let refused = f.check(Some(a)).err();
        assert_eq!(refused.as_ref().map(|e| e.kind), Some(crate::app::Kind::TooMany));
        assert!(f.check(Some(b)).is_ok());
        assert!(f.check(None).is_ok());
    }
}
