//! Who may use the console, and the CSRF token of every action.
//!
//! Guarantees:
//! - With `api_tokens`, a page needs the session cookie `maas_console`:
//!   `EXPIRY.MAC` where MAC is HMAC-SHA256 over the expiry, keyed by the
//!   SHA-256 of one configured token; or, for a token of the database
//!   (`maasctl tokens`), `EXPIRY.tID.MAC` keyed by that token's SHA-256
//!   over the expiry and the token's id. It is set only by a POST of the
//!   token to `/console/login`, HttpOnly, SameSite=Strict, path
//!   `/console`, for [`SESSION`]; removing the token from the
//!   configuration, or revoking it (within the token cache period,
//!   `http::tenancy::TOKEN_TTL`), ends its sessions. Nothing is stored on
//!   the server.
//! - Scopes (the same tokens as the API): a configured token is `admin`;
//!   a database token needs `read` to view and `operate` or `admin` to act
//!   (a `read` session is read-only, as `http.console_read_only` makes
//!   every session). The console shows every request, so only tokens of
//!   the default tenant log in; another tenant's token, or a `submit`
//!   one, is refused with 403.
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
use crate::http::limits::Caller;
use crate::http::tenancy::{Need, Principal, Scope};

/// How long a session lasts.
pub const SESSION: Duration = Duration::from_secs(12 * 3600);
const COOKIE: &str = "maas_console";

/// What the guard found, for the handlers.
#[derive(Clone, Debug)]
pub struct Session {
    /// The CSRF token every action form must carry.
    pub csrf: String,
    /// No action is allowed: `http.console_read_only`, or a token whose
    /// scope is `read`.
    pub read_only: bool,
    /// The token's scope is `admin` (a configured token, or no tokens).
    pub admin: bool,
    /// Whose places the session's streams take (the token's SHA-256).
    pub caller: Caller,
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

/// The key of a valid session cookie and its token's scope, if it is one.
async fn verify(app: &AppState, value: &str) -> Option<([u8; 32], Scope)> {
    let mut parts = value.split('.');
    let (expiry, second, third) = (parts.next()?, parts.next()?, parts.next());
    let exp: u64 = expiry.parse().ok()?;
    if exp <= now_secs() || parts.next().is_some() {
        return None;
    }
    if let Some(given) = third {
        // A database token's session: `EXPIRY.tID.MAC`.
        let id: i64 = second.strip_prefix('t')?.parse().ok()?;
        let (key, who) = app.db_tokens.by_id(&app.pool, id).await.ok()??;
        if !console_may(&who) || !same(&mac(&key, &format!("session:{expiry}:t{id}")), given) {
            return None;
        }
        return Some((key, who.scope));
    }
    // Check every configured token in full, so timing tells nothing.
    let mut found = None;
    for key in &app.tokens {
        if same(&mac(key, &format!("session:{expiry}")), second) {
            found = Some((*key, Scope::Admin));
        }
    }
    found
}

/// Whether a database token may use the console at all: the default
/// tenant's, with scope `read` or more.
fn console_may(who: &Principal) -> bool {
    who.is_default() && who.scope.allows(Need::ReadUser)
}

/// Lets a request through with its [`Session`], or sends it to the login.
pub async fn guard(Extension(app): Extension<AppState>, mut req: Request, next: Next) -> Response {
    let read_only = app.cfg.http.console_read_only;
    let session = if app.tokens.is_empty() {
        Some(Session {
            csrf: mac(process_key(), "csrf:open"),
            read_only,
            admin: true,
            caller: Caller::ANONYMOUS,
        })
    } else {
        match cookie_value(req.headers()) {
            None => None,
            Some(v) => verify(&app, &v).await.map(|(key, scope)| Session {
                csrf: mac(&key, &format!("csrf:{v}")),
                read_only: read_only || !scope.allows(Need::Operate),
                admin: scope == Scope::Admin,
                caller: Caller(key),
            }),
        }
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
            "console: read-only session (http.console_read_only, or a token of scope read; actions need scope operate): actions are refused",
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

/// `POST /console/login`: a configured token, or a database token of the
/// default tenant with scope `read` or more → the session cookie.
pub async fn login(Extension(app): Extension<AppState>, Form(f): Form<LoginForm>) -> Response {
    if app.tokens.is_empty() {
        return Redirect::to("/console").into_response();
    }
    let digest: [u8; 32] = Sha256::digest(f.token.trim().as_bytes()).into();
    let mut ok = false;
    for t in &app.tokens {
        ok |= same(&hex(t), &hex(&digest));
    }
    let expiry = now_secs() + SESSION.as_secs();
    let value = if ok {
        format!("{expiry}.{}", mac(&digest, &format!("session:{expiry}")))
    } else {
        let who = match app.db_tokens.lookup(&app.pool, digest).await {
            Ok(who) => who,
            Err(e) => return fail(StatusCode::SERVICE_UNAVAILABLE, &format!("console: {}", e.message)).into_response(),
        };
        let Some(who) = who else {
            let mut resp = render("login.html", login_ctx("wrong token"));
            *resp.status_mut() = StatusCode::UNAUTHORIZED;
            return resp;
        };
        let Some(id) = who.token_id.filter(|_| console_may(&who)) else {
            let why = if who.is_default() {
                format!(
                    "token `{}` has scope {}; the console needs scope read, operate or admin",
                    who.token,
                    who.scope.as_str()
                )
            } else {
                format!(
                    "token `{}` is of tenant `{}`; the console shows every tenant's requests, so only the default tenant's tokens log in",
                    who.token, who.tenant_name
                )
            };
            return fail(StatusCode::FORBIDDEN, &format!("console: {why}")).into_response();
        };
        format!("{expiry}.t{id}.{}", mac(&digest, &format!("session:{expiry}:t{id}")))
    };
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
