//! The MCP rows of the scope table (`docs/deploying.md`), walked through
//! the real door: the official Python SDK over HTTP for what a client
//! does, and raw HTTP for what an attacker sends by hand (another token's
//! `Mcp-Session-Id`, a stream cut mid-call).

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::{call, client, over_http, python, refused, token};
use crate::support::api::Api;
use crate::support::daemon::Opts;
use crate::support::db::TestDb;
use crate::support::tenants::{self, start};
use crate::support::{GENEROUS, wait_until};

/// Revocation ends a session or a wait within two token-cache periods (5 s
/// each), with some slack for a loaded machine.
const REVOKED_WITHIN: Duration = Duration::from_secs(20);

/// The scope table's rows that name MCP, with the scopes each marks.
fn mcp_rows() -> Vec<(String, Vec<&'static str>)> {
    crate::scopes::scope_table()
        .into_iter()
        .filter(|(row, _)| row.contains("MCP"))
        .collect()
}

/// The scopes the MCP row starting with `prefix` marks.
fn marks(prefix: &str) -> Vec<&'static str> {
    mcp_rows()
        .into_iter()
        .find(|(row, _)| row.starts_with(prefix))
        .unwrap_or_else(|| panic!("no row {prefix:?} in the scope table of docs/deploying.md"))
        .1
}

/// Where each MCP row is walked: the row's start, and the tests.
const WALKS: [(&str, &[&str]); 8] = [
    (
        "`POST /api/query/{id}/reply`",
        &["every_mcp_tool_with_every_scope_does_what_the_table_says"],
    ),
    (
        "`POST /api/query`; MCP tools",
        &["every_mcp_tool_with_every_scope_does_what_the_table_says"],
    ),
    (
        "`GET /api/users/{id}/memory`",
        &["every_mcp_tool_with_every_scope_does_what_the_table_says"],
    ),
    (
        "`POST /api/query/{id}/cancel`",
        &["every_mcp_tool_with_every_scope_does_what_the_table_says"],
    ),
    (
        "`DELETE /api/users/{id}` (forget)",
        &["every_mcp_tool_with_every_scope_does_what_the_table_says"],
    ),
    (
        "MCP: `remember` and `ask`",
        &[
            "mcp_calls_count_against_the_tenants_limits_and_caps",
            "remembers_are_requests_of_the_minute_and_the_body_cap_holds",
            "the_stdio_door_is_inside_the_tenants_limits_too",
            "a_revoked_tokens_session_stream_and_ask_wait_end",
        ],
    ),
    (
        "MCP: a session",
        &[
            "an_mcp_session_is_its_tokens",
            "mcp_sessions_are_capped_per_token_and_in_total",
        ],
    ),
    (
        "MCP: a revoked token",
        &["a_revoked_tokens_session_stream_and_ask_wait_end"],
    ),
];

#[test]
fn every_mcp_row_of_the_scope_table_is_walked() {
    let rows = mcp_rows();
    assert!(rows.len() >= WALKS.len(), "{rows:?}");
    for (row, _) in &rows {
        assert!(
            WALKS.iter().any(|(prefix, _)| row.starts_with(prefix)),
            "no MCP walk for the table's row {row:?}"
        );
    }
    let source = include_str!("doors.rs");
    for name in WALKS.iter().flat_map(|(_, tests)| tests.iter()) {
        assert!(source.contains(&format!("async fn {name}()")), "no test {name}");
    }
}

/// A raw MCP request with `tok` (none: `""`), naming `session` when given.
async fn raw(api: &Api, tok: &str, session: Option<&str>, method: Method, body: Option<Value>) -> reqwest::Response {
    let mut rb = api
        .http
        .request(method, api.url("/mcp"))
        .header("accept", "application/json, text/event-stream");
    if !tok.is_empty() {
        rb = rb.bearer_auth(tok);
    }
    if let Some(s) = session {
        rb = rb
            .header("mcp-session-id", s)
            .header("mcp-protocol-version", "2025-03-26");
    }
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    rb.send().await.unwrap()
}

fn initialize() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": "2025-03-26",
            "capabilities": {},
            "clientInfo": { "name": "raw", "version": "1" },
        },
    })
}

/// Opens a session of the revision before the current one with `tok`: the
/// status, the `code` of a refusal and the session id.
async fn open_session(api: &Api, tok: &str) -> (StatusCode, Option<String>, Option<String>) {
    let r = raw(api, tok, None, Method::POST, Some(initialize())).await;
    let status = r.status();
    let id = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = r.text().await.unwrap();
    let code = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|b| b["code"].as_str().map(str::to_owned));
    if let Some(id) = &id {
        let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let r = raw(api, tok, Some(id), Method::POST, Some(note)).await;
        assert!(r.status().is_success(), "initialized: {}", r.status());
    }
    (status, code, id)
}

/// The events of an SSE body as (id, data) until `n` came or it ended.
async fn sse_events(resp: &mut reqwest::Response, n: usize, within: Duration) -> Vec<(Option<String>, String)> {
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let events: Vec<(Option<String>, String)> = text
            .split("\n\n")
            .filter(|e| e.contains("data:"))
            .map(|e| {
                let id = e
                    .lines()
                    .find_map(|l| l.strip_prefix("id:"))
                    .map(|i| i.trim().to_owned());
                let data = e.lines().filter_map(|l| l.strip_prefix("data:")).collect::<String>();
                (id, data.trim().to_owned())
            })
            .collect();
        if events.len() >= n {
            return events;
        }
        match tokio::time::timeout_at(deadline, resp.chunk()).await {
            Ok(Ok(Some(chunk))) => text.push_str(std::str::from_utf8(&chunk).unwrap()),
            Ok(_) => return events,
            Err(_) => panic!("no {n} SSE events within {within:?}: {text}"),
        }
    }
}

/// The count `sql` (with `params`) returns.
async fn count(c: &tokio_postgres::Client, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> i64 {
    c.query_one(sql, params).await.unwrap().get(0)
}

/// Makes `tok` revoked, as `maasctl tokens revoke` does.
async fn revoke(db: &TestDb, tok: &str) {
    let hash: Vec<u8> = Sha256::digest(tok.as_bytes()).to_vec();
    let n = db
        .client()
        .await
        .execute(
            "UPDATE api_tokens SET revoked_at = now() WHERE token_sha256 = $1",
            &[&hash],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
}

/// Whether a step was refused for its scope (a tool error, or a protocol
/// error for a resource).
fn scope_refused(step: &Value) -> bool {
    refused(step) == Some("scope_required") || step["exception"].as_str().is_some_and(|e| e.contains("scope_required"))
}

/// Each MCP tool and resource, called with a token of every scope, is
/// allowed or refused (`scope_required`) as the table marks its row; `ask`
/// shows the memory it used (`context_sources`) only to a scope that may
/// read it, as `?include=context` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mcp_tool_with_every_scope_does_what_the_table_says() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let api = start(&db, Opts::default()).await;
    let rows: [(&str, &[usize]); 5] = [
        ("`POST /api/query`; MCP tools", &[0, 1]),
        ("`GET /api/users/{id}/memory`", &[2, 3]),
        ("`POST /api/query/{id}/cancel`", &[4]),
        ("`DELETE /api/users/{id}` (forget)", &[5]),
        ("`POST /api/query/{id}/reply`", &[6]),
    ];
    let mut wrong = Vec::new();
    for scope in ["submit", "read", "operate", "admin"] {
        let tok = token(&db, "acme", scope, None).await;
        let user = Uuid::new_v4();
        let steps = json!([
            call("remember", json!({ "user_id": user, "content": "I keep bees." })),
            call("ask", json!({ "user_id": user, "query": "What do I keep?" })),
            call("recall", json!({ "user_id": user, "query": "bees" })),
            { "op": "read", "uri": format!("maas://users/{user}/threads") },
            call("correct", json!({ "user_id": user, "action": "delete_turn", "id": 999_999_999 })),
            call("forget", json!({ "user_id": Uuid::new_v4() })),
            call("reply", json!({ "request_id": Uuid::new_v4(), "text": "walk" })),
        ]);
        let r = client(&py, over_http(&api, &tok, steps)).await;
        let s = r["steps"].as_array().unwrap_or_else(|| panic!("{r}"));
        for (prefix, at) in rows {
            let want = marks(prefix).contains(&scope);
            for i in at {
                if scope_refused(&s[*i]) == want {
                    wrong.push(format!("{scope}: step {i} ({prefix}) → {}", s[*i]));
                }
            }
        }
        if marks(rows[0].0).contains(&scope) {
            let ask = &s[1]["structured"];
            assert_eq!(ask["status"], "completed", "{scope}: {}", s[1]);
            let reads = marks(rows[1].0).contains(&scope);
            assert_eq!(ask["context_sources"].is_array(), reads, "{scope}: {ask}");
        }
    }
    assert!(
        wrong.is_empty(),
        "MCP disagrees with the scope table:\n{}",
        wrong.join("\n")
    );
}

/// `POST /api/query` three times with `tok` for `user`: the statuses.
async fn three_submissions(api: &Api, tok: &str, user: Uuid) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let body = json!({ "user_id": user, "query": "count me" });
        let (s, b, _) = tenants::submit(api, tok, body).await;
        assert!(
            s != StatusCode::TOO_MANY_REQUESTS || b["code"] == "requests_per_minute",
            "{b}"
        );
        statuses.push(s.as_u16());
    }
    statuses
}

/// Tenant `tenant` (made if new) limited to `rpm` requests per minute, and
/// a token of it with `scope`.
async fn limited(db: &TestDb, tenant: &str, scope: &str, rpm: i32) -> String {
    let tok = token(db, tenant, scope, None).await;
    db.client()
        .await
        .execute(
            "UPDATE tenants SET requests_per_minute = $2 WHERE name = $1",
            &[&tenant, &rpm],
        )
        .await
        .unwrap();
    tok
}

/// The attack as it was run: a tenant at `requests_per_minute` 2 is
/// refused over HTTP, and then over MCP too — `remember` and `ask` are
/// requests of the same minute, refused with the same code, and store
/// nothing. The text checks of `POST /api/query` hold on `/mcp`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_calls_count_against_the_tenants_limits_and_caps() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let api = start(&db, Opts::default()).await;
    let c = db.client().await;
    let long = "b".repeat(100_000);
    for scope in marks("MCP: `remember` and `ask`") {
        let tenant = format!("capped-{scope}");
        let tok = limited(&db, &tenant, scope, 2).await;
        let (asker, rememberer) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(three_submissions(&api, &tok, asker).await, [202, 202, 429], "{scope}");
        let mut steps: Vec<Value> = (0..5)
            .map(|_| call("remember", json!({ "user_id": rememberer, "content": long })))
            .collect();
        steps.push(call("ask", json!({ "user_id": asker, "query": "and me?" })));
        let too_long = "b".repeat(100_001);
        steps.push(call("remember", json!({ "user_id": rememberer, "content": too_long })));
        steps.push(call("remember", json!({ "user_id": rememberer, "content": "  " })));
        let r = client(&py, over_http(&api, &tok, json!(steps))).await;
        let s = r["steps"].as_array().unwrap_or_else(|| panic!("{r}"));
        for step in &s[..6] {
            assert_eq!(refused(step), Some("requests_per_minute"), "{scope}: {step}");
            let why = step["body"]["error"].as_str().unwrap();
            assert!(why.contains("requests_per_minute"), "{step}");
        }
        assert_eq!(refused(&s[6]), Some("field_too_long"), "{scope}: {}", s[6]);
        assert_eq!(refused(&s[7]), Some("empty_field"), "{scope}: {}", s[7]);
        let stored = count(
            &c,
            "SELECT count(*) FROM raw_logs WHERE user_id = maas_tenant_user((SELECT id FROM tenants WHERE name = $1), $2)",
            &[&tenant, &rememberer],
        )
        .await;
        assert_eq!(stored, 0, "{scope}: a refused remember stored a turn");
    }
}

/// A tenant that only uses MCP: its remembers are its requests of the
/// minute (an `ask` after them is over the limit too); a message over
/// `http.max_body_bytes` is 413 `body_too_large`, as on `POST /api/query`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembers_are_requests_of_the_minute_and_the_body_cap_holds() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let api = start(&db, Opts::default().env("MAAS_HTTP__MAX_BODY_BYTES", 300_000)).await;
    let tok = limited(&db, "mcp-only", "submit", 2).await;
    let user = Uuid::new_v4();
    let huge = json!({
        "jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": { "name": "remember", "arguments": { "user_id": user, "content": "𝄞".repeat(100_000) } },
    });
    let steps = json!([
        call("remember", json!({ "user_id": user, "content": "one" })),
        call("remember", json!({ "user_id": user, "content": "two" })),
        call("remember", json!({ "user_id": user, "content": "three" })),
        call("ask", json!({ "user_id": user, "query": "how many?" })),
        { "op": "http", "method": "POST", "json": huge },
    ]);
    let r = client(&py, over_http(&api, &tok, steps)).await;
    let s = r["steps"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert_eq!((refused(&s[0]), refused(&s[1])), (None, None), "{r}");
    assert_eq!(refused(&s[2]), Some("requests_per_minute"), "{r}");
    assert_eq!(refused(&s[3]), Some("requests_per_minute"), "{r}");
    assert_eq!(
        (&s[4]["status"], &s[4]["body"]["code"]),
        (&json!(413), &json!("body_too_large")),
        "{}",
        s[4]
    );
}

/// `maasctl mcp` (stdio, a local trust) is inside its tenant's limits too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stdio_door_is_inside_the_tenants_limits_too() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let _api = start(&db, Opts::default()).await;
    limited(&db, "by-hand", "submit", 1).await;
    let user = Uuid::new_v4().to_string();
    let plan = json!({
        "stdio": {
            "command": env!("CARGO_BIN_EXE_maasctl"),
            "args": ["mcp", "--user", user, "--tenant", "by-hand"],
            "env": { "DATABASE_URL": db.url },
        },
        "steps": [
            call("remember", json!({ "content": "once" })),
            call("remember", json!({ "content": "twice" })),
        ],
    });
    let r = client(&py, plan).await;
    let s = r["steps"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert_eq!(refused(&s[0]), None, "{r}");
    assert_eq!(refused(&s[1]), Some("requests_per_minute"), "{r}");
}

/// A session is bound to the token that opened it: another tenant's token
/// naming it is 404 `session_not_found` (not the 404 of a missing route),
/// and the session goes on; its own `DELETE` ends it with 200, which the
/// SDK takes without a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_session_is_its_tokens() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let api = start(&db, Opts::default()).await;
    let globex = token(&db, "globex", "admin", None).await;
    for scope in marks("MCP: a session") {
        let shop = token(&db, "shop", scope, None).await;
        let list = json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/list" });
        let mut plan = over_http(
            &api,
            &shop,
            json!([
                { "op": "list_tools" },
                { "op": "http", "method": "DELETE", "token": globex, "session": true },
                { "op": "http", "method": "POST", "token": globex, "session": true, "json": list },
                { "op": "http", "method": "GET", "token": globex, "session": true },
                { "op": "list_tools" },
            ]),
        );
        plan["mode"] = json!("legacy");
        let r = client(&py, plan).await;
        let s = r["steps"].as_array().unwrap_or_else(|| panic!("{r}"));
        assert!(r["session_id"].is_string(), "{scope}: no session: {r}");
        for step in &s[1..4] {
            assert_eq!(step["status"], 404, "{scope}: {step}");
            assert_eq!(step["body"]["code"], "session_not_found", "{scope}: {step}");
        }
        assert_eq!(
            s[4]["tools"].as_array().map(Vec::len),
            Some(6),
            "{scope}: the session ended: {r}"
        );
        let warned = r["log"].as_array().unwrap();
        assert!(
            warned.is_empty(),
            "{scope}: the SDK warned (a DELETE not answered 200?): {r}"
        );
    }
}

/// Sessions are capped per token (429) and in total (503), both
/// `too_many_sessions`; a session's end gives its place back, and another
/// token cannot end it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_sessions_are_capped_per_token_and_in_total() {
    let db = TestDb::new().await;
    let api = start(
        &db,
        Opts::default()
            .env("MAAS_HTTP__MAX_MCP_SESSIONS", 3)
            .env("MAAS_HTTP__MAX_MCP_SESSIONS_PER_TOKEN", 2),
    )
    .await;
    let (a, b) = (
        token(&db, "shop", "read", None).await,
        token(&db, "globex", "read", None).await,
    );
    let (s1, _, a1) = open_session(&api, &a).await;
    let (s2, _, _) = open_session(&api, &a).await;
    let (s3, code, none) = open_session(&api, &a).await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK));
    assert_eq!(
        (s3, code.as_deref(), none),
        (StatusCode::TOO_MANY_REQUESTS, Some("too_many_sessions"), None)
    );
    let (s4, _, _) = open_session(&api, &b).await;
    let (s5, code, _) = open_session(&api, &b).await;
    assert_eq!(s4, StatusCode::OK);
    assert_eq!(
        (s5, code.as_deref()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("too_many_sessions"))
    );
    let r = raw(&api, &b, a1.as_deref(), Method::DELETE, None).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "another token ends no session");
    let r = raw(&api, &a, a1.as_deref(), Method::DELETE, None).await;
    assert_eq!(r.status(), StatusCode::OK);
    let (s6, _, _) = open_session(&api, &b).await;
    assert_eq!(s6, StatusCode::OK, "the ended session's place was given back");
}

/// A new session of `tok` and its open `GET` stream, past its priming event.
async fn session_stream(api: &Api, tok: &str) -> reqwest::Response {
    let (status, _, id) = open_session(api, tok).await;
    assert_eq!(status, StatusCode::OK);
    let mut get = api
        .http
        .get(api.url("/mcp"))
        .bearer_auth(tok)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", id.unwrap())
        .header("mcp-protocol-version", "2025-03-26")
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), StatusCode::OK);
    assert_eq!(sse_events(&mut get, 1, GENEROUS).await.len(), 1, "no priming event");
    get
}

/// Starts an `ask` of `tok` that waits (the answer is slow), once its
/// request exists; a second `ask` of the same token meanwhile is over the
/// per-token long-poll cap and makes no request.
async fn waiting_ask(py: &str, api: &Api, c: &tokio_postgres::Client, tok: &str) -> tokio::task::JoinHandle<Value> {
    let user = Uuid::new_v4();
    let plan = over_http(
        api,
        tok,
        json!([call("ask", json!({ "user_id": user, "query": "wait" }))]),
    );
    let waiting = py.to_owned();
    let ask = tokio::spawn(async move { client(&waiting, plan).await });
    let stored: Uuid = c
        .query_one(
            "SELECT maas_tenant_user((SELECT id FROM tenants WHERE name = 'shop'), $1)",
            &[&user],
        )
        .await
        .unwrap()
        .get(0);
    let requests = "SELECT count(*) FROM pipeline_runs WHERE user_id = $1";
    wait_until(GENEROUS, "the ask's request exists", || async {
        count(c, requests, &[&stored]).await == 1
    })
    .await;
    let again = over_http(
        api,
        tok,
        json!([call("ask", json!({ "user_id": user, "query": "again" }))]),
    );
    let second = client(py, again).await;
    assert_eq!(refused(&second["steps"][0]), Some("too_many_streams"), "{second}");
    assert_eq!(
        count(c, requests, &[&stored]).await,
        1,
        "the refused ask made a request"
    );
    ask
}

/// Once a token is revoked, its sessions' streams end and its `ask` waits
/// stop (`token_revoked`), within the token cache's periods, as its HTTP
/// streams do; a configured token's session stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_tokens_session_stream_and_ask_wait_end() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = start(
        &db,
        Opts::default()
            .env("MAAS_LLM__OFFLINE__LATENCY_MS", 120_000)
            .env("MAAS_HTTP__MAX_LONG_POLLS_PER_TOKEN", 1),
    )
    .await;
    let (mut streams, mut asks, mut toks) = (Vec::new(), Vec::new(), Vec::new());
    let asking = marks("`POST /api/query`; MCP tools");
    for scope in marks("MCP: a revoked token") {
        let tok = token(&db, "shop", scope, None).await;
        streams.push((scope, session_stream(&api, &tok).await));
        if asking.contains(&scope) {
            asks.push((scope, waiting_ask(&py, &api, &c, &tok).await));
        }
        toks.push(tok);
    }
    let mut admins = session_stream(&api, tenants::ADMIN).await;
    for tok in &toks {
        revoke(&db, tok).await;
    }
    let revoked = Instant::now();
    for (scope, mut stream) in streams {
        let deadline = tokio::time::Instant::now() + REVOKED_WITHIN;
        while let Some(chunk) = tokio::time::timeout_at(deadline, stream.chunk())
            .await
            .unwrap_or_else(|_| panic!("{scope}: the session's stream outlived its token's revocation"))
            .unwrap_or(None)
        {
            drop(chunk);
        }
    }
    for (scope, ask) in asks {
        let r = tokio::time::timeout(REVOKED_WITHIN, ask)
            .await
            .unwrap_or_else(|_| panic!("{scope}: the ask outlived its token's revocation"))
            .unwrap();
        assert_eq!(refused(&r["steps"][0]), Some("token_revoked"), "{scope}: {r}");
    }
    assert!(revoked.elapsed() < REVOKED_WITHIN, "{:?}", revoked.elapsed());
    let still = tokio::time::timeout(Duration::from_secs(1), admins.chunk()).await;
    assert!(still.is_err(), "the configured token's session stream ended: {still:?}");
}

/// A client whose stream broke mid-call (after the priming event, before
/// the result) gets the rest, the result included, from `GET` with
/// `Last-Event-ID`: the result written while nobody listened is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_stream_broke_is_resumed_with_last_event_id() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = start(&db, Opts::default().env("MAAS_LLM__OFFLINE__LATENCY_MS", 1_500)).await;
    let tok = token(&db, "shop", "submit", None).await;
    let (_, _, id) = open_session(&api, &tok).await;
    let id = id.unwrap();
    let user = Uuid::new_v4();
    let ask = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "ask", "arguments": { "user_id": user, "query": "resume me" } },
    });
    let mut call = raw(&api, &tok, Some(&id), Method::POST, Some(ask)).await;
    assert_eq!(call.status(), StatusCode::OK);
    let first = sse_events(&mut call, 1, GENEROUS).await;
    let (Some(last), data) = first[0].clone() else {
        panic!("the priming event has no id: {first:?}")
    };
    assert_eq!(data, "", "the first event primes: {first:?}");
    drop(call);
    wait_until(GENEROUS, "the ask's request completed", || async {
        count(
            &c,
            "SELECT count(*) FROM pipeline_runs WHERE user_query = 'resume me' AND status = 'COMPLETED'",
            &[],
        )
        .await
            == 1
    })
    .await;
    let mut resumed = api
        .http
        .get(api.url("/mcp"))
        .bearer_auth(&tok)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &id)
        .header("mcp-protocol-version", "2025-03-26")
        .header("last-event-id", &last)
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), StatusCode::OK);
    let events = sse_events(&mut resumed, usize::MAX, GENEROUS).await;
    let result = events
        .iter()
        .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
        .find(|m| m["id"] == 1)
        .unwrap_or_else(|| panic!("no result after Last-Event-ID {last}: {events:?}"));
    assert_eq!(result["result"]["structuredContent"]["status"], "completed", "{result}");
}

/// Without tokens a page on another port of the loopback is another site:
/// `GET /api/ws` (a WebSocket skips CORS) and `/mcp` refuse its `Origin`
/// with 403 `forbidden_origin`, as the console refuses its POSTs; this
/// server's own origin and a client without one pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_less_loopback_refuses_a_foreign_origin_on_every_transport() {
    let db = TestDb::new().await;
    let api = Api::start(&db, Opts::default()).await;
    let id = api
        .submit_accepted(&json!({ "user_id": Uuid::new_v4(), "query": "watch me" }))
        .await;
    let own = format!("http://{}", api.addr);
    let foreign = format!("http://localhost:{}", api.addr.port() + 1);
    let upgrade = |origin: Option<&str>| {
        let mut rb = api
            .http
            .get(api.url(&format!("/api/ws?request_id={id}")))
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
        if let Some(o) = origin {
            rb = rb.header("origin", o);
        }
        rb.send()
    };
    let r = upgrade(Some(&foreign)).await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "forbidden_origin", "{body}");
    for origin in [Some(own.as_str()), None] {
        let r = upgrade(origin).await.unwrap();
        assert_eq!(r.status(), StatusCode::SWITCHING_PROTOCOLS, "{origin:?}");
    }
    let mcp = |origin: &str| {
        api.http
            .post(api.url("/mcp"))
            .header("accept", "application/json, text/event-stream")
            .header("origin", origin)
            .json(&initialize())
            .send()
    };
    let r = mcp(&foreign).await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "forbidden_origin", "{body}");
    assert_eq!(mcp(&own).await.unwrap().status(), StatusCode::OK);
}
