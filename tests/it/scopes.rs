//! Every door checks the tenant and the scope: each route of the API and
//! the console, walked with every scope (operator token or not) in two
//! tenants, against the scope table of `docs/deploying.md`; and the
//! console's guard, origin rule, sessions and CSRF tokens.

use reqwest::{Method, StatusCode};
use serde_json::json;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::console::{csrf_at, login, plain_client};
use crate::support::daemon::Opts;
use crate::support::db::TestDb;
use crate::support::tenants::{start, submit_ok};

const SCOPES: [&str; 4] = ["submit", "read", "operate", "admin"];

/// The scope table of docs/deploying.md: each row's first cell and the
/// scopes it marks (the MCP rows are walked by `mcp::doors`).
pub(crate) fn scope_table() -> Vec<(String, Vec<&'static str>)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/deploying.md")).unwrap();
    let section = doc.split("## Scopes").nth(1).unwrap();
    let mut rows = Vec::new();
    for line in section.lines().skip_while(|l| !l.starts_with("| route")).skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let n = cells.len();
        let allowed = SCOPES
            .iter()
            .zip(&cells[n - 4..])
            .filter(|(_, c)| **c == "✓")
            .map(|(s, _)| *s)
            .collect();
        rows.push((cells[..n - 4].join("|"), allowed));
    }
    rows
}

/// One call of a route: the row of the table it belongs to, and how to
/// make it (`{req}`, `{user}` are the caller's tenant's request and user,
/// `{fresh}` a user without requests).
struct Probe {
    row: &'static str,
    method: Method,
    path: &'static str,
    body: Option<serde_json::Value>,
}

fn probe(row: &'static str, method: Method, path: &'static str) -> Probe {
    Probe {
        row,
        method,
        path,
        body: None,
    }
}

fn probes() -> Vec<Probe> {
    use Method as M;
    let (api_read, api_user, api_act) = (
        "`GET /api/query/{id}/status`",
        "`GET /api/users/{id}/memory`",
        "`POST /api/query/{id}/cancel`",
    );
    // An operator action over the API, with the reason it needs.
    let act = |method: Method, path: &'static str| Probe {
        body: Some(json!({ "summary": "x", "reason": "scope walk" })),
        ..probe(api_act, method, path)
    };
    vec![
        Probe {
            body: Some(json!({ "user_id": Uuid::new_v4(), "query": "walk" })),
            ..probe("`POST /api/query`", M::POST, "/api/query")
        },
        Probe {
            // Streamed, so the answer's headers come at once.
            body: Some(json!({
                "model": "offline", "user": "walk", "stream": true,
                "messages": [{ "role": "user", "content": "walk" }],
            })),
            ..probe("`POST /v1/chat/completions`", M::POST, "/v1/chat/completions")
        },
        probe("`GET /v1/models`", M::GET, "/v1/models"),
        Probe {
            // Not waiting: refused as such (409), past the scope check.
            body: Some(json!({ "text": "walk" })),
            ..probe("`POST /api/query/{id}/reply`", M::POST, "/api/query/{req}/reply")
        },
        probe(api_read, M::GET, "/api/query/{req}/status"),
        probe(api_read, M::GET, "/api/query/{req}/events"),
        probe(api_read, M::GET, "/api/ws?request_id={req}"),
        probe(api_user, M::GET, "/api/users/{user}/memory"),
        probe(api_user, M::GET, "/api/users/{user}/export"),
        probe(api_user, M::GET, "/api/ws?user_id={user}"),
        probe(api_user, M::GET, "/api/query/{req}/status?include=context"),
        act(M::POST, "/api/query/{req}/continue"),
        act(M::POST, "/api/query/{req}/retry"),
        act(M::PUT, "/api/users/{user}/memory/1"),
        act(M::DELETE, "/api/users/{user}/memory/1"),
        act(M::DELETE, "/api/users/{user}/turns/1"),
        act(M::POST, "/api/query/{req}/cancel"),
        Probe {
            body: Some(json!({ "action": "approve" })),
            ..probe("`POST /api/query/{id}/review`", M::POST, "/api/query/{req}/review")
        },
        probe("`DELETE /api/users/{id}` (forget)", M::DELETE, "/api/users/{user}"),
        probe("console: view", M::GET, "/console/requests"),
        probe("console: view", M::GET, "/console/requests/rows"),
        probe("console: view", M::GET, "/console/requests/{req}"),
        probe("console: view", M::GET, "/console/requests/{req}/body"),
        probe("console: view", M::GET, "/console/users/{user}"),
        probe("console: view", M::GET, "/console/events"),
        probe("console: actions", M::POST, "/console/requests/{req}/continue"),
        probe("console: actions", M::POST, "/console/users/{fresh}/archive"),
        probe("console: actions", M::POST, "/console/requests/{req}/cancel"),
        probe("console: actions", M::POST, "/console/requests/{req}/review"),
        probe("console, operator token: the overview", M::GET, "/console/overview"),
        probe("console, operator token: the overview", M::GET, "/console/prompts"),
        probe(
            "console, operator token: prompt activation",
            M::POST,
            "/console/prompts/Assembler/999/activate",
        ),
    ]
}

/// A caller of the walk: its token and, when it logs in, its console
/// session and CSRF token.
struct Caller {
    name: String,
    scope: &'static str,
    operator: bool,
    token: String,
    session: Option<(String, String)>,
    req: Uuid,
    user: Uuid,
}

async fn caller(api: &Api, c: &tokio_postgres::Client, tenant: &str, scope: &'static str, operator: bool) -> Caller {
    let token = format!("maas_{}", Uuid::new_v4().simple());
    let hash: Vec<u8> = Sha256::digest(token.as_bytes()).to_vec();
    let name = format!(
        "{tenant}-{scope}-{operator}-{}",
        &Uuid::new_v4().simple().to_string()[..6]
    );
    c.execute(
        "INSERT INTO api_tokens (name, tenant_id, scope, token_sha256, operator) SELECT $1, id, $3, $4, $5 FROM tenants WHERE name = $2",
        &[&name, &tenant, &scope, &hash, &operator],
    )
    .await
    .unwrap();
    let writer = crate::support::tenants::token(c, tenant, &format!("{name}-writer"), "admin").await;
    let user = Uuid::new_v4();
    let req = submit_ok(api, &writer, user, Uuid::new_v4(), "a request to walk").await;
    let l = login(api, &token).await;
    let session = match l.cookie {
        Some(cookie) => {
            let csrf = csrf_at(&plain_client(), api.url("/console/requests"), Some(&cookie)).await;
            Some((cookie, csrf))
        }
        None => None,
    };
    Caller {
        name,
        scope,
        operator,
        token,
        session,
        req,
        user,
    }
}

/// Whether `p` let `who` through (anything but 401 and 403).
async fn allowed(api: &Api, who: &Caller, p: &Probe) -> (bool, StatusCode) {
    let path = p
        .path
        .replace("{req}", &who.req.to_string())
        .replace("{user}", &who.user.to_string())
        .replace("{fresh}", &Uuid::new_v4().to_string());
    let http = plain_client();
    let mut rb = http.request(p.method.clone(), api.url(&path));
    if path.starts_with("/console") {
        let Some((cookie, csrf)) = &who.session else {
            return (false, StatusCode::UNAUTHORIZED);
        };
        rb = rb.header("cookie", cookie).header("origin", api.url(""));
        if p.method == Method::POST {
            rb = rb.form(&[("csrf", csrf.as_str()), ("reason", "scope walk")]);
        }
    } else {
        rb = rb.bearer_auth(&who.token);
        if path.starts_with("/api/ws") {
            rb = rb
                .header("connection", "upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-version", "13")
                .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
        }
        if let Some(body) = &p.body {
            rb = rb.json(body);
        }
    }
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), rb.send())
        .await
        .unwrap_or_else(|_| panic!("{} {path}: no answer within 10 s", p.method))
        .unwrap();
    let s = r.status();
    let refused = s == StatusCode::UNAUTHORIZED || s == StatusCode::FORBIDDEN;
    // A login redirect is a refusal too.
    let to_login = r
        .headers()
        .get("location")
        .is_some_and(|l| l.to_str().unwrap_or("") == "/console/login");
    (!refused && !to_login, s)
}

/// A daemon whose requests stay in flight (a slow offline provider), and a
/// second tenant `acme`; the database client it was made with.
async fn daemon_and_acme(db: &TestDb) -> (tokio_postgres::Client, Api) {
    let c = db.client().await;
    let api = start(db, Opts::default().env("MAAS_LLM__OFFLINE__LATENCY_MS", 60_000)).await;
    c.execute("INSERT INTO tenants (name) VALUES ('acme')", &[])
        .await
        .unwrap();
    (c, api)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_with_every_scope_does_what_the_scope_table_says() {
    let db = TestDb::new().await;
    let (c, api) = daemon_and_acme(&db).await;
    let table = scope_table();
    let probes = probes();
    for (row, _) in &table {
        assert!(
            probes.iter().any(|p| row.starts_with(p.row)) || row.starts_with("MCP"),
            "no probe walks the table's row {row:?}"
        );
    }
    let listed: Vec<(&str, &str)> = maas::http::routes().list;
    for (method, route) in &listed {
        let route = route.split("/{").next().unwrap_or(route);
        assert!(
            probes
                .iter()
                .any(|p| p.method.as_str() == *method && p.path.starts_with(route))
                || route.starts_with("/healthz")
                || route.starts_with("/readyz")
                || route.starts_with("/metrics")
                || route.starts_with("/openapi"),
            "no probe for {method} {route}"
        );
    }
    let mut wrong = Vec::new();
    for tenant in ["default", "acme"] {
        for scope in SCOPES {
            for operator in [false, true] {
                let who = caller(&api, &c, tenant, scope, operator).await;
                for p in &probes {
                    let (row, marks) = table
                        .iter()
                        .find(|(row, _)| row.starts_with(p.row))
                        .unwrap_or_else(|| panic!("no row {:?} in docs/deploying.md", p.row));
                    let by_scope = marks.contains(&who.scope);
                    let want = by_scope && (who.operator || !row.starts_with("console, operator token"));
                    let (got, status) = allowed(&api, &who, p).await;
                    if got != want {
                        wrong.push(format!(
                            "{tenant} {scope} operator={operator}: {} {} → {status} (table: {})",
                            p.method,
                            p.path,
                            if want { "allowed" } else { "refused" }
                        ));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the routes disagree with the scope table:\n{}",
        wrong.join("\n")
    );
}

/// Another tenant's request and user stay out of sight in the console of
/// a tenant's token, and in sight of an operator token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_console_sees_only_its_tenant_and_an_operator_sees_all() {
    let db = TestDb::new().await;
    let (c, api) = daemon_and_acme(&db).await;
    let shop = caller(&api, &c, "default", "read", false).await;
    let acme = caller(&api, &c, "acme", "read", false).await;
    let oper = caller(&api, &c, "default", "read", true).await;
    let get = |who: &Caller, path: String| {
        let cookie = who.session.as_ref().unwrap().0.clone();
        let api = &api;
        async move {
            let r = plain_client()
                .get(api.url(&path))
                .header("cookie", cookie)
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap())
        }
    };
    // The default tenant's read token no longer sees acme's request.
    let (s, page) = get(&shop, format!("/console/requests/{}", acme.req)).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(page.contains(&format!("console: no request {}", acme.req)), "{page}");
    let (_, list) = get(&shop, "/console/requests".into()).await;
    assert!(list.contains(&shop.req.to_string()) && !list.contains(&acme.req.to_string()));
    // Acme's page names its user by acme's own id; the memory page opens by it.
    let (s, page) = get(&acme, format!("/console/requests/{}", acme.req)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(page.contains(&format!("/console/users/{}", acme.user)), "{page}");
    let (s, _) = get(&acme, format!("/console/users/{}", acme.user)).await;
    assert_eq!(s, StatusCode::OK);
    // The operator sees both.
    let (_, list) = get(&oper, "/console/requests".into()).await;
    assert!(list.contains(&shop.req.to_string()) && list.contains(&acme.req.to_string()));
}

/// The console lists every user of its tenant, so a token bound to one user
/// (`maasctl tokens create … --user`) opens no console session, whatever
/// its scope, and a session whose token is bound afterwards ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bound_to_one_user_opens_no_console_session() {
    let db = TestDb::new().await;
    let (c, api) = daemon_and_acme(&db).await;
    let bound = caller(&api, &c, "acme", "admin", false).await;
    let hash: Vec<u8> = Sha256::digest(bound.token.as_bytes()).to_vec();
    let cookie = bound
        .session
        .as_ref()
        .expect("an unbound admin token logs in")
        .0
        .clone();
    let requests_page = || async {
        plain_client()
            .get(api.url("/console/requests"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap()
    };
    assert_eq!(
        requests_page().await.status(),
        StatusCode::OK,
        "the session works while the token is unbound"
    );
    c.execute(
        "UPDATE api_tokens SET user_id = $1 WHERE token_sha256 = $2",
        &[&bound.user, &hash],
    )
    .await
    .unwrap();
    // The session opened before the binding no longer opens a page (once
    // the token's cached lookup has expired), a new login is refused, and
    // the token stays usable on the API for its own user.
    let deadline = std::time::Instant::now() + crate::support::GENEROUS;
    loop {
        let r = requests_page().await;
        if r.status() == StatusCode::SEE_OTHER {
            assert_eq!(r.headers()["location"], "/console/login");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the old session still opens the console ({})",
            r.status()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let l = login(&api, &bound.token).await;
    assert_eq!(l.status, StatusCode::FORBIDDEN, "{}", l.body);
    assert!(l.cookie.is_none(), "no session cookie for a bound token");
    assert!(
        l.body.contains("is bound to one user") && l.body.contains(&bound.name),
        "the refusal names the token and why: {}",
        l.body
    );
    let r = plain_client()
        .get(api.url(&format!("/api/query/{}/status", bound.req)))
        .bearer_auth(&bound.token)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "the bound token reads its own user's request"
    );
}

/// Without tokens the Host rule guards the console and every other route.
#[tokio::test]
async fn a_foreign_host_is_refused_on_every_door_without_tokens() {
    let db = TestDb::new().await;
    let api = Api::start(&db, Opts::default()).await;
    let http = plain_client();
    for path in [
        "/console/requests",
        "/console",
        "/healthz",
        "/metrics",
        "/openapi.json",
        "/api/query/x/status",
    ] {
        let r = http
            .get(api.url(path))
            .header("host", "evil.example:8080")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path}");
        let ok = http.get(api.url(path)).send().await.unwrap();
        assert_ne!(ok.status(), StatusCode::FORBIDDEN, "{path} on loopback");
    }
    // A console POST needs an Origin naming the server.
    let id = Uuid::new_v4();
    for origin in [None, Some("http://evil.example")] {
        let mut rb = http.post(api.url(&format!("/console/requests/{id}/cancel")));
        if let Some(o) = origin {
            rb = rb.header("origin", o);
        }
        let r = rb.form(&[("reason", "x")]).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{origin:?}");
    }
}

/// A session is the server's to make: a cookie MACed with the token's
/// SHA-256 (what the database holds) opens nothing; the CSRF token is per
/// session; a logout ends the session even for a copy of its cookie.
#[tokio::test]
async fn sessions_cannot_be_minted_from_the_database_and_end_at_logout() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = start(
        &db,
        Opts::default().env("MAAS_HTTP__SESSION_SECRET", "a-long-random-server-secret-0123456789"),
    )
    .await;
    let who = caller(&api, &c, "default", "operate", true).await;
    let (cookie, csrf) = who.session.clone().unwrap();
    // Forged from the table: the old `EXPIRY.tID.MAC` keyed by the hash,
    // and the new shape keyed by the hash.
    let (id, hash): (i64, Vec<u8>) = {
        let r = c
            .query_one("SELECT id, token_sha256 FROM api_tokens WHERE name = $1", &[&who.name])
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    let mac = |msg: String| {
        use hmac::{Hmac, Mac};
        let mut m = Hmac::<Sha256>::new_from_slice(&hash).unwrap();
        m.update(msg.as_bytes());
        m.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let exp = chrono::Utc::now().timestamp() + 3600;
    let sid = Uuid::new_v4().simple().to_string();
    let hex_hash: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    for forged in [
        format!("maas_console={exp}.t{id}.{}", mac(format!("session:{exp}:t{id}"))),
        format!(
            "maas_console={sid}.t{id}.{exp}.{}",
            mac(format!("session:{sid}:t{id}:{exp}:{hex_hash}"))
        ),
    ] {
        let r = plain_client()
            .get(api.url("/console/requests"))
            .header("cookie", forged)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "a forged session opens nothing");
    }
    // Per session: a second login has another CSRF token.
    let again = caller(&api, &c, "default", "operate", true).await;
    assert_ne!(again.session.unwrap().1, csrf);
    // Logout ends the session, even for a copy of the cookie.
    let r = plain_client()
        .post(api.url("/console/logout"))
        .header("cookie", &cookie)
        .header("origin", api.url(""))
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let r = plain_client()
        .get(api.url("/console/requests"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["location"], "/console/login");
}

/// Console actions are recorded with the token's name, and a `submit`
/// token cannot read a request's context (the user's memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_actions_name_the_token_and_context_needs_read() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = start(&db, Opts::default().env("MAAS_LLM__OFFLINE__LATENCY_MS", 60_000)).await;
    let who = caller(&api, &c, "default", "operate", false).await;
    let (cookie, csrf) = who.session.clone().unwrap();
    let r = plain_client()
        .post(api.url(&format!("/console/requests/{}/cancel", who.req)))
        .header("cookie", &cookie)
        .header("origin", api.url(""))
        .form(&[("csrf", csrf.as_str()), ("reason", "named")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let actor: String = c
        .query_one(
            "SELECT actor FROM operator_actions WHERE action = 'cancel' AND run_id = $1",
            &[&who.req],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(actor, who.name);

    let submit = crate::support::tenants::token(&c, "default", "submitter", "submit").await;
    let path = format!("/api/query/{}/status?include=context", who.req);
    let (s, body) = crate::support::tenants::get(&api, &submit, &path).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["code"], "scope_required");
    let reader = crate::support::tenants::token(&c, "default", "reader", "read").await;
    let (s, _) = crate::support::tenants::get(&api, &reader, &path).await;
    assert_eq!(s, StatusCode::OK);
}
