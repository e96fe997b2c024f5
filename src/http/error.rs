//! API errors: a status code and a JSON body `{"error": message, "code": code}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// An error answer of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    /// A stable, machine-readable name (`malformed_json`, `invalid_id`, …).
    pub code: &'static str,
    pub message: String,
    /// `Retry-After` in seconds; a 429 or 503 without one says 1.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same error, telling the client to come back after `secs`.
    pub fn retry_after(mut self, secs: u64) -> ApiError {
        self.retry_after = Some(secs);
        self
    }

    pub fn too_many(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, code, message)
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn unavailable(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }
}

impl From<crate::db::Error> for ApiError {
    fn from(e: crate::db::Error) -> ApiError {
        if lock_or_timeout(&e) {
            // Another transaction holds the rows (lock_timeout), or the
            // statement ran out of statement_timeout: the client may retry.
            tracing::warn!(error = %e, "http: database busy");
            ApiError::unavailable(
                "database_busy",
                "the rows this request needs are locked by another transaction, or the statement timed out; try again",
            )
        } else if e.is_connection() {
            tracing::warn!(error = %e, "http: database unavailable");
            ApiError::unavailable("database_unavailable", "the database is unavailable; try again")
        } else {
            tracing::error!(error = %e, "http: database error");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error")
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

impl From<deadpool_postgres::PoolError> for ApiError {
    fn from(e: deadpool_postgres::PoolError) -> ApiError {
        ApiError::from(crate::db::Error::from(e))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message, "code": self.code });
        let mut resp = (self.status, Json(body)).into_response();
        let retry = match self.retry_after {
            Some(s) => Some(s),
            None if matches!(
                self.status,
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
            ) =>
            {
                Some(1)
            }
            None => None,
        };
        if let Some(secs) = retry {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}
