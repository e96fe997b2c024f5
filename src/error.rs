//! What the dispatcher does with a failed stage attempt.
//!
//! Every failure maps to one [`Disposition`]; classification is a method on
//! each error type (`StageError::disposition`, `db::Error::is_connection`).

use std::time::Duration;

/// The dispatcher's decision about a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Count the attempt and try again after a jittered exponential backoff
    /// (or after `after`, when the failure says how long to wait, as a rate
    /// limit does). Past `max_attempts` (the configured one unless the
    /// failure sets a lower one, as invalid model output does) the request
    /// is `FAILED`.
    Retry {
        after: Option<Duration>,
        max_attempts: Option<u32>,
    },
    /// Try again after `after` without spending the attempt: nothing was
    /// attempted (e.g. the provider is cooling down after a 429).
    Defer { after: Duration },
    /// Permanent: the request is `FAILED` now.
    Fail,
}

/// An error and its causes on one line, each cause once (many errors repeat
/// their source in their own message).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}
