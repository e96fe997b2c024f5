//! The operator console: server-rendered pages under `/console`, served by
//! `maasd` itself, with no build step at install time.
//!
//! Guarantees:
//! - Pages are Jinja templates ([`minijinja`]) and one vendored,
//!   version-pinned htmx (`assets/htmx-2.0.11.min.js`, licence beside it),
//!   all embedded in the binary; output is HTML-escaped.
//! - Live parts ride the daemon's one LISTEN session: `/console/events` is
//!   an SSE stream of the [`Notifier`](crate::listener::Notifier)'s
//!   broadcast, coalesced to at most one `change` event per
//!   [`COALESCE`]; the page then fetches its fragments again (htmx). A
//!   lagging stream is told to refresh; nothing is polled. It counts under
//!   `http.max_streams` and `http.max_streams_per_token`, has the
//!   connection's send timeout, and ends once its token is revoked.
//!   A running request's page also follows its answer as the model writes
//!   it (`/console/requests/{id}/answer`, the API's SSE frames of
//!   [`live::Stream`], capped and ended the same way).
//! - Reads go through [`crate::repo`], actions through [`crate::control`],
//!   so an action is recorded in `operator_actions` exactly as `maasctl`
//!   records it.
//! - Access ([`auth`]): with `api_tokens`, a token given in the login form
//!   becomes an HttpOnly, SameSite=Strict session cookie signed with a
//!   server secret; without tokens (the server then binds only loopback,
//!   behind `http::local_guard`) the console is open. Every action is a
//!   same-origin POST carrying a CSRF token derived from the session's
//!   random id. A session of a tenant's token sees only that tenant.

pub mod auth;
pub mod charts;
pub mod memory;
pub mod pages;
pub mod prompts;
pub mod review;

use std::convert::Infallible;
use std::sync::OnceLock;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use futures_util::StreamExt;
use minijinja::Environment;
use tokio::sync::broadcast::error::RecvError;
use uuid::Uuid;

use super::AppState;
use super::live;
use crate::app::follow::{Access, Follower, Frame, Target};

/// Longest time between a notification and the `change` event it causes;
/// notifications within it become one event.
pub const COALESCE: Duration = Duration::from_millis(250);

/// The vendored htmx, pinned (see `assets/htmx-LICENSE`).
const HTMX: &str = include_str!("assets/htmx-2.0.11.min.js");
const HTMX_PATH: &str = "/console/assets/htmx-2.0.11.min.js";

const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("login.html", include_str!("templates/login.html")),
    ("overview.html", include_str!("templates/overview.html")),
    ("overview_body.html", include_str!("templates/overview_body.html")),
    ("requests.html", include_str!("templates/requests.html")),
    ("request_rows.html", include_str!("templates/request_rows.html")),
    ("request.html", include_str!("templates/request.html")),
    ("request_body.html", include_str!("templates/request_body.html")),
    ("user.html", include_str!("templates/user.html")),
    ("prompts.html", include_str!("templates/prompts.html")),
];

/// The templates, parsed once.
fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::Html);
        env.add_global("htmx_path", HTMX_PATH);
        for (name, text) in TEMPLATES {
            if let Err(e) = env.add_template(name, text) {
                tracing::error!(template = name, error = %e, "console: a template does not parse");
            }
        }
        env
    })
}

/// Renders `name` with `ctx`; a template error is a 500 naming it.
pub fn render(name: &str, ctx: minijinja::Value) -> Response {
    match env().get_template(name).and_then(|t| t.render(ctx)) {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!(template = name, error = %e, "console: cannot render");
            fail(StatusCode::INTERNAL_SERVER_ERROR, &format!("template {name}: {e}")).into_response()
        }
    }
}

/// A refusal or failure a person reads: its status and what happened.
#[derive(Debug)]
pub struct Fail(StatusCode, String);

impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        (self.0, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], self.1).into_response()
    }
}

/// A plain-text failure a person reads.
pub fn fail(code: StatusCode, what: &str) -> Fail {
    Fail(code, what.to_owned())
}

/// The console's routes (not part of the JSON API, so not in OpenAPI).
pub fn router() -> Router<AppState> {
    let guarded = Router::new()
        .route("/console", get(pages::overview))
        .route("/console/overview", get(pages::overview_body))
        .route("/console/events", get(events))
        .route("/console/requests", get(pages::requests))
        .route("/console/requests/rows", get(pages::request_rows))
        .route("/console/requests/{id}", get(pages::request))
        .route("/console/requests/{id}/body", get(pages::request_body))
        .route("/console/requests/{id}/answer", get(answer))
        .route("/console/requests/{id}/review", post(review::review))
        .route("/console/requests/{id}/{action}", post(pages::act))
        .route("/console/users/{id}", get(memory::user))
        .route("/console/users/{id}/archive", post(memory::archive))
        .route("/console/prompts", get(prompts::page))
        .route("/console/prompts/{role}/{version}/activate", post(prompts::activate))
        .route("/console/logout", post(auth::logout))
        .route_layer(middleware::from_fn(auth::guard));
    Router::new()
        .route("/console/login", get(auth::login_page).post(auth::login))
        .route(HTMX_PATH, get(htmx))
        .merge(guarded)
        .route_layer(middleware::from_fn(auth::same_origin_posts))
}

async fn htmx() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
        ],
        HTMX,
    )
        .into_response()
}

/// `GET /console/events`: a `change` event whenever requests changed
/// (coalesced), `refresh` when notifications may have been lost; capped
/// like the API's streams, and ended with a `revoked` event once the
/// session's token is revoked (`crate::app::follow::Access`). A session limited to
/// a tenant hears only of its tenant's requests.
async fn events(State(app): State<AppState>, Extension(s): Extension<auth::Session>) -> Result<Response, Fail> {
    let place = app
        .streams
        .enter(s.caller)
        .map_err(|e| Fail(super::error::status(e.kind), format!("console: {}", e.message)))?;
    let access = Access::watch(&app.app, s.caller);
    let revoked = access.token();
    let rx = app.notifier.subscribe();
    let tenant = s.tenant();
    let pool = app.pool.clone();
    let stream = futures_util::stream::unfold(rx, move |mut rx| {
        let pool = pool.clone();
        async move {
            loop {
                let (ids, lagged) = next_batch(&mut rx).await?;
                if lagged || of_tenant(&pool, tenant, &ids).await {
                    let ev = SseEvent::default()
                        .event(if lagged { "refresh" } else { "change" })
                        .data("{}");
                    return Some((Ok::<_, Infallible>(ev), rx));
                }
            }
        }
    })
    .take_until(revoked.clone().cancelled_owned())
    .chain(futures_util::stream::iter(
        std::iter::from_fn(move || revoked.is_cancelled().then(|| Ok(live::revoked_event()))).take(1),
    ))
    .take_until(app.shutdown.clone().cancelled_owned())
    .map(move |ev| {
        // The place and the watch live as long as the stream.
        let _held = (&place, &access);
        ev
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(app.cfg.http.stream_keepalive()))
        .into_response())
}

/// `GET /console/requests/{id}/answer`: the request's state and the pieces
/// of its answer as the model writes them (those written before first), as
/// the API's `/api/query/{id}/events` sends them; ends after the terminal
/// state. A session limited to a tenant sees only its tenant's requests.
async fn answer(
    State(app): State<AppState>,
    Extension(s): Extension<auth::Session>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Response, Fail> {
    let id = pages::id_of(&id, "request")?;
    let place = app
        .streams
        .enter(s.caller)
        .map_err(|e| Fail(super::error::status(e.kind), format!("console: {}", e.message)))?;
    let sub = app.hub.subscribe_streaming(Target::Request(id), ANSWER_QUEUE);
    let mut follower = Follower::new(app.pool.clone(), sub).with_deltas(None);
    if let Some(tenant) = s.tenant() {
        follower = follower.for_tenant(tenant);
    }
    let states = follower
        .current()
        .await
        .map_err(|e| fail(StatusCode::SERVICE_UNAVAILABLE, &format!("console: {e}")))?;
    if states.is_empty() {
        return Err(fail(StatusCode::NOT_FOUND, &format!("console: no request {id}")));
    }
    let mut first: Vec<Frame> = states.into_iter().map(Frame::State).collect();
    first.extend(follower.catch_up().await);
    Ok(live::Stream::new(&app, s.caller, follower, first, "sse", place).sse())
}

/// Queue of a request page's answer stream.
const ANSWER_QUEUE: usize = 128;

/// The requests of the next notifications, coalesced over [`COALESCE`],
/// and whether some were lost; `None` when the broadcast closed.
async fn next_batch(rx: &mut tokio::sync::broadcast::Receiver<crate::listener::Event>) -> Option<(Vec<Uuid>, bool)> {
    let mut ids = Vec::new();
    let mut lagged = false;
    match rx.recv().await {
        Err(RecvError::Closed) => return None,
        Err(RecvError::Lagged(_)) => lagged = true,
        Ok(e) => ids.push(e.id),
    }
    tokio::time::sleep(COALESCE).await;
    loop {
        match rx.try_recv() {
            Ok(e) => ids.push(e.id),
            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => lagged = true,
            Err(_) => break,
        }
    }
    Some((ids, lagged))
}

/// Whether any of `ids` is a request of `tenant` (every one is, for an
/// operator's session: `None`). A database error counts as a change, so
/// the page fetches again and shows the error itself.
async fn of_tenant(pool: &crate::db::Pool, tenant: Option<Uuid>, ids: &[Uuid]) -> bool {
    let Some(tenant) = tenant else {
        return true;
    };
    match pool.get().await {
        Ok(c) => crate::repo::tenants::any_request_of(&c, tenant, ids)
            .await
            .unwrap_or(true),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_template_parses() {
        let mut env = minijinja::Environment::new();
        for (name, text) in super::TEMPLATES {
            if let Err(e) = env.add_template(name, text) {
                panic!("{name}: {e}");
            }
        }
    }
}
