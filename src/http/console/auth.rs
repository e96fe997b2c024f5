//! Who may use the console, what each session sees, and the CSRF token of
//! every action.
//!
//! Guarantees:
//! - With `api_tokens`, a page needs the session cookie `maas_console`:
//!   `SID.WHO.EXPIRY.MAC`. SID is the session's random id (a row of
//!   `console_sessions`), WHO is `tID` for a database token or `c` for a
//!   configured one, and MAC is HMAC-SHA256 over SID, WHO, the expiry and
//!   the token's SHA-256, keyed by the server secret (`server_key`:
//!   `http.session_secret`, else derived from the configured `api_tokens`).
//!   Neither is in the database, so reading `api_tokens`,
//!   `console_sessions`, a backup or a replica opens no session. The
//!   cookie is set only by a POST of the token to `/console/login`,
//!   HttpOnly, SameSite=Strict, path `/console`, `Secure` when served over
//!   HTTPS, for [`SESSION`].
//! - A session ends on every daemon at once when its owner logs out (the
//!   row's `ended_at`), and within the token cache period
//!   (`app::caller::TOKEN_TTL`) when its token is revoked (or removed
//!   from the configuration, or the secret changes).
//! - Scopes (the same tokens as the API): a database token needs `read` to
//!   log in and view, `operate` to act and `admin` to activate a prompt; a
//!   configured token is `admin`. An operator token (`tokens create --all-tenants`; and a
//!   configured token) sees every tenant and the engine's overview and
//!   prompts; any other session sees only its token's tenant: its
//!   requests, its users' memory pages (by the ids the tenant uses), and
//!   live events of its requests ([`Session::tenant`]).
//! - Every action is recorded with the token's name as actor (`config`
//!   for a configured token, `local` without tokens), never a name the
//!   client chose.
//! - Without tokens (the server binds only loopback then, behind
//!   `http::local_guard`) the console is open, as the API is.
//! - Every POST must carry an `Origin` naming this server
//!   ([`same_origin_posts`]); every POST other than the login carries
//!   `csrf`, an HMAC of the session's random id (of a random per-browser
//!   cookie without tokens); a missing or wrong one is refused with 403
//!   before anything runs.
//! - `http.console_read_only` hides the action buttons and refuses every
//!   action with 403.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use axum::Extension;
use axum::extract::{ConnectInfo, Form, Request};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::{Fail, fail, render};
use crate::app::{Caller, Need, Principal};
use crate::http::AppState;
use crate::model::Scope;
use crate::repo::tenants;

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
    /// The token behind the session: its tenant, name and operator flag.
    pub who: Principal,
    /// The session's row (`None` without tokens).
    id: Option<Uuid>,
    /// Whose places the session's streams take, and whose revocation ends
    /// them (the token's SHA-256; all zeros without tokens).
    pub caller: Caller,
}

impl Session {
    /// The tenant this session is limited to; `None` for an operator's,
    /// which sees every tenant.
    pub fn tenant(&self) -> Option<Uuid> {
        (!self.who.operator).then_some(self.who.tenant)
    }

    /// The actor of this session's actions in `operator_actions`: the
    /// token's name.
    pub fn actor(&self) -> &str {
        &self.who.token
    }

    /// 403 unless this is an operator's session (pages about the whole
    /// engine: the overview, its charts, the prompts).
    pub fn require_operator(&self, what: &str) -> Result<(), Fail> {
        if self.who.operator {
            return Ok(());
        }
        Err(fail(
            StatusCode::FORBIDDEN,
            &format!(
                "console: {what} shows every tenant; token `{}` sees only tenant `{}` (an operator token, `maasctl tokens create … --all-tenants`, sees everything)",
                self.who.token, self.who.tenant_name
            ),
        ))
    }
}

/// Whether the console is served over HTTPS (`http.tls_cert` and
/// `http.tls_key`), so its cookies are `Secure`.
fn served_over_tls(app: &AppState) -> bool {
    crate::http::serves_tls(&app.cfg)
}

/// The attributes of every console cookie.
fn cookie_attrs(app: &AppState, max_age: u64) -> String {
    let secure = if served_over_tls(app) { "; Secure" } else { "" };
    format!("Path=/console; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}")
}

fn process_key() -> &'static [u8; 32] {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    KEY.get_or_init(rand::random)
}

/// The key session cookies and CSRF tokens are signed with:
/// `http.session_secret`, else one derived from the configured
/// `api_tokens` (the same on every daemon of one configuration, and never
/// in the database).
fn server_key(app: &AppState) -> [u8; 32] {
    let secret = &app.cfg.http.session_secret;
    let mut h = Sha256::new();
    if secret.is_empty() {
        h.update(b"maas-console-session-from-tokens\n");
        for t in &app.cfg.api_tokens {
            h.update(Sha256::digest(t.expose().as_bytes()));
        }
    } else {
        h.update(b"maas-console-session-secret\n");
        h.update(secret.expose().as_bytes());
    }
    h.finalize().into()
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

/// What a session's MAC covers.
fn session_msg(sid: &Uuid, who: &str, expiry: u64, token_sha256: &[u8; 32]) -> String {
    format!("session:{}:{who}:{expiry}:{}", sid.simple(), hex(token_sha256))
}

fn unavailable(e: impl std::fmt::Display) -> Fail {
    fail(StatusCode::SERVICE_UNAVAILABLE, &format!("console: {e}"))
}

/// The session of a cookie: its id and token, if the MAC holds, it has not
/// expired, the token is live and may use the console, and no logout ended it.
async fn verify(app: &AppState, value: &str) -> Result<Option<(Uuid, Principal, Caller)>, Fail> {
    let parts: Vec<&str> = value.split('.').collect();
    let [sid, who, expiry, given] = parts[..] else {
        return Ok(None);
    };
    let (Ok(sid), Ok(exp)) = (sid.parse::<Uuid>(), expiry.parse::<u64>()) else {
        return Ok(None);
    };
    if exp <= now_secs() {
        return Ok(None);
    }
    let key = server_key(app);
    let found = if who == "c" {
        // Check every configured token in full, so timing tells nothing.
        let mut found = None;
        for t in &app.tokens {
            if same(&mac(&key, &session_msg(&sid, who, exp, t)), given) {
                found = Some((Principal::default_admin("config"), Caller(*t)));
            }
        }
        found
    } else {
        let Some(id) = who.strip_prefix('t').and_then(|n| n.parse::<i64>().ok()) else {
            return Ok(None);
        };
        match app
            .db_tokens
            .by_id(&app.pool, id)
            .await
            .map_err(|e| unavailable(e.message))?
        {
            Some((hash, p)) if console_may(&p) && same(&mac(&key, &session_msg(&sid, who, exp, &hash)), given) => {
                Some((p, Caller(hash)))
            }
            _ => None,
        }
    };
    let Some((p, caller)) = found else {
        return Ok(None);
    };
    let c = app.pool.get().await.map_err(unavailable)?;
    let live = tenants::session_live(&c, sid, p.token_id).await.map_err(unavailable)?;
    Ok(live.then_some((sid, p, caller)))
}

/// Whether a database token may use the console at all: scope `read` or
/// more (of any tenant; a tenant's token sees its tenant), and a token of
/// every user: the console lists all of its tenant's users, so a token
/// bound to one user (`maasctl tokens create … --user`) is refused.
fn console_may(who: &Principal) -> bool {
    console_refusal(who).is_none()
}

/// Why a database token may not use the console, in words; `None` when it
/// may.
fn console_refusal(who: &Principal) -> Option<String> {
    if !who.scope.allows(Need::ReadUser) {
        return Some(format!(
            "console: token `{}` has scope {}; the console needs scope read, operate or admin",
            who.token,
            who.scope.as_str()
        ));
    }
    if who.user.is_some() {
        return Some(format!(
            "console: token `{}` is bound to one user; the console shows every user of its tenant \
             and needs a token of every user (maasctl tokens create without --user)",
            who.token
        ));
    }
    None
}

/// The session of a request without tokens: open, bound to a random
/// per-browser cookie (made now when missing, then `Some` to set).
fn open_session(app: &AppState, headers: &HeaderMap) -> (Session, Option<String>) {
    let given = cookie_value(headers).filter(|v| v.len() == 32 && v.bytes().all(|b| b.is_ascii_hexdigit()));
    let (nonce, new) = match given {
        Some(v) => (v, None),
        None => {
            let v = hex(&rand::random::<[u8; 16]>());
            (v.clone(), Some(v))
        }
    };
    let s = Session {
        csrf: mac(process_key(), &format!("csrf:{nonce}")),
        read_only: app.cfg.http.console_read_only,
        admin: true,
        who: Principal::default_admin("local"),
        id: None,
        caller: Caller::ANONYMOUS,
    };
    (s, new)
}

/// Lets a request through with its [`Session`], or sends it to the login.
pub async fn guard(Extension(app): Extension<AppState>, mut req: Request, next: Next) -> Response {
    if app.tokens.is_empty() {
        let (session, new) = open_session(&app, req.headers());
        req.extensions_mut().insert(session);
        let mut resp = next.run(req).await;
        if let Some(nonce) = new
            && let Ok(v) = format!("{COOKIE}={nonce}; {}", cookie_attrs(&app, SESSION.as_secs())).parse()
        {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
        return resp;
    }
    let found = match cookie_value(req.headers()) {
        None => None,
        Some(v) => match verify(&app, &v).await {
            Ok(found) => found,
            Err(refused) => return refused.into_response(),
        },
    };
    let Some((sid, who, caller)) = found else {
        if req.method() == Method::GET {
            return Redirect::to("/console/login").into_response();
        }
        return fail(
            StatusCode::UNAUTHORIZED,
            "console: no session; log in at /console/login",
        )
        .into_response();
    };
    let session = Session {
        csrf: mac(&server_key(&app), &format!("csrf:{}", sid.simple())),
        read_only: app.cfg.http.console_read_only || !who.scope.allows(Need::Operate),
        admin: who.scope == Scope::Admin,
        who,
        id: Some(sid),
        caller,
    };
    req.extensions_mut().insert(session);
    next.run(req).await
}

/// Refuses a POST whose `Origin` does not name this server (403), before
/// anything else of the console runs — the login included.
pub async fn same_origin_posts(req: Request, next: Next) -> Response {
    if req.method() != Method::GET
        && req.method() != Method::HEAD
        && let Err(why) = crate::http::local_guard::same_origin(req.headers())
    {
        return fail(StatusCode::FORBIDDEN, &format!("console: {why}")).into_response();
    }
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

/// The token of a login: `Ok((WHO, its SHA-256, database token id))` for
/// one that may use the console, else the refusal.
/// Failed logins count against the peer's address like failed bearer
/// tokens (`http.max_auth_failures_per_minute`): past the limit a login
/// is refused with 429 before any lookup.
async fn login_token(
    app: &AppState,
    token: &str,
    peer: Option<std::net::IpAddr>,
) -> Result<(String, [u8; 32], Option<i64>), Response> {
    let digest: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
    let mut configured = false;
    for t in &app.tokens {
        configured |= same(&hex(t), &hex(&digest));
    }
    if configured {
        return Ok(("c".to_owned(), digest, None));
    }
    if let Err(refused) = app.auth_failures.check(peer) {
        return Err(refused.into_response());
    }
    let who = match app.db_tokens.lookup(&app.pool, digest).await {
        Ok(who) => who,
        Err(e) => return Err(unavailable(e.message).into_response()),
    };
    let Some(who) = who else {
        app.auth_failures.failed(peer);
        let mut resp = render("login.html", login_ctx("wrong token"));
        *resp.status_mut() = StatusCode::UNAUTHORIZED;
        return Err(resp);
    };
    match (who.token_id, console_refusal(&who)) {
        (Some(id), None) => Ok((format!("t{id}"), digest, Some(id))),
        (_, refusal) => Err(fail(
            StatusCode::FORBIDDEN,
            &refusal.unwrap_or_else(|| format!("console: token `{}` cannot open a console session", who.token)),
        )
        .into_response()),
    }
}

/// `POST /console/login`: a configured token, or a database token with
/// scope `read` or more → a new session and its cookie.
pub async fn login(
    Extension(app): Extension<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    Form(f): Form<LoginForm>,
) -> Response {
    if app.tokens.is_empty() {
        return Redirect::to("/console").into_response();
    }
    let peer = peer.map(|Extension(ConnectInfo(a))| a.ip());
    let (who, digest, token_id) = match login_token(&app, &f.token, peer).await {
        Ok(found) => found,
        Err(refused) => return refused,
    };
    let sid = Uuid::new_v4();
    let expiry = now_secs() + SESSION.as_secs();
    let expires_at = chrono::Utc::now() + SESSION;
    let started = match app.pool.get().await {
        Ok(c) => tenants::start_session(&c, sid, token_id, expires_at)
            .await
            .map_err(unavailable),
        Err(e) => Err(unavailable(e)),
    };
    if let Err(refused) = started {
        return refused.into_response();
    }
    let value = format!(
        "{}.{who}.{expiry}.{}",
        sid.simple(),
        mac(&server_key(&app), &session_msg(&sid, &who, expiry, &digest))
    );
    let cookie = format!("{COOKIE}={value}; {}", cookie_attrs(&app, SESSION.as_secs()));
    ([(header::SET_COOKIE, cookie)], Redirect::to("/console")).into_response()
}

#[derive(Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /console/logout`: ends the session (on every daemon) and drops
/// the cookie.
pub async fn logout(
    Extension(app): Extension<AppState>,
    Extension(s): Extension<Session>,
    Form(f): Form<CsrfForm>,
) -> Response {
    if !same(&s.csrf, &f.csrf) {
        return fail(StatusCode::FORBIDDEN, "console: missing or wrong csrf token").into_response();
    }
    if let Some(sid) = s.id {
        let ended = match app.pool.get().await {
            Ok(c) => tenants::end_session(&c, sid).await.map_err(unavailable),
            Err(e) => Err(unavailable(e)),
        };
        if let Err(refused) = ended {
            return refused.into_response();
        }
    }
    let cookie = format!("{COOKIE}=; {}", cookie_attrs(&app, 0));
    ([(header::SET_COOKIE, cookie)], Redirect::to("/console/login")).into_response()
}
