//! Caps on what callers hold open at once: long-polls and streams
//! (SSE, WebSocket, MCP waits and sessions), memory searches and exports,
//! per daemon and per bearer token.
//!
//! Guarantees: an entry over a cap is refused at once — `TooMany` when the
//! caller's cap is reached (checked first), `Unavailable` when the
//! daemon's is — both with a retry time, never queued. A [`Pass`] holds
//! one place until dropped (the long-poll answers, the stream ends or its
//! client goes away), so the counts cannot leak.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::caller::Caller;
use super::error::{AppError, Code};

/// When to retry after a refusal, in seconds.
const RETRY_AFTER_SECS: u64 = 1;

/// One kind of place (long-polls, streams, searches, exports) with its
/// two caps.
pub struct Gate {
    what: &'static str,
    /// The `code` of a refusal.
    code: Code,
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
        Gate::coded(what, Code::TooManyStreams, total, per_caller)
    }

    /// A gate whose refusals carry `code`.
    pub fn coded(what: &'static str, code: Code, total: usize, per_caller: usize) -> Arc<Gate> {
        Arc::new(Gate {
            what,
            code,
            total,
            per_caller,
            held: Mutex::new(Held::default()),
        })
    }

    /// Takes a place for `caller`, or says which cap is reached.
    pub fn enter(self: &Arc<Self>, caller: Caller) -> Result<Pass, AppError> {
        let mut held = self
            .held
            .lock()
            .map_err(|_| AppError::unavailable(Code::Internal, "limits unavailable"))?;
        let mine = held.by_caller.get(&caller).copied().unwrap_or(0);
        if mine >= self.per_caller {
            return Err(AppError::too_many(
                self.code,
                format!(
                    "this token holds its most {} ({}); close one or try again later",
                    self.what, self.per_caller
                ),
            )
            .retry_after(RETRY_AFTER_SECS));
        }
        if held.total >= self.total {
            return Err(AppError::unavailable(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::Kind;

    #[test]
    fn caps_refuse_with_the_right_status_and_places_come_back() {
        let gate = Gate::new("long-polls", 3, 2);
        let (a, b) = (Caller([1; 32]), Caller([2; 32]));
        let a1 = gate.enter(a).ok();
        let _a2 = gate.enter(a).ok();
        assert_eq!(gate.enter(a).err().map(|e| e.kind), Some(Kind::TooMany));
        let _b1 = gate.enter(b).ok();
        assert_eq!(gate.enter(b).err().map(|e| e.kind), Some(Kind::Unavailable));
        drop(a1);
        assert_eq!(gate.held(), 2);
        assert!(gate.enter(b).is_ok());
    }
}
