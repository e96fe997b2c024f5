//! The HTTP server of `maasd` (axum on hyper): submit, status and long-poll,
//! live push over SSE and WebSocket, health, readiness, metrics, OpenAPI.
//! A door: its handlers read the wire and call the application layer
//! ([`crate::app`]), whose errors [`error`] maps to statuses.
//!
//! - Gets the application ([`App`]: a pool, the notifier, the hub) and the
//!   daemon's counters, never the engine: live push is the one LISTEN
//!   session's broadcast fanned out in memory (`app::follow`, streamed by
//!   [`live`]); readiness reads the notifier's health.
//! - Its background upkeep (metrics refresh, idempotency key expiry) runs
//!   as daemon services ([`housekeeping`]), started by the daemon.
//! - Every response is produced within `http.request_timeout_secs` (a
//!   long-poll gets its wait on top), else 503; bodies are capped at
//!   `http.max_body_bytes` (413). Streams are bounded by their keep-alives
//!   and send timeouts instead, and end on shutdown.
//! - A client cannot hold the server: request headers must arrive within
//!   `http.header_read_timeout_secs` (idle keep-alive likewise, [`serve`]),
//!   and a client that takes nothing for `http.stream_send_timeout_secs`
//!   is cut; long-polls and streams (the console's included), memory
//!   searches and exports are capped per daemon and per token, and over a
//!   cap the answer is 503 or 429 with `Retry-After` at once ([`limits`]).
//!   Failed authentications are rate limited per peer address (429). The
//!   server has its own pool (`db.api_pool_size`): HTTP traffic never
//!   takes the engine's connections.
//! - An open stream checks its token again every token-cache period and
//!   ends once the token is revoked ([`live`]).
//! - With `http.tls_cert` and `http.tls_key` the server speaks HTTPS only
//!   and sends `Strict-Transport-Security` ([`serves_tls`]).
//! - Malformed input gets a 4xx JSON error naming the problem ([`input`]).
//! - With `api_tokens` configured, every `/api` route needs
//!   `Authorization: Bearer TOKEN`; without them the server refuses to bind
//!   anything but a loopback address. Tokens of the database
//!   (`maasctl tokens`) carry a tenant and a scope ([`tenancy`]); a caller
//!   sees only its tenant's requests, streams and users.
//! - `/mcp` is the Model Context Protocol server (`crate::mcp`), mounted by
//!   the daemon beside the `/api` routes, behind the same tokens, guards and caps, and
//!   outside the OpenAPI document.
//! - `/console` is the operator console ([`console`]): HTML pages behind
//!   the same tokens (a login form and a session cookie), outside the
//!   OpenAPI document.
//! - Shutdown: the server stops accepting when the daemon's token fires,
//!   open streams and long-polls end at once, and [`Server::stop`] waits at
//!   most the grace period for the rest.

pub mod api;
pub mod console;
pub mod error;
pub mod housekeeping;
pub mod input;
pub mod limits;
pub mod live;
pub mod local_guard;
pub mod openai;
pub mod openapi;
pub mod operate;
pub mod ops;
pub mod reply;
pub mod serve;
mod submit_fields;
pub mod tenancy;
pub mod users;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, DefaultBodyLimit, MatchedPath, Request, State};
use axum::handler::Handler;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::app::{App, AppError, Caller, Code, Kind, Principal};
use crate::config::{Config, HttpAddr, exposed_without_tokens, is_loopback};
use crate::metrics::{MetricsError, Stats};

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("http_addr: cannot resolve {addr}: {source}")]
    Resolve { addr: String, source: std::io::Error },
    #[error("http_addr: {0}")]
    Exposed(String),
    #[error("http_addr: cannot bind {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("{0}")]
    Tls(String),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
}

/// What a handler needs: the application every door shares, and what
/// only the HTTP transport holds.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

pub struct Inner {
    pub app: App,
    /// The daemon's counters, copied into `/metrics` at every scrape.
    pub stats: Arc<Stats>,
    pub metrics: PrometheusHandle,
    /// Failed authentications per peer address.
    pub auth_failures: limits::AuthFailures,
    /// The models the OpenAI-compatible endpoint offers, resolved once.
    pub models: Vec<String>,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl std::ops::Deref for Inner {
    type Target = App;
    fn deref(&self) -> &App {
        &self.app
    }
}

/// The routes, and the (method, path) of each, which the OpenAPI test
/// compares with the document.
pub struct Routes {
    pub router: Router<AppState>,
    pub list: Vec<(&'static str, &'static str)>,
}

impl Routes {
    fn new() -> Routes {
        Routes {
            router: Router::new(),
            list: Vec::new(),
        }
    }

    fn get<H: Handler<T, AppState>, T: 'static>(mut self, path: &'static str, h: H) -> Routes {
        self.router = self.router.route(path, axum::routing::get(h));
        self.list.push(("GET", path));
        self
    }

    fn post<H: Handler<T, AppState>, T: 'static>(mut self, path: &'static str, h: H) -> Routes {
        self.router = self.router.route(path, axum::routing::post(h));
        self.list.push(("POST", path));
        self
    }

    fn put<H: Handler<T, AppState>, T: 'static>(mut self, path: &'static str, h: H) -> Routes {
        self.router = self.router.route(path, axum::routing::put(h));
        self.list.push(("PUT", path));
        self
    }

    fn delete<H: Handler<T, AppState>, T: 'static>(mut self, path: &'static str, h: H) -> Routes {
        self.router = self.router.route(path, axum::routing::delete(h));
        self.list.push(("DELETE", path));
        self
    }

    fn merge(mut self, other: Routes) -> Routes {
        self.router = self.router.merge(other.router);
        self.list.extend(other.list);
        self
    }
}

/// Every route of the server.
pub fn routes() -> Routes {
    let api = Routes::new()
        .post("/api/query", api::submit)
        .get("/api/query/{id}/status", api::status)
        .post("/api/query/{id}/continue", operate::act::<operate::Continue>)
        .post("/api/query/{id}/reply", reply::reply)
        .get("/api/users/{id}/memory", users::memory)
        .get("/api/users/{id}/memory/search", users::memory_search)
        .put("/api/users/{id}/memory/{record}", users::replace_summary)
        .delete("/api/users/{id}/memory/{record}", users::delete_record)
        .delete("/api/users/{id}/turns/{turn}", users::delete_turn)
        .delete("/api/users/{id}", users::forget)
        .get("/api/users/{id}/export", users::export)
        .post("/api/query/{id}/cancel", operate::act::<operate::Cancel>)
        .post("/api/query/{id}/retry", operate::act::<operate::Retry>)
        .post("/api/query/{id}/review", operate::review)
        .get("/api/query/{id}/events", api::events)
        .get("/api/ws", api::ws)
        .post("/v1/chat/completions", openai::chat)
        .get("/v1/models", openai::models);
    let api = Routes {
        router: api.router.route_layer(middleware::from_fn(auth)),
        list: api.list,
    };
    Routes::new()
        .get("/healthz", ops::healthz)
        .get("/readyz", ops::readyz)
        .get("/metrics", ops::metrics)
        .get("/openapi.json", ops::openapi)
        .merge(api)
}

/// The application with its middleware and state, and the routes of the
/// doors built beside this module (`doors`: the MCP server's `/mcp`),
/// served behind the same authentication and middleware as the `/api`
/// routes and the browser `Origin` check of a stream
/// ([`local_guard::browser_origin`]).
pub fn app(state: AppState, doors: Router<AppState>) -> Router {
    let doors = doors
        .route_layer(middleware::from_fn(local_guard::origin_layer))
        .route_layer(middleware::from_fn(auth));
    routes()
        .router
        .merge(doors)
        .merge(console::router())
        .fallback(|| async { AppError::new(Kind::NotFound, Code::NoRoute, "no such route") })
        .layer(middleware::from_fn(input::json_errors))
        .layer(middleware::from_fn(local_guard::layer))
        .layer(DefaultBodyLimit::max(state.cfg.http.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(middleware::from_fn_with_state(state.clone(), hsts))
        .layer(middleware::from_fn(openai::reshape))
        .layer(Extension(state.clone()))
        .with_state(state)
}

/// True when the server speaks HTTPS (`http.tls_cert` and `http.tls_key`):
/// responses carry `Strict-Transport-Security` and the console's cookie is
/// `Secure`.
pub fn serves_tls(cfg: &Config) -> bool {
    cfg.http.serves_tls()
}

/// `Strict-Transport-Security` on every response when served over HTTPS.
async fn hsts(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    if serves_tls(&app.cfg) {
        resp.headers_mut().insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
    }
    resp
}

/// The peer address of a request (none when it did not come through
/// [`serve`], as in tests that call the router directly).
pub fn peer_ip(req: &Request) -> Option<std::net::IpAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| a.ip())
}

/// Bearer authentication of the `/api` routes: the caller's tenant and
/// scope ([`tenancy`]), checked against what the route needs.
async fn auth(Extension(app): Extension<AppState>, headers: HeaderMap, mut req: Request, next: Next) -> Response {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    let (caller, principal) = match given {
        // Loopback-only mode (`local_guard` has checked Host and Origin).
        None if !app.has_configured_tokens() => (Caller::ANONYMOUS, Principal::default_admin("local")),
        None => return AppError::unauthorized("missing Authorization: Bearer token").into_response(),
        Some(given) => match authenticate(&app, given, peer_ip(&req)).await {
            Ok(found) => found,
            Err(refused) => return refused.into_response(),
        },
    };
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
    if let Some(route) = route
        && let Err(refused) = principal.require(tenancy::need_of_route(req.method(), &route))
    {
        return refused.into_response();
    }
    req.extensions_mut().insert(caller);
    req.extensions_mut().insert(principal);
    next.run(req).await
}

/// The caller and principal of bearer token `given` ([`App::authenticate`]).
/// A peer past its failed attempts is refused (429) before any lookup,
/// unless the token is a known right one.
async fn authenticate(
    app: &AppState,
    given: &str,
    peer: Option<std::net::IpAddr>,
) -> Result<(Caller, Principal), AppError> {
    let caller = Caller::of_token(given);
    if !app.known(caller) {
        app.auth_failures.check(peer)?;
    }
    match app.app.authenticate(caller).await? {
        Some(principal) => Ok((caller, principal)),
        None => {
            app.auth_failures.failed(peer);
            Err(AppError::unauthorized("wrong or revoked bearer token"))
        }
    }
}

/// The request timeout and the per-route HTTP metrics.
async fn observe(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let mut limit = app.cfg.http.request_timeout();
    if route == "/api/query/{id}/status" || route == "/v1/chat/completions" {
        limit += app.cfg.http.max_wait();
    }
    let started = Instant::now();
    let resp = match tokio::time::timeout(limit, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => {
            tracing::warn!(route, timeout_secs = limit.as_secs(), "http: request timed out");
            AppError::unavailable(Code::Timeout, format!("no response within {} s", limit.as_secs())).into_response()
        }
    };
    crate::metrics::http_request(&route, resp.status().as_u16(), started.elapsed().as_secs_f64());
    resp
}

/// A bound listener, before the engine exists.
pub struct Bound {
    listener: TcpListener,
    pub addr: SocketAddr,
    /// HTTPS when `http.tls_cert` and `http.tls_key` are set.
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Bound {
    /// The server's base URL: `http://` or `https://` and the bound
    /// address.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }
}

/// The TLS acceptor of `http.tls_cert` and `http.tls_key` (both or
/// neither), read before anything is bound.
fn tls_acceptor(cfg: &Config) -> Result<Option<tokio_rustls::TlsAcceptor>, HttpError> {
    match (&cfg.http.tls_cert, &cfg.http.tls_key) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => serve::acceptor(cert, key).map(Some).map_err(HttpError::Tls),
        (Some(_), None) => Err(HttpError::Tls("http.tls_cert is set without http.tls_key".into())),
        (None, Some(_)) => Err(HttpError::Tls("http.tls_key is set without http.tls_cert".into())),
    }
}

/// Resolves and binds `http_addr`. Without `api_tokens` every resolved
/// address must be loopback; this is checked before binding, as the TLS
/// certificate and key are read.
pub async fn bind(cfg: &Config) -> Result<Bound, HttpError> {
    let tls = tls_acceptor(cfg)?;
    let addrs: Vec<SocketAddr> = match HttpAddr::parse(&cfg.http_addr) {
        Ok(HttpAddr::Socket(a)) => vec![a],
        Ok(HttpAddr::Host(host, port)) => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|source| HttpError::Resolve {
                addr: cfg.http_addr.clone(),
                source,
            })?
            .collect(),
        Err(problem) => return Err(HttpError::Exposed(problem)),
    };
    if cfg.api_tokens.is_empty() && addrs.iter().any(|a| !is_loopback(a.ip())) {
        return Err(HttpError::Exposed(exposed_without_tokens(&cfg.http_addr)));
    }
    let mut last = None;
    for a in &addrs {
        match TcpListener::bind(a).await {
            Ok(listener) => {
                let addr = listener.local_addr().unwrap_or(*a);
                return Ok(Bound { listener, addr, tls });
            }
            Err(e) => last = Some(e),
        }
    }
    Err(HttpError::Bind {
        addr: cfg.http_addr.clone(),
        source: last.unwrap_or_else(|| std::io::Error::other("the name resolved to no address")),
    })
}

/// The running server and its helpers.
pub struct Server {
    server: JoinHandle<()>,
    metrics: PrometheusHandle,
}

/// The server's state over `app`: installs the metrics recorder.
pub fn state(app: App, stats: Arc<Stats>) -> Result<AppState, HttpError> {
    let handle = crate::metrics::install()?;
    crate::metrics::register_llm_provider(&app.cfg.llm_provider);
    crate::metrics::register_http();
    let auth_failures = limits::AuthFailures::new(app.cfg.http.max_auth_failures_per_minute);
    let models = openai::offered(&app.cfg);
    Ok(AppState(Arc::new(Inner {
        app,
        stats,
        metrics: handle,
        auth_failures,
        models,
    })))
}

/// Starts serving `state` on `bound`, with the routes of `doors` (the MCP
/// server) beside the `/api` routes.
pub fn start(bound: Bound, state: AppState, doors: Router<AppState>) -> Server {
    let cfg = state.cfg.clone();
    let shutdown = state.shutdown.clone();
    let handle = state.metrics.clone();
    let router = app(state, doors);
    let opts = serve::Options {
        header_read_timeout: cfg.http.header_read_timeout(),
        send_timeout: cfg.http.stream_send_timeout(),
        tls: bound.tls,
    };
    tracing::info!(
        addr = %bound.addr,
        auth = !cfg.api_tokens.is_empty(),
        tls = opts.tls.is_some(),
        "http: listening"
    );
    let server = tokio::spawn(async move {
        serve::serve(bound.listener, router, opts, shutdown).await;
    });
    Server {
        server,
        metrics: handle,
    }
}

impl Server {
    /// The metrics exporter's handle (for [`housekeeping::MetricsRefresh`]).
    pub fn metrics(&self) -> PrometheusHandle {
        self.metrics.clone()
    }

    /// Waits for the server to drain (it started on the shutdown token),
    /// at most `grace`; then drops what is left.
    pub async fn stop(self, grace: Duration) {
        let Server { mut server, .. } = self;
        if tokio::time::timeout(grace, &mut server).await.is_err() {
            tracing::warn!("http: connections still open after the grace period; closing them");
            server.abort();
        }
        tracing::info!("http: stopped");
    }
}
