//! The console of a running daemon: over HTTP with a session of one's own
//! (a client that keeps no redirects, the session cookie, the CSRF token
//! of a page), and in a real browser logged in the same way.

use reqwest::StatusCode;

use super::api::Api;
use super::browser::Browser;
use super::daemon::Opts;
use super::db::TestDb;

/// The browser cookie this client sends unless a request sets its own: a
/// console without tokens binds its CSRF token to it (as a browser keeps
/// the cookie the first page set).
pub const BROWSER_COOKIE: &str = "maas_console=0123456789abcdef0123456789abcdef";

/// A client that does not follow redirects (the console answers a page
/// without a session with 303 to its login) and keeps one browser cookie
/// ([`BROWSER_COOKIE`]).
pub fn plain_client() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::COOKIE,
        reqwest::header::HeaderValue::from_static(BROWSER_COOKIE),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The CSRF token of a console page (empty when the page has none).
pub fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or("")
        .to_owned()
}

/// The CSRF token of the console page at `url`, fetched by `http` (with
/// the session `cookie`, when given).
pub async fn csrf_at(http: &reqwest::Client, url: String, cookie: Option<&str>) -> String {
    let mut get = http.get(url);
    if let Some(cookie) = cookie {
        get = get.header("cookie", cookie);
    }
    csrf_of(&get.send().await.unwrap().text().await.unwrap())
}

/// What `POST /console/login` answered.
pub struct Login {
    pub status: StatusCode,
    /// The session cookie (`name=value`), when one was set.
    pub cookie: Option<String>,
    pub body: String,
}

/// Logs in to `api`'s console with `token`.
pub async fn login(api: &Api, token: &str) -> Login {
    let r = plain_client()
        .post(api.url("/console/login"))
        .header("origin", api.url(""))
        .form(&[("token", token)])
        .send()
        .await
        .unwrap();
    let status = r.status();
    let cookie = r
        .headers()
        .get("set-cookie")
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_owned());
    Login {
        status,
        cookie,
        body: r.text().await.unwrap_or_default(),
    }
}

/// A daemon's console and a session on it.
pub struct Console {
    pub api: Api,
    pub http: reqwest::Client,
    /// The session cookie sent with every page and action, when logged in.
    pub session: Option<String>,
    /// The token the session (and [`Console::browser`]) logs in with.
    pub token: Option<String>,
}

impl Console {
    /// A daemon with no token configured: its console needs no login.
    pub async fn open(db: &TestDb, opts: Opts) -> Console {
        Console {
            api: Api::start(db, opts).await,
            http: plain_client(),
            session: None,
            token: None,
        }
    }

    fn with_session(&self, rb: reqwest::RequestBuilder, session: Option<&str>) -> reqwest::RequestBuilder {
        match session.or(self.session.as_deref()) {
            Some(cookie) => rb.header("cookie", cookie),
            None => rb,
        }
    }

    /// GET `path` in `session` (this fixture's when `None`).
    pub async fn get_as(&self, session: Option<&str>, path: &str) -> reqwest::Response {
        self.with_session(self.http.get(self.api.url(path)), session)
            .send()
            .await
            .unwrap()
    }

    /// The text of page `path` in this fixture's session.
    pub async fn page(&self, path: &str) -> String {
        self.get_as(None, path).await.text().await.unwrap()
    }

    /// POST `form` to `path` in `session` (this fixture's when `None`).
    pub async fn post_as(&self, session: Option<&str>, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
        self.with_session(self.http.post(self.api.url(path)), session)
            .header("origin", self.api.url(""))
            .form(form)
            .send()
            .await
            .unwrap()
    }

    /// A browser on the console, logged in through the login form when the
    /// daemon takes a token; `None` where no browser is installed.
    pub async fn browser(&self) -> Option<Browser> {
        match &self.token {
            Some(token) => browser_logged_in(&self.api, token).await,
            None => Browser::start().await,
        }
    }
}

/// A browser logged in to `api`'s console with `token` through the login
/// form, on the overview; `None` where no browser is installed.
pub async fn browser_logged_in(api: &Api, token: &str) -> Option<Browser> {
    let b = Browser::start().await?;
    b.goto(&api.url("/console")).await;
    b.wait_js("the login page", "return location.pathname === '/console/login';")
        .await;
    b.fill("#token", token).await;
    b.click("#login").await;
    b.wait_js(
        "the overview after login",
        "return location.pathname === '/console' && document.body.dataset.live === 'on';",
    )
    .await;
    Some(b)
}
