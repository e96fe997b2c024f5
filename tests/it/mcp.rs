//! The MCP server driven by a real client: the official Python SDK (`mcp`
//! from PyPI), which bin/test installs into a private venv
//! (`target/mcp-venv`). The client script (tests/mcp/client.py) runs a
//! plan of steps and prints what it saw as JSON; these tests assert on it.
//!
//! Without the venv the tests skip, saying why; with
//! `MAAS_REQUIRE_MCP_CLIENT=1` (bin/test sets it when the install worked) a
//! missing client fails them instead.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::daemon::Opts;
use crate::support::db::TestDb;
use crate::support::tenants::{get, start};

mod conformance;
mod doors;
mod elicit;

/// The venv's Python, or `None` (after saying why) where it is missing.
fn python() -> Option<String> {
    let path = std::env::var("MAAS_MCP_PYTHON")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/target/mcp-venv/bin/python").to_owned());
    if std::path::Path::new(&path).exists() {
        return Some(path);
    }
    let msg = format!("no MCP client at {path} (bin/test installs the Python `mcp` package there)");
    if std::env::var("MAAS_REQUIRE_MCP_CLIENT").is_ok_and(|v| v == "1") {
        panic!("MAAS_REQUIRE_MCP_CLIENT=1 but {msg}");
    }
    eprintln!("SKIPPED: MCP client test: {msg}");
    None
}

/// Runs the client with `plan`; its report.
async fn client(py: &str, plan: Value) -> Value {
    crate::support::run_client(py, "tests/mcp/client.py", &plan).await
}

/// A plan for the HTTP transport of `api` with `token`.
fn over_http(api: &Api, token: &str, steps: Value) -> Value {
    json!({ "url": api.url("/mcp"), "token": token, "steps": steps })
}

/// Adds tenant `tenant` (if new) and a token of it with `scope`, bound to
/// `user` when given (as `maasctl tokens create … --user` does).
async fn token(db: &TestDb, tenant: &str, scope: &str, user: Option<Uuid>) -> String {
    let c = db.client().await;
    let tok = crate::support::tenants::token(&c, tenant, &format!("mcp-{}", Uuid::new_v4().simple()), scope).await;
    let hash: Vec<u8> = Sha256::digest(tok.as_bytes()).to_vec();
    c.execute(
        "UPDATE api_tokens SET user_id = $1 WHERE token_sha256 = $2",
        &[&user, &hash],
    )
    .await
    .unwrap();
    tok
}

fn call(tool: &str, args: Value) -> Value {
    json!({ "op": "call", "tool": tool, "args": args })
}

/// The `code` of a step's tool error (`None`: it succeeded).
fn refused(step: &Value) -> Option<&str> {
    step["is_error"].as_bool().filter(|e| *e)?;
    step["body"]["code"].as_str().or(Some("?"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_lists_the_tools_and_remembers_recalls_and_asks_for_its_user() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let api = start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let tok = token(&db, "acme", "admin", Some(user)).await;
    let steps = json!([
        { "op": "list_tools" },
        call("remember", json!({ "content": "My sister Ana moves to Lisbon in May." })),
        call("recall", json!({ "query": "where is my sister moving", "limit": 5 })),
        call("ask", json!({ "query": "Where is my sister moving?", "thread_id": "$1.structured.thread_id" })),
        { "op": "list_resources" },
        { "op": "read", "uri": format!("maas://users/{user}/threads") },
        { "op": "read", "uri": format!("maas://users/{user}/memory") },
        call("recall", json!({ "query": "sister", "user_id": Uuid::new_v4() })),
        call("recall", json!({ "query": "sister", "limit": 1000 })),
        call("recall", json!({ "limit": "many" })),
        call("correct", json!({ "action": "delete_turn", "id": "$1.structured.turn_id" })),
    ]);
    let r = client(&py, over_http(&api, &tok, steps)).await;
    let s = r["steps"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert_eq!(r["server"]["name"], "maas", "{r}");
    assert!(r["protocol_version"].as_str().is_some(), "{r}");
    let mut names: Vec<&str> = s[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["ask", "correct", "forget", "recall", "remember", "reply"]);
    for t in s[0]["tools"].as_array().unwrap() {
        assert!(t["description"].as_str().unwrap().len() > 80, "{t}");
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
    }
    assert_eq!(refused(&s[1]), None, "{}", s[1]);
    assert_eq!(s[1]["structured"]["user_id"], user.to_string());
    let hit = &s[2]["structured"]["items"][0];
    assert!(hit["content"].as_str().unwrap().contains("Lisbon"), "{}", s[2]);
    assert_eq!(hit["source"]["kind"], "turn");
    assert_eq!(hit["source"]["id"], s[1]["structured"]["turn_id"]);
    assert!(
        hit["date"].as_str().is_some() && hit["score"].as_f64().is_some(),
        "{hit}"
    );
    assert_eq!(s[3]["structured"]["status"], "completed", "{}", s[3]);
    assert!(s[3]["structured"]["answer"].as_str().is_some_and(|a| !a.is_empty()));
    assert!(s[3]["structured"]["context_sources"].is_array(), "{}", s[3]);
    assert!(
        !s[3]["progress"].as_array().unwrap().is_empty(),
        "no progress: {}",
        s[3]
    );
    assert_eq!(s[4]["resources"].as_array().unwrap().len(), 2, "{}", s[4]);
    let threads: Value = serde_json::from_str(s[5]["contents"][0]["text"].as_str().unwrap()).unwrap();
    assert!(
        threads["threads"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["thread_id"] == s[1]["structured"]["thread_id"]),
        "{threads}"
    );
    assert!(s[6]["contents"][0]["text"].as_str().unwrap().contains("pending_turns"));
    assert_eq!(refused(&s[7]), Some("user_not_allowed"), "{}", s[7]);
    assert!(s[7]["body"]["error"].as_str().unwrap().contains("user_id"));
    assert_eq!(refused(&s[8]), Some("invalid_argument"), "{}", s[8]);
    assert!(s[9]["is_error"] == true || s[9]["exception"].is_string(), "{}", s[9]);
    assert_eq!(refused(&s[10]), None, "{}", s[10]);
}

#[tokio::test(flavor = "multi_thread")]
async fn scopes_tenants_and_bound_users_are_refused_on_every_door() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let api = start(&db, Opts::default()).await;
    let (ana, bob) = (Uuid::new_v4(), Uuid::new_v4());
    let acme = token(&db, "acme", "admin", None).await;
    let reader = token(&db, "acme", "read", Some(ana)).await;
    let other = token(&db, "globex", "admin", None).await;
    // acme remembers for ana; a reader may recall but not remember or forget.
    let r = client(
        &py,
        over_http(
            &api,
            &acme,
            json!([
                call(
                    "remember",
                    json!({ "user_id": ana, "content": "Ana's cat is called Miso." })
                ),
                call("remember", json!({ "content": "no user" })),
            ]),
        ),
    )
    .await;
    assert_eq!(refused(&r["steps"][0]), None, "{r}");
    assert_eq!(refused(&r["steps"][1]), Some("missing_argument"), "{r}");
    let r = client(
        &py,
        over_http(
            &api,
            &reader,
            json!([
                call("recall", json!({ "query": "cat" })),
                call("remember", json!({ "content": "x" })),
                call("forget", json!({})),
                call("correct", json!({ "action": "delete_record", "id": 1 })),
            ]),
        ),
    )
    .await;
    let s = &r["steps"];
    assert!(
        s[0]["structured"]["items"][0]["content"]
            .as_str()
            .unwrap()
            .contains("Miso"),
        "{r}"
    );
    for i in 1..4 {
        assert_eq!(refused(&s[i]), Some("scope_required"), "{r}");
    }
    // Another tenant's user of the same id holds nothing.
    let r = client(
        &py,
        over_http(
            &api,
            &other,
            json!([call("recall", json!({ "user_id": ana, "query": "cat" }))]),
        ),
    )
    .await;
    assert_eq!(refused(&r["steps"][0]), Some("unknown_user"), "{r}");
    // No token: no session at all.
    let r = client(&py, over_http(&api, "", json!([{ "op": "list_tools" }]))).await;
    assert!(r["connect_error"].is_string(), "{r}");
    // The bound reader on the HTTP API: its user only; the search route is
    // the same search as recall.
    let (s, body) = get(&api, &reader, &format!("/api/users/{bob}/memory")).await;
    assert_eq!(
        (s, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("user_not_allowed"))
    );
    let (s, body) = get(&api, &reader, &format!("/api/users/{ana}/memory/search?q=cat&limit=3")).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert!(body["hits"][0]["content"].as_str().unwrap().contains("Miso"), "{body}");
    let (s, body) = get(
        &api,
        &reader,
        &format!("/api/users/{ana}/memory/search?q=cat&when=yesterday"),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert!(body["time_range"].is_array(), "{body}");
    // An admin forgets ana; her memory is gone.
    let r = client(
        &py,
        over_http(
            &api,
            &acme,
            json!([call("forget", json!({ "user_id": ana, "reason": "asked to" }))]),
        ),
    )
    .await;
    assert_eq!(r["steps"][0]["structured"]["status"], "erasing", "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_of_an_older_revision_and_a_foreign_origin() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let api = start(&db, Opts::default()).await;
    let tok = token(&db, "acme", "submit", Some(Uuid::new_v4())).await;
    let mut plan = over_http(&api, &tok, json!([{ "op": "list_tools" }]));
    plan["mode"] = json!("legacy");
    let r = client(&py, plan).await;
    assert_eq!(r["steps"][0]["tools"].as_array().map(Vec::len), Some(6), "{r}");
    let mut plan = over_http(&api, &tok, json!([{ "op": "list_tools" }]));
    plan["headers"] = json!({ "Origin": "http://evil.example" });
    let r = client(&py, plan).await;
    assert!(r["connect_error"].is_string(), "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn maasctl_mcp_serves_one_user_over_stdio() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let _api = start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let user_arg = user.to_string();
    let plan = json!({
        "stdio": {
            "command": env!("CARGO_BIN_EXE_maasctl"),
            "args": ["mcp", "--user", user_arg],
            "env": { "DATABASE_URL": db.url },
        },
        "steps": [
            call("remember", json!({ "content": "I run every Tuesday at 7." })),
            call("recall", json!({ "query": "when do I run" })),
            call("recall", json!({ "query": "run", "user_id": Uuid::new_v4() })),
            call("ask", json!({ "query": "When do I run?" })),
        ],
    });
    let r = client(&py, plan).await;
    let s = r["steps"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert_eq!(refused(&s[0]), None, "{r}");
    assert!(
        s[1]["structured"]["items"][0]["content"]
            .as_str()
            .unwrap()
            .contains("Tuesday"),
        "{r}"
    );
    assert_eq!(refused(&s[2]), Some("user_not_allowed"), "{r}");
    assert_eq!(s[3]["structured"]["status"], "completed", "{r}");
}

/// A token bound to one user reaches only that user's requests on the
/// routes that name a request by id: another user's of the same tenant
/// reads as absent (404), as another tenant's does.
#[tokio::test(flavor = "multi_thread")]
async fn a_bound_token_sees_only_its_users_requests_by_id() {
    let db = TestDb::new().await;
    let api = start(&db, Opts::default()).await;
    let (ana, bob) = (Uuid::new_v4(), Uuid::new_v4());
    let acme = token(&db, "acme", "admin", None).await;
    let reader = token(&db, "acme", "read", Some(ana)).await;
    let operator = token(&db, "acme", "operate", Some(ana)).await;
    let thread = Uuid::new_v4();
    let of_ana = crate::support::tenants::submit_ok(&api, &acme, ana, thread, "mine").await;
    let of_bob = crate::support::tenants::submit_ok(&api, &acme, bob, Uuid::new_v4(), "his").await;
    let (s, body) = get(&api, &reader, &format!("/api/query/{of_ana}/status")).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    for path in [
        format!("/api/query/{of_bob}/status"),
        format!("/api/query/{of_bob}/events"),
    ] {
        let (s, body) = get(&api, &reader, &path).await;
        assert_eq!(
            (s, body["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_found")),
            "{path}: {body}"
        );
    }
    let (s, body) = get(&api, &acme, &format!("/api/query/{of_bob}/status")).await;
    assert_eq!(s, StatusCode::OK, "the unbound token sees every user's: {body}");
    let (s, body, _) = crate::support::tenants::send(
        &operator,
        api.http
            .post(api.url(&format!("/api/query/{of_bob}/cancel")))
            .json(&json!({ "reason": "not hers" })),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
}

/// With `clarify`, `ask` of a vague query returns the question (status
/// `waiting_user_input`); `reply` answers it and returns the answer, whose
/// context holds the reply; a second `reply` is refused (`not_waiting`).
#[tokio::test(flavor = "multi_thread")]
async fn ask_with_clarify_returns_the_question_and_reply_answers_it() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let api = start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let tok = token(&db, "acme", "submit", Some(user)).await;
    let steps = json!([call("ask", json!({ "query": "And that one?", "clarify": true }))]);
    let r = client(&py, over_http(&api, &tok, steps)).await;
    let s = r["steps"].as_array().unwrap_or_else(|| panic!("{r}"));
    let asked = &s[0]["structured"];
    assert_eq!(asked["status"], "waiting_user_input", "{r}");
    assert!(
        asked["question"].as_str().is_some_and(|q| q.contains("And that one?")),
        "{r}"
    );
    let id: Uuid = asked["request_id"].as_str().unwrap().parse().unwrap();
    let steps = json!([
        call("reply", json!({ "request_id": id, "text": "the bees" })),
        call("reply", json!({ "request_id": id, "text": "again" })),
    ]);
    let r = client(&py, over_http(&api, &tok, steps)).await;
    let s = r["steps"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert_eq!(s[0]["structured"]["status"], "completed", "{r}");
    assert_eq!(refused(&s[1]), Some("not_waiting"), "{r}");
    let c = db.client().await;
    let context: String = crate::support::db::value(
        &c,
        "SELECT final_context_payload FROM pipeline_runs WHERE id = $1",
        &[&id],
    )
    .await;
    assert!(context.contains("the bees"), "{context}");
}

/// `ask` with `review: true`: the answer awaits an operator's review, so
/// the wait ends (at its timeout) without it, naming the status; the
/// request rests in AWAITING_REVIEW with the answer stored.
#[tokio::test(flavor = "multi_thread")]
async fn ask_with_review_waits_for_the_operator() {
    let Some(py) = python() else { return };
    let db = TestDb::new().await;
    let api = start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let tok = token(&db, "acme", "submit", Some(user)).await;
    let steps = json!([call(
        "ask",
        json!({ "query": "Where is my sister moving?", "review": true, "timeout_secs": 3 })
    )]);
    let r = client(&py, over_http(&api, &tok, steps)).await;
    let s = r["steps"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert_eq!(refused(&s[0]), None, "{}", s[0]);
    assert_eq!(s[0]["structured"]["status"], "awaiting_review", "{}", s[0]);
    assert!(
        s[0]["structured"]["answer"].is_null(),
        "no answer before review: {}",
        s[0]
    );
    let id: Uuid = s[0]["structured"]["request_id"].as_str().unwrap().parse().unwrap();
    let c = db.client().await;
    let row = c
        .query_one(
            "SELECT status, review, final_answer IS NOT NULL AS answered FROM pipeline_runs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>("status"),
            row.get::<_, Option<bool>>("review"),
            row.get::<_, bool>("answered")
        ),
        ("AWAITING_REVIEW".to_owned(), Some(true), true)
    );
}
