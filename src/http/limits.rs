//! Caps on what clients hold open: long-polls and streams (SSE and
//! WebSocket), memory searches and exports, per daemon and per bearer
//! token; and the rate of failed authentications per peer address.
//!
//! Guarantees: a request over a cap is answered at once — 429 when the
//! caller's cap is reached (checked first), 503 when the daemon's is — both with
//! `Retry-After`, never queued. A [`Pass`] holds one place until dropped
//! (the long-poll answers, the stream ends or its client goes away), so the
//! counts cannot leak.
//!
//! [`AuthFailures`]: a peer address that sent more wrong tokens than
//! `http.max_auth_failures_per_minute` (in a burst of as many) is refused
//! with 429 and `Retry-After` until its budget refills, before any token
//! lookup; its right tokens still pass. The table of addresses is bounded
//! (forgotten when full) and swept of addresses at full budget.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use super::error::ApiError;

/// Who holds a place: the SHA-256 of the bearer token, or all zeros
/// without tokens (every caller is then one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Caller(pub [u8; 32]);

impl Caller {
    pub const ANONYMOUS: Caller = Caller([0; 32]);
}

/// `Retry-After` of a refusal, in seconds.
const RETRY_AFTER_SECS: u64 = 1;

/// One kind of place (long-polls, streams, searches, exports) with its
/// two caps.
pub struct Gate {
    what: &'static str,
    /// The `code` of a refusal.
    code: &'static str,
    total: usize,
    per_caller: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    by_caller: HashMap<Caller, usize>,
}

impl Gate {
    /// Streams or long-polls: refused with code `too_many_streams`.
    pub fn new(what: &'static str, total: usize, per_caller: usize) -> Arc<Gate> {
        Gate::coded(what, "too_many_streams", total, per_caller)
    }

    /// A gate whose refusals carry `code`.
    pub fn coded(what: &'static str, code: &'static str, total: usize, per_caller: usize) -> Arc<Gate> {
        Arc::new(Gate {
            what,
            code,
            total,
            per_caller,
            held: Mutex::new(Held::default()),
        })
    }

    /// Takes a place for `caller`, or says which cap is reached.
    pub fn enter(self: &Arc<Self>, caller: Caller) -> Result<Pass, ApiError> {
        let mut held = self
            .held
            .lock()
            .map_err(|_| ApiError::unavailable("internal", "limits unavailable"))?;
        let mine = held.by_caller.get(&caller).copied().unwrap_or(0);
        if mine >= self.per_caller {
            return Err(ApiError::too_many(
                self.code,
                format!(
                    "this token holds its most {} ({}); close one or try again later",
                    self.what, self.per_caller
                ),
            )
            .retry_after(RETRY_AFTER_SECS));
        }
        if held.total >= self.total {
            return Err(ApiError::unavailable(
                self.code,
                format!(
                    "this server holds its most {} ({}); try again later",
                    self.what, self.total
                ),
            )
            .retry_after(RETRY_AFTER_SECS));
        }
        *held.by_caller.entry(caller).or_insert(0) += 1;
        held.total += 1;
        Ok(Pass {
            gate: self.clone(),
            caller,
        })
    }

    /// Places held now (daemon-wide).
    pub fn held(&self) -> usize {
        self.held.lock().map_or(0, |h| h.total)
    }
}

/// One place, given back on drop.
pub struct Pass {
    gate: Arc<Gate>,
    caller: Caller,
}

impl Drop for Pass {
    fn drop(&mut self) {
        if let Ok(mut held) = self.gate.held.lock() {
            held.total = held.total.saturating_sub(1);
            if let Some(n) = held.by_caller.get_mut(&self.caller) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    held.by_caller.remove(&self.caller);
                }
            }
        }
    }
}

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
    pub fn check(&self, peer: Option<IpAddr>) -> Result<(), ApiError> {
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
fn refusal(wait: Duration) -> ApiError {
    let secs = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
    ApiError::too_many(
        "too_many_auth_failures",
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
        assert_eq!(refused.as_ref().map(|e| e.status.as_u16()), Some(429));
        assert!(f.check(Some(b)).is_ok());
        assert!(f.check(None).is_ok());
    }

    #[test]
    fn caps_refuse_with_the_right_status_and_places_come_back() {
        let gate = Gate::new("long-polls", 3, 2);
        let (a, b) = (Caller([1; 32]), Caller([2; 32]));
        let a1 = gate.enter(a).ok();
        let _a2 = gate.enter(a).ok();
        assert_eq!(gate.enter(a).err().map(|e| e.status.as_u16()), Some(429));
        let _b1 = gate.enter(b).ok();
        assert_eq!(gate.enter(b).err().map(|e| e.status.as_u16()), Some(503));
        drop(a1);
        assert_eq!(gate.held(), 2);
        assert!(gate.enter(b).is_ok());
    }
}
