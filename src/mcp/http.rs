//! The streamable-HTTP transport at `/mcp`: rmcp's tower service, mounted
//! by the daemon beside the HTTP server's `/api` routes, so it sits behind
//! the same middleware as every route (bearer authentication with scopes and
//! tenants, the request timeout, body cap and metrics, and the loopback
//! guard of `local_guard` when no token is configured).
//!
//! - Host: rmcp's own loopback-only Host list is off, since `local_guard`
//!   applies the same rule in the loopback mode and a deployment with
//!   tokens serves its own names.
//! - Origin: the specification asks every server to check it (DNS
//!   rebinding), and a browser reaches `/mcp`'s streams without CORS: with
//!   tokens or not, a request carrying an `Origin` must name this server
//!   (checked by the HTTP server for every door mounted beside `/api`, 403
//!   `forbidden_origin`), so no page of
//!   another site — nor of another port of the loopback — drives it.
//! - Sessions: the current revision has none (each request stands alone);
//!   for clients of the revisions before it rmcp keeps each session in
//!   this daemon's memory, bound to the token that opened it, capped, and
//!   ended by `DELETE`, revocation or shutdown ([`super::sessions`]).

use std::sync::Arc;

use axum::Router;
use axum::middleware;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::Server;
use super::sessions::{self, Door, Manager};
use crate::app::App;

/// The route `/mcp` (every method: POST, GET, DELETE), for the server's
/// router (whatever its state: this route keeps its own).
pub fn router<S: Clone + Send + Sync + 'static>(app: &App) -> Router<S> {
    let state = app.clone();
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_cancellation_token(app.shutdown.child_token())
        .with_max_request_body_bytes(app.cfg.http.max_body_bytes);
    let manager = Arc::new(Manager::new(
        app.cfg.http.max_mcp_sessions,
        app.cfg.http.max_mcp_sessions_per_token,
    ));
    let service = StreamableHttpService::new(move || Ok(Server::new(state.clone())), manager.clone(), config);
    let door = Door {
        manager,
        app: app.clone(),
    };
    Router::new()
        .route_service("/mcp", service)
        .route_layer(middleware::from_fn_with_state(door, sessions::guard))
}
