//! The application layer's errors on the HTTP wire: a status for each
//! [`Kind`] and a JSON body `{"error": message, "code": code}`, with
//! `Retry-After` on a 429 or 503 and `WWW-Authenticate` on a 401.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::app::{AppError, Kind};

/// The HTTP status of an error of `kind`.
pub fn status(kind: Kind) -> StatusCode {
    match kind {
        Kind::Invalid => StatusCode::BAD_REQUEST,
        Kind::Unauthenticated => StatusCode::UNAUTHORIZED,
        Kind::Forbidden => StatusCode::FORBIDDEN,
        Kind::NotFound => StatusCode::NOT_FOUND,
        Kind::Conflict => StatusCode::CONFLICT,
        Kind::Gone => StatusCode::GONE,
        Kind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        Kind::UnsupportedMedia => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        Kind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        Kind::UpgradeRequired => StatusCode::UPGRADE_REQUIRED,
        Kind::TooMany => StatusCode::TOO_MANY_REQUESTS,
        Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Kind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let retry = self.retry_after_secs();
        let body = serde_json::json!({ "error": self.message, "code": self.code });
        let mut resp = (status(self.kind), Json(body)).into_response();
        if let Some(secs) = retry {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.kind == Kind::Unauthenticated {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}
