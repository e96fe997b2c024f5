//! An LLM failure mapped to the daemon's retry policy, shared by the stages
//! and the archivist.
//!
//! Guarantees: the mapping is total and pure ([`Failure::from_llm`] looks at
//! the error's [`LlmDisposition`] only): timeouts, connection errors, 5xx,
//! 529 and invalid responses retry with exponential backoff; a 429 waits for
//! its `Retry-After` (else [`DEFAULT_RATE_LIMIT_WAIT`]), each counting a
//! try; this daemon's own throttling waits without counting; quota, auth,
//! token-limit and other 4xx fail now. The message is the error's text,
//! which the LLM layer has already scrubbed of keys.

use std::borrow::Cow;
use std::time::Duration;

use super::{LlmDisposition, LlmError};
use crate::error::Disposition;

/// Tries a model call gets when its answer is not valid output (not the
/// JSON the prompt asks for): exactly one more.
pub const INVALID_OUTPUT_ATTEMPTS: u32 = 2;

/// How long a caller waits after a 429 that named no delay (the error policy's 60 s).
pub const DEFAULT_RATE_LIMIT_WAIT: Duration = Duration::from_secs(60);

/// A failed model call (or a model answer the caller could not use): its
/// class for histories and metrics, a message for the operator, and what
/// the caller should do about it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{class}: {message}")]
pub struct Failure {
    pub class: Cow<'static, str>,
    pub message: String,
    pub disposition: Disposition,
}

impl Failure {
    /// A failure worth another try, after the caller's backoff.
    pub fn retry(class: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Failure {
        Failure {
            class: class.into(),
            message: message.into(),
            disposition: Disposition::Retry {
                after: None,
                max_attempts: None,
            },
        }
    }

    /// A failure no retry can fix.
    pub fn fail(class: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Failure {
        Failure {
            class: class.into(),
            message: message.into(),
            disposition: Disposition::Fail,
        }
    }

    /// Maps a provider failure to the retry policy (see the module doc).
    pub fn from_llm(e: &LlmError) -> Failure {
        let disposition = match e.disposition() {
            LlmDisposition::Retry => Disposition::Retry {
                after: None,
                max_attempts: None,
            },
            LlmDisposition::RateLimited { retry_after } => Disposition::Retry {
                after: Some(retry_after.unwrap_or(DEFAULT_RATE_LIMIT_WAIT)),
                max_attempts: None,
            },
            LlmDisposition::Throttled { retry_after } => Disposition::Defer {
                after: retry_after.unwrap_or(Duration::from_secs(1)),
            },
            LlmDisposition::Fail | LlmDisposition::TokenLimit => Disposition::Fail,
        };
        Failure {
            class: e.class().into(),
            message: e.to_string(),
            disposition,
        }
    }
}

impl From<LlmError> for Failure {
    fn from(e: LlmError) -> Failure {
        Failure::from_llm(&e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry(after: Option<Duration>) -> Disposition {
        Disposition::Retry {
            after,
            max_attempts: None,
        }
    }

    #[test]
    fn maps_every_disposition_of_the_llm_layer() {
        let msg = || "m".to_owned();
        let cases = [
            (LlmError::Injected, retry(None)),
            (
                LlmError::RateLimited {
                    provider: "openai",
                    retry_after: Some(Duration::from_secs(7)),
                    message: msg(),
                },
                retry(Some(Duration::from_secs(7))),
            ),
            (
                LlmError::RateLimited {
                    provider: "openai",
                    retry_after: None,
                    message: msg(),
                },
                retry(Some(DEFAULT_RATE_LIMIT_WAIT)),
            ),
            (
                LlmError::Throttled {
                    provider: "openai",
                    retry_after: None,
                    message: msg(),
                },
                Disposition::Defer {
                    after: Duration::from_secs(1),
                },
            ),
            (
                LlmError::Auth {
                    provider: "openai",
                    status: 401,
                    message: msg(),
                },
                Disposition::Fail,
            ),
            (
                LlmError::TokenLimit {
                    provider: "openai",
                    status: 400,
                    message: msg(),
                },
                Disposition::Fail,
            ),
        ];
        for (e, want) in cases {
            let f = Failure::from_llm(&e);
            assert_eq!(f.disposition, want, "{e}");
            assert_eq!(f.class, e.class());
            assert_eq!(f.to_string(), format!("{}: {e}", e.class()));
        }
    }
}
