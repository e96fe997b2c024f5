//! The streamable-HTTP transport at `/mcp`: rmcp's tower service, nested in
//! the server's router by [`crate::http::start`], so it sits behind the
//! same middleware as every route (bearer authentication with scopes and
//! tenants, the request timeout, body cap and metrics, and the loopback
//! guard of `local_guard` when no token is configured).
//!
//! - Host: rmcp's own loopback-only Host list is off, since `local_guard`
//!   applies the same rule in the loopback mode and a deployment with
//!   tokens serves its own names.
//! - Origin: the specification asks every server to check it (DNS
//!   rebinding). Without tokens `local_guard` does; with them a request
//!   carrying an `Origin` must name this server (`local_guard::same_origin`),
//!   so no page of another site drives an agent's token.
//! - Sessions: the current revision has none (each request stands alone);
//!   for clients of the revisions before it rmcp keeps each session in
//!   this daemon's memory and ends them all at shutdown.

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::Server;
use crate::http::AppState;
use crate::http::error::ApiError;

/// The route `/mcp` (every method: POST, GET, DELETE), for the server's
/// router.
pub fn router(app: &AppState) -> Router<AppState> {
    let state = app.clone();
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_cancellation_token(app.shutdown.child_token())
        .with_max_request_body_bytes(app.cfg.http.max_body_bytes);
    let service = StreamableHttpService::new(
        move || Ok(Server::new(state.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Router::new()
        .route_service("/mcp", service)
        .route_layer(middleware::from_fn(origin))
}

/// A request with an `Origin` must come from this server's own pages.
async fn origin(req: Request, next: Next) -> Response {
    if req.headers().contains_key(header::ORIGIN)
        && let Err(why) = crate::http::local_guard::same_origin(req.headers())
    {
        return ApiError::new(StatusCode::FORBIDDEN, "origin_refused", why).into_response();
    }
    next.run(req).await
}
