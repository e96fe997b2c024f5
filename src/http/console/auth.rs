//! Who may use the console, and the CSRF token of every action.
//!
//! Guarantees:
//! - With `api_tokens`, a page needs the session cookie `maas_console`:
//!   `EXPIRY.MAC` where MAC is HMAC-SHA256 over the expiry, keyed by the
//!   SHA-256 of one configured token. It is set only by a POST of that
//!   token to `/console/login`, HttpOnly, SameSite=Strict, path
//!   `/console`, for [`SESSION`]; removing the token from the
//!   configuration ends its sessions. Nothing is stored on the server.
//! - Without tokens (the server binds only loopback then) the console is
//!   open, as the API is.
//! - Every POST other than the login carries `csrf`, an HMAC of the
//!   session under the same key (a per-process random key without
//!   tokens); a missing or wrong one is refused with 403 before anything
//!   runs.
//! - `http.console_read_only` hides the action buttons and refuses every
//!   action with 403.

use std::sync::OnceLock;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Form, Request};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{Fail, fail, render};
use crate::http::AppState;

/// How long a session lasts.
pub const SESSION: Duration = Duration::from_secs(12 * 3600);
const COOKIE: &str = "maas_console";

/// What the guard found, for the handlers.
#[derive(Clone, Debug)]
pub struct Session {
    /// The CSRF token every action form must carry.
    pub csrf: String,
    pub read_only: bool,
}

fn process_key() -> &'static [u8; 32] {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    KEY.get_or_init(rand::random)
}

fn mac(key: &[u8], msg: &str) -> String {
    // HMAC accepts a key of any length; the error case cannot occur.
    let Ok(mut m) = Hmac::<Sha256>::new_from_slice(key) else {
        return String::new();
    };
    m.update(msg.as_bytes());
    hex(&m.finalize().into_bytes())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Constant-time string equality.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_owned())
}

/// The key of a valid session cookie, if it is one.
fn verify(app: &AppState, value: &str) -> Option<[u8; 32]> {
    let (expiry, given) = value.split_once('.')?;
    let exp: u64 = expiry.parse().ok()?;
    if exp <= now_secs() {
        return None;
    }
    // Check every token in full, so timing tells nothing.
    let mut found = None;
    for key in &app.tokens {
        if same(&mac(key, &format!("session:{expiry}")), given) {
            found = Some(*key);
        }
    }
    found
}

/// Lets a request through with its [`Session`], or sends it to the login.
pub async fn guard(Extension(app): Extension<AppState>, mut req: Request, next: Next) -> Response {
    let read_only = app.cfg.http.console_read_only;
    let session = if app.tokens.is_empty() {
        Some(Session {
            csrf: mac(process_key(), "csrf:open"),
            read_only,
        })
    } else {
        cookie_value(req.headers()).and_then(|v| {
            verify(&app, &v).map(|key| Session {
                csrf: mac(&key, &format!("csrf:{v}")),
                read_only,
            })
        })
    };
    let Some(session) = session else {
        if req.method() == Method::GET {
            return Redirect::to("/console/login").into_response();
        }
        return fail(
            StatusCode::UNAUTHORIZED,
            "console: no session; log in at /console/login",
        )
        .into_response();
    };
    req.extensions_mut().insert(session);
    next.run(req).await
}

/// Checks an action's CSRF token and the read-only mode; `Err` is the refusal.
pub fn check_action(s: &Session, given: &str) -> Result<(), Fail> {
    if s.read_only {
        return Err(fail(
            StatusCode::FORBIDDEN,
            "console: read-only mode (http.console_read_only): actions are refused",
        ));
    }
    if !same(&s.csrf, given) {
        return Err(fail(StatusCode::FORBIDDEN, "console: missing or wrong csrf token"));
    }
    Ok(())
}

/// The login page's context: no session, no live stream.
fn login_ctx(error: &str) -> minijinja::Value {
    minijinja::context! {
        error,
        session => minijinja::context! { csrf => "", read_only => false, auth => false, login => true },
    }
}

/// `GET /console/login`.
pub async fn login_page() -> Response {
    render("login.html", login_ctx(""))
}

#[derive(Deserialize)]
pub struct LoginForm {
    token: String,
}

/// `POST /console/login`: a configured token → the session cookie.
pub async fn login(Extension(app): Extension<AppState>, Form(f): Form<LoginForm>) -> Response {
    if app.tokens.is_empty() {
        return Redirect::to("/console").into_response();
    }
    let digest: [u8; 32] = Sha256::digest(f.token.trim().as_bytes()).into();
    let mut ok = false;
    for t in &app.tokens {
        ok |= same(&hex(t), &hex(&digest));
    }
    if !ok {
        let mut resp = render("login.html", login_ctx("wrong token"));
        *resp.status_mut() = StatusCode::UNAUTHORIZED;
        return resp;
    }
    let expiry = now_secs() + SESSION.as_secs();
    let value = format!("{expiry}.{}", mac(&digest, &format!("session:{expiry}")));
    let cookie = format!(
        "{COOKIE}={value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION.as_secs()
    );
    ([(header::SET_COOKIE, cookie)], Redirect::to("/console")).into_response()
}

#[derive(Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /console/logout`: drops the cookie.
pub async fn logout(Extension(s): Extension<Session>, Form(f): Form<CsrfForm>) -> Response {
    if !same(&s.csrf, &f.csrf) {
        return fail(StatusCode::FORBIDDEN, "console: missing or wrong csrf token").into_response();
    }
    let cookie = format!("{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/console/login")).into_response()
}
