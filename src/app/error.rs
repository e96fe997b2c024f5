//! The errors of the application layer: what went wrong, as a [`Kind`]
//! every door maps to its wire (an HTTP status, an MCP tool error, an
//! OpenAI error object), a stable `code` and a message naming the field,
//! value or limit.

use crate::users::UserError;

/// What kind of failure, for the door to say in its own terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The input is malformed or out of bounds (HTTP 400).
    Invalid,
    /// No caller, or a wrong or revoked token (401).
    Unauthenticated,
    /// The caller may not do this: its scope, its bound user, an origin
    /// (403).
    Forbidden,
    /// Nothing of that id for this caller (404).
    NotFound,
    /// The thing is not in a state the action applies to (409).
    Conflict,
    /// The user was forgotten: its requests are refused (410).
    Gone,
    /// The body is over its cap (413).
    TooLarge,
    /// The body is not of a media type the door reads (415).
    UnsupportedMedia,
    /// Well-formed but refused: a reused idempotency key, a field's value
    /// (422).
    Unprocessable,
    /// The door wants a protocol upgrade, as a WebSocket route does (426).
    UpgradeRequired,
    /// The caller is over one of its limits or caps; retry later (429).
    TooMany,
    /// The daemon or the database cannot serve it now; retry (503).
    Unavailable,
    /// A fault of maas, logged where it happened (500).
    Internal,
}

/// An error of the application layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppError {
    pub kind: Kind,
    /// A stable, machine-readable name (`malformed_json`, `invalid_id`, …).
    pub code: &'static str,
    pub message: String,
    /// When to come back, in seconds; a [`Kind::TooMany`] or
    /// [`Kind::Unavailable`] without one says 1.
    pub retry_after: Option<u64>,
}

impl AppError {
    pub fn new(kind: Kind, code: &'static str, message: impl Into<String>) -> AppError {
        AppError {
            kind,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same error, telling the client to come back after `secs`.
    pub fn retry_after(mut self, secs: u64) -> AppError {
        self.retry_after = Some(secs);
        self
    }

    /// When to come back, in seconds, for the kinds that are retried.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self.kind {
            Kind::TooMany | Kind::Unavailable => Some(self.retry_after.unwrap_or(1)),
            _ => self.retry_after,
        }
    }

    pub fn too_many(code: &'static str, message: impl Into<String>) -> AppError {
        AppError::new(Kind::TooMany, code, message)
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> AppError {
        AppError::new(Kind::Invalid, code, message)
    }

    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> AppError {
        AppError::new(Kind::Unprocessable, code, message)
    }

    pub fn not_found(message: impl Into<String>) -> AppError {
        AppError::new(Kind::NotFound, "not_found", message)
    }

    pub fn forbidden(code: &'static str, message: impl Into<String>) -> AppError {
        AppError::new(Kind::Forbidden, code, message)
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> AppError {
        AppError::new(Kind::Conflict, code, message)
    }

    pub fn unavailable(code: &'static str, message: impl Into<String>) -> AppError {
        AppError::new(Kind::Unavailable, code, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> AppError {
        AppError::new(Kind::Unauthenticated, "unauthorized", message)
    }

    pub fn internal(message: impl Into<String>) -> AppError {
        AppError::new(Kind::Internal, "internal", message)
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for AppError {}

impl From<crate::db::Error> for AppError {
    fn from(e: crate::db::Error) -> AppError {
        if lock_or_timeout(&e) {
            // Another transaction holds the rows (lock_timeout), or the
            // statement ran out of statement_timeout: the client may retry.
            tracing::warn!(error = %e, "app: database busy");
            AppError::unavailable(
                "database_busy",
                "the rows this request needs are locked by another transaction, or the statement timed out; try again",
            )
        } else if e.is_connection() {
            tracing::warn!(error = %e, "app: database unavailable");
            AppError::unavailable("database_unavailable", "the database is unavailable; try again")
        } else {
            tracing::error!(error = %e, "app: database error");
            AppError::internal("internal error")
        }
    }
}

/// Lock timeout (55P03), statement timeout (57014), deadlock (40P01) or
/// serialization failure (40001).
fn lock_or_timeout(e: &crate::db::Error) -> bool {
    let code = match e {
        crate::db::Error::Postgres(e) => e.code(),
        crate::db::Error::Pool(deadpool_postgres::PoolError::Backend(e)) => e.code(),
        _ => None,
    };
    code.is_some_and(|c| matches!(c.code(), "55P03" | "57014" | "40P01" | "40001"))
}

impl From<deadpool_postgres::PoolError> for AppError {
    fn from(e: deadpool_postgres::PoolError) -> AppError {
        AppError::from(crate::db::Error::from(e))
    }
}

impl From<UserError> for AppError {
    fn from(e: UserError) -> AppError {
        match e {
            UserError::Unknown(_) => AppError::new(Kind::NotFound, "unknown_user", e.to_string()),
            UserError::Forgotten { .. } => AppError::new(Kind::NotFound, "user_forgotten", e.to_string()),
            UserError::Erasing(_) => AppError::conflict("erase_running", e.to_string()),
            UserError::NoSuch { .. } => AppError::not_found(e.to_string()),
            UserError::Db(d) => AppError::from(d),
        }
    }
}
