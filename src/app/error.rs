//! The errors of the application layer: what went wrong, as a [`Kind`]
//! every door maps to its wire (an HTTP status, an MCP tool error, an
//! OpenAI error object), a stable `code` and a message naming the field,
//! value or limit.

use crate::model::named_enum;
use crate::users::UserError;

named_enum! {
    /// The stable, machine-readable name of a refusal, the `code` of every
    /// door's error (HTTP's JSON body, an MCP tool's error, the coming
    /// endpoints'); `docs/http-api.md` lists them ("Error codes").
    pub enum Code {
        /// Cancel: the request already finished.
        AlreadyFinished = "already_finished",
        /// The request could not be read (a framework refusal).
        BadRequest = "bad_request",
        /// The body is over `http.max_body_bytes`.
        BodyTooLarge = "body_too_large",
        /// An operator action's database call failed; retry.
        Database = "database",
        /// The rows are locked or the statement timed out; retry.
        DatabaseBusy = "database_busy",
        /// The database cannot be reached; retry.
        DatabaseUnavailable = "database_unavailable",
        /// A text field is blank.
        EmptyField = "empty_field",
        /// The user is being erased.
        EraseRunning = "erase_running",
        /// A text field is over its length.
        FieldTooLong = "field_too_long",
        /// Without tokens, `Host` is not a loopback name.
        ForbiddenHost = "forbidden_host",
        /// `Origin` is not this server (or, without tokens, not loopback).
        ForbiddenOrigin = "forbidden_origin",
        /// The idempotency key changed hands meanwhile; retry.
        IdempotencyConflict = "idempotency_conflict",
        /// The idempotency key was used for a different request.
        IdempotencyKeyReused = "idempotency_key_reused",
        /// A fault of maas, logged.
        Internal = "internal",
        /// An MCP tool argument is malformed.
        InvalidArgument = "invalid_argument",
        /// A stream position (`Last-Event-ID`, `after`) is malformed.
        InvalidCursor = "invalid_cursor",
        /// A field has the wrong type or value.
        InvalidField = "invalid_field",
        /// An id is not a UUID (or a positive integer).
        InvalidId = "invalid_id",
        /// The `Idempotency-Key` header is malformed.
        InvalidIdempotencyKey = "invalid_idempotency_key",
        /// `include` names something unknown.
        InvalidInclude = "invalid_include",
        /// `metadata` is not an object within its bounds.
        InvalidMetadata = "invalid_metadata",
        /// A query parameter is malformed.
        InvalidQuery = "invalid_query",
        /// A text holds a NUL character.
        InvalidText = "invalid_text",
        /// `wait` is not a duration within bounds.
        InvalidWait = "invalid_wait",
        /// The body is not a JSON object.
        MalformedJson = "malformed_json",
        /// The tenant has its most requests in flight.
        MaxInFlight = "max_in_flight",
        /// The route has no such method.
        MethodNotAllowed = "method_not_allowed",
        /// An MCP tool argument is missing.
        MissingArgument = "missing_argument",
        /// A required field is missing.
        MissingField = "missing_field",
        /// The OpenAI-compatible endpoint does not offer that model.
        ModelNotFound = "model_not_found",
        /// No such route.
        NoRoute = "no_route",
        /// Review: the request does not await review (its status is named).
        NotAwaitingReview = "not_awaiting_review",
        /// Retry: the request is not `FAILED`.
        NotFailed = "not_failed",
        /// No such request, record or turn for this caller.
        NotFound = "not_found",
        /// Continue: the request does not rest between stages.
        NotHeld = "not_held",
        /// Reply: the request does not wait for its user's reply.
        NotWaiting = "not_waiting",
        /// The request ended failed or cancelled (its error says why).
        RequestFailed = "request_failed",
        /// The tenant is over its requests per minute.
        RequestsPerMinute = "requests_per_minute",
        /// The token's scope does not allow this.
        ScopeRequired = "scope_required",
        /// No MCP session of that id for this token.
        SessionNotFound = "session_not_found",
        /// No answer within `http.request_timeout_secs`.
        Timeout = "timeout",
        /// The token was revoked during a wait or stream.
        TokenRevoked = "token_revoked",
        /// This address sent too many wrong tokens.
        TooManyAuthFailures = "too_many_auth_failures",
        /// The token holds its most exports.
        TooManyExports = "too_many_exports",
        /// Another refusal of the HTTP framework, with its status.
        HttpError = "http_error",
        /// Too many requests (a framework refusal).
        TooManyRequests = "too_many_requests",
        /// The token holds its most memory searches.
        TooManySearches = "too_many_searches",
        /// The token (429) or daemon (503) holds its most MCP sessions.
        TooManySessions = "too_many_sessions",
        /// The token (429) or daemon (503) holds its most streams or long-polls.
        TooManyStreams = "too_many_streams",
        /// No caller on the request.
        Unauthenticated = "unauthenticated",
        /// No token, or a wrong or revoked one.
        Unauthorized = "unauthorized",
        /// Nothing is held about the user.
        UnknownUser = "unknown_user",
        /// The body is well-formed but refused (a framework refusal).
        Unprocessable = "unprocessable",
        /// The body could not be read.
        UnreadableBody = "unreadable_body",
        /// The body is not `application/json`.
        UnsupportedMediaType = "unsupported_media_type",
        /// The user was forgotten; its requests are refused.
        UserForgotten = "user_forgotten",
        /// The token acts for another user.
        UserNotAllowed = "user_not_allowed",
        /// The route needs a WebSocket upgrade.
        WebsocketRequired = "websocket_required",
    }
}

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
    pub code: Code,
    pub message: String,
    /// When to come back, in seconds; a [`Kind::TooMany`] or
    /// [`Kind::Unavailable`] without one says 1.
    pub retry_after: Option<u64>,
    /// For a database failure: the server's own words (message, SQLSTATE,
    /// constraint). The network doors keep it to the log; a trusted door
    /// (`maasctl`, on the operator's own connection) prints it.
    pub cause: Option<String>,
}

impl AppError {
    pub fn new(kind: Kind, code: Code, message: impl Into<String>) -> AppError {
        AppError {
            kind,
            code,
            message: message.into(),
            retry_after: None,
            cause: None,
        }
    }

    /// The same error, telling the client to come back after `secs`.
    pub fn retry_after(mut self, secs: u64) -> AppError {
        self.retry_after = Some(secs);
        self
    }

    /// The same error, with the database's words for it.
    fn caused_by(mut self, e: &crate::db::Error) -> AppError {
        self.cause = Some(e.to_string());
        self
    }

    /// What an operator reads: the message, and the cause where there is
    /// one.
    pub fn detailed(&self) -> String {
        match &self.cause {
            Some(cause) => format!("{}: {cause}", self.message),
            None => self.message.clone(),
        }
    }

    /// When to come back, in seconds, for the kinds that are retried.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self.kind {
            Kind::TooMany | Kind::Unavailable => Some(self.retry_after.unwrap_or(1)),
            _ => self.retry_after,
        }
    }

    pub fn too_many(code: Code, message: impl Into<String>) -> AppError {
        AppError::new(Kind::TooMany, code, message)
    }

    pub fn bad_request(code: Code, message: impl Into<String>) -> AppError {
        AppError::new(Kind::Invalid, code, message)
    }

    pub fn unprocessable(code: Code, message: impl Into<String>) -> AppError {
        AppError::new(Kind::Unprocessable, code, message)
    }

    pub fn not_found(message: impl Into<String>) -> AppError {
        AppError::new(Kind::NotFound, Code::NotFound, message)
    }

    pub fn forbidden(code: Code, message: impl Into<String>) -> AppError {
        AppError::new(Kind::Forbidden, code, message)
    }

    pub fn conflict(code: Code, message: impl Into<String>) -> AppError {
        AppError::new(Kind::Conflict, code, message)
    }

    pub fn unavailable(code: Code, message: impl Into<String>) -> AppError {
        AppError::new(Kind::Unavailable, code, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> AppError {
        AppError::new(Kind::Unauthenticated, Code::Unauthorized, message)
    }

    pub fn internal(message: impl Into<String>) -> AppError {
        AppError::new(Kind::Internal, Code::Internal, message)
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
                Code::DatabaseBusy,
                "the rows this request needs are locked by another transaction, or the statement timed out; try again",
            )
            .caused_by(&e)
        } else if e.is_connection() {
            tracing::warn!(error = %e, "app: database unavailable");
            AppError::unavailable(Code::DatabaseUnavailable, "the database is unavailable; try again").caused_by(&e)
        } else {
            tracing::error!(error = %e, "app: database error");
            AppError::internal("internal error").caused_by(&e)
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
            UserError::Unknown(_) => AppError::new(Kind::NotFound, Code::UnknownUser, e.to_string()),
            UserError::Forgotten { .. } => AppError::new(Kind::NotFound, Code::UserForgotten, e.to_string()),
            UserError::Erasing(_) => AppError::conflict(Code::EraseRunning, e.to_string()),
            UserError::NoSuch { .. } => AppError::not_found(e.to_string()),
            UserError::Db(d) => AppError::from(d),
        }
    }
}
