//! The one type for a secret value: the database URL, API tokens, the
//! callback signing key and the LLM providers' API keys.
//!
//! Guarantees: `Debug` and `Display` never show the value (they print
//! `[REDACTED]`); only [`Secret::expose`] hands it out, for the one place
//! that needs it (a connection string, a header, a signature). Serde reads
//! and writes it as a plain string, so configuration keys and the
//! configuration's own defaults layer are unchanged; nothing in the crate
//! serialises a loaded configuration for output.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A string that never shows itself in `Debug` or `Display` output.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([REDACTED])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_shows_itself() {
        let s = Secret::new("sk-hunter2");
        assert_eq!(format!("{s}"), "[REDACTED]");
        assert_eq!(format!("{s:?}"), "Secret([REDACTED])");
        assert_eq!(s.expose(), "sk-hunter2");
        assert_eq!(serde_json::to_string(&s).ok().as_deref(), Some("\"sk-hunter2\""));
    }
}
