//! The OpenAI-compatible endpoint driven by the official SDKs: `openai` from
//! PyPI and `openai` from npm, which bin/test installs under target/
//! (`tests/openai/client.py`, `tests/openai/client.mjs` run a plan of steps
//! and print what they saw as JSON). A real maasd answers, its responder a
//! fake OpenAI provider over real HTTP (usage 10 in / 5 out per call).
//!
//! Without the clients the tests skip, saying why; with
//! `MAAS_REQUIRE_OPENAI_CLIENT=1` (bin/test sets it when the install
//! worked) a missing client fails them instead.

use serde_json::{Value, json};

use crate::support::api::Api;
use crate::support::cli::maasctl;
use crate::support::daemon::Opts;
use crate::support::db::TestDb;
use crate::support::fake_llm::FakeLlm;
use crate::support::tenants::{ADMIN, start, token};

/// The path of an installed client from `var`, or `None` (after saying
/// why) where it is missing.
fn client_from(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(path) if std::path::Path::new(&path).exists() => Some(path),
        _ => {
            let msg = format!("no {what} ({var} unset or missing; bin/test installs it under target/)");
            if std::env::var("MAAS_REQUIRE_OPENAI_CLIENT").is_ok_and(|v| v == "1") {
                panic!("MAAS_REQUIRE_OPENAI_CLIENT=1 but {msg}");
            }
            eprintln!("SKIPPED: OpenAI SDK test: {msg}");
            None
        }
    }
}

/// Runs `program tests/openai/script` with `plan`; its report.
async fn run(program: &str, script: &str, plan: Value) -> Vec<Value> {
    let report = crate::support::run_client(program, &format!("tests/openai/{script}"), &plan).await;
    serde_json::from_value(report).expect("the report is a list")
}

/// A daemon whose responder is `fake` (the analyzer stays offline), with
/// the configured admin token and tenants.
async fn daemon(db: &TestDb, fake: &FakeLlm) -> Api {
    start(
        db,
        Opts::default()
            .env("MAAS_LLM__RESPONDER__PROVIDER", "openai")
            .env("MAAS_LLM__OPENAI__BASE_URL", fake.openai_base_url())
            .env("OPENAI_API_KEY", "fake-key")
            .env("MAAS_HTTP__OPENAI_MODELS", "gpt-4o-mini, my-alias"),
    )
    .await
}

fn plan(api: &Api, key: &str, steps: Value) -> Value {
    json!({ "base_url": format!("http://{}/v1", api.addr), "api_key": key, "steps": steps })
}

/// The context `maasctl requests show` shows of the completion `id`.
fn context_of(db: &TestDb, id: &str) -> String {
    let (code, out, err) = maasctl(&db.url, &["requests", "show", id, "--json"]);
    assert_eq!(code, 0, "maasctl requests show {id}: {err}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    shown["request"]["final_context_payload"]
        .as_str()
        .or_else(|| shown["request"]["context"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn chat(model: &str, user: &str, say: &[(&str, &str)]) -> Value {
    let messages: Vec<Value> = say.iter().map(|(r, c)| json!({"role": r, "content": c})).collect();
    json!({ "kind": "chat", "model": model, "user": user, "messages": messages })
}

#[tokio::test]
async fn the_python_sdk_remembers_across_conversations_and_tenants_stay_apart() {
    let Some(py) = client_from("MAAS_OPENAI_PYTHON", "OpenAI Python SDK") else {
        return;
    };
    let db = TestDb::new().await;
    let fake = FakeLlm::start().await;
    let api = daemon(&db, &fake).await;
    let c = db.client().await;
    let ours = token(&c, "openai-a", "app", "submit").await;
    let theirs = token(&c, "openai-b", "app", "submit").await;

    let models = run(&py, "client.py", plan(&api, &ours, json!([{ "kind": "models" }]))).await;
    let model = models[0]["ids"][0].as_str().expect("a model is offered").to_owned();
    // The responder's model first, then the configured aliases, each served.
    assert_eq!(
        models[0]["ids"].as_array().unwrap()[1..],
        [json!("gpt-4o-mini"), json!("my-alias")]
    );
    let alias = run(
        &py,
        "client.py",
        plan(&api, &ours, json!([chat("my-alias", "al", &[("user", "hi")])])),
    )
    .await;
    assert_eq!(
        (alias[0]["ok"].as_bool(), alias[0]["model"].as_str()),
        (Some(true), Some("my-alias")),
        "{alias:?}"
    );

    let first = chat(
        &model,
        "ana",
        &[("user", "My sister Olga moves to Lisbon in March; remember that.")],
    );
    let second = chat(&model, "ana", &[("user", "Where is my sister moving?")]);
    let mut streamed = chat(&model, "ana", &[("user", "What does my sister plan?")]);
    streamed["kind"] = json!("stream");
    streamed["include_usage"] = json!(true);
    let wrong = chat("no-such-model", "ana", &[("user", "hi")]);
    let report = run(
        &py,
        "client.py",
        plan(&api, &ours, json!([first, second, streamed, wrong])),
    )
    .await;
    for r in &report[..3] {
        assert_eq!(r["ok"], true, "{report:#?}");
    }
    let (one, two, three, refused) = (&report[0], &report[1], &report[2], &report[3]);
    assert_eq!(one["finish_reason"], "stop");
    assert_eq!(one["content"], "fake reply");
    assert!(one["id"].as_str().unwrap().starts_with("chatcmpl-"), "{one}");
    let tokens = one["usage"]["total_tokens"].as_i64().unwrap();
    assert!(tokens >= 15, "the responder's 10 + 5 tokens at least: {one}");
    // The second conversation's context holds the fact told in the first.
    let ctx = context_of(&db, two["id"].as_str().unwrap());
    assert!(ctx.contains("Lisbon"), "context of the second conversation: {ctx}");
    assert_eq!(three["ids"].as_array().map(Vec::len), Some(1), "{three}");
    assert_eq!(three["finish_reason"], "stop", "{three}");
    assert!(!three["content"].as_str().unwrap().is_empty(), "{three}");
    assert!(three["usage"]["total_tokens"].as_i64().unwrap() >= 15, "{three}");
    assert_eq!(
        (
            refused["status"].as_i64(),
            refused["code"].as_str(),
            refused["type"].as_str()
        ),
        (Some(404), Some("model_not_found"), Some("invalid_request_error")),
        "{refused}"
    );

    // A client that resends its history stays in the first thread, and the
    // turns maas logged are recognised, not logged twice.
    let told = "My sister Olga moves to Lisbon in March; remember that.";
    let history = chat(
        &model,
        "ana",
        &[("user", told), ("assistant", "fake reply"), ("user", "And when?")],
    );
    let report = run(&py, "client.py", plan(&api, &ours, json!([history]))).await;
    assert_eq!(report[0]["ok"], true, "{report:#?}");
    let thread_of = |id: &str| {
        let id: uuid::Uuid = id.trim_start_matches("chatcmpl-").parse().unwrap();
        let c = &c;
        async move {
            let row = c
                .query_one("SELECT thread_id FROM pipeline_runs WHERE id = $1", &[&id])
                .await
                .unwrap();
            row.get::<_, Option<uuid::Uuid>>(0)
        }
    };
    assert_eq!(
        thread_of(report[0]["id"].as_str().unwrap()).await,
        thread_of(one["id"].as_str().unwrap()).await
    );
    let logged: i64 = c
        .query_one("SELECT count(*) FROM raw_logs WHERE content = $1", &[&told])
        .await
        .unwrap()
        .get(0);
    assert_eq!(logged, 1, "the first question is logged once");

    // Another tenant's user of the same name sees nothing of ours.
    let report = run(
        &py,
        "client.py",
        plan(
            &api,
            &theirs,
            json!([chat(&model, "ana", &[("user", "Where is my sister moving?")])]),
        ),
    )
    .await;
    assert_eq!(report[0]["ok"], true, "{report:#?}");
    let ctx = context_of(&db, report[0]["id"].as_str().unwrap());
    assert!(!ctx.contains("Lisbon"), "another tenant's context: {ctx}");

    // Over the tenant's limit: 429, Retry-After, OpenAI's error shape.
    c.execute(
        "UPDATE tenants SET requests_per_minute = 1 WHERE name = 'openai-b'",
        &[],
    )
    .await
    .unwrap();
    let mut limited = Vec::new();
    let deadline = tokio::time::Instant::now() + crate::support::GENEROUS;
    while limited.is_empty() && tokio::time::Instant::now() < deadline {
        // The token's cached limits refresh within the token cache period.
        let r = run(
            &py,
            "client.py",
            plan(&api, &theirs, json!([chat(&model, "ana", &[("user", "Again?")])])),
        )
        .await;
        if r[0]["status"] == 429 {
            limited = r;
        }
    }
    let over = &limited[0];
    assert_eq!(
        (over["code"].as_str(), over["type"].as_str()),
        (Some("requests_per_minute"), Some("rate_limit_error")),
        "{over}"
    );
    assert!(
        over["retry_after"]
            .as_str()
            .is_some_and(|s| s.parse::<u64>().is_ok_and(|n| n >= 1)),
        "{over}"
    );
}

#[tokio::test]
async fn the_node_sdk_remembers_across_two_conversations() {
    let Some(node) = client_from("MAAS_OPENAI_NODE", "Node for the OpenAI npm SDK") else {
        return;
    };
    if client_from("MAAS_OPENAI_NODE_DIR", "OpenAI npm SDK").is_none() {
        return;
    }
    let db = TestDb::new().await;
    let fake = FakeLlm::start().await;
    let api = daemon(&db, &fake).await;
    let c = db.client().await;
    let key = token(&c, "openai-node", "app", "submit").await;
    let models = run(&node, "client.mjs", plan(&api, &key, json!([{ "kind": "models" }]))).await;
    let model = models[0]["ids"][0].as_str().expect("a model is offered").to_owned();
    // Two conversations: a fact told in the first (not streamed), asked
    // for in the second (streamed, with usage).
    let told = chat(
        &model,
        "bo",
        &[("user", "My brother Tomas works in Oslo; remember that.")],
    );
    let mut asked = chat(&model, "bo", &[("user", "Where does my brother work?")]);
    asked["kind"] = json!("stream");
    asked["include_usage"] = json!(true);
    let report = run(&node, "client.mjs", plan(&api, &key, json!([told, asked]))).await;
    assert_eq!(report[0]["ok"], true, "{report:#?}");
    assert_eq!(report[0]["content"], "fake reply", "{report:#?}");
    let r = &report[1];
    assert_eq!(r["ok"], true, "{report:#?}");
    assert_eq!(r["content"], "fake reply", "{r}");
    assert_eq!(r["finish_reason"], "stop", "{r}");
    assert!(r["usage"]["total_tokens"].as_i64().unwrap() >= 15, "{r}");
    assert_eq!(r["ids"].as_array().map(Vec::len), Some(1), "{r}");
    let ctx = context_of(&db, r["ids"][0].as_str().unwrap());
    assert!(ctx.contains("Oslo"), "the second conversation's context: {ctx}");
}

#[tokio::test]
async fn every_refusal_under_v1_has_openais_shape() {
    let db = TestDb::new().await;
    let fake = FakeLlm::start().await;
    let api = daemon(&db, &fake).await;
    let url = format!("http://{}/v1/chat/completions", api.addr);
    let http = reqwest::Client::new();
    let body = json!({"model": "x", "user": "u", "messages": [{"role": "user", "content": "hi"}]});
    // No token: the authentication's refusal, reshaped.
    let r = http.post(&url).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "authentication_error", "{v}");
    assert_eq!(v["error"]["code"], "unauthorized", "{v}");
    // A read token may not submit.
    let c = db.client().await;
    let reader = token(&c, "openai-r", "reader", "read").await;
    let r = http.post(&url).bearer_auth(&reader).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 403);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["error"]["type"].as_str(), v["error"]["code"].as_str()),
        (Some("permission_error"), Some("scope_required")),
        "{v}"
    );
    // No user anywhere: 400 naming the three places.
    let nobody = json!({"model": "x", "messages": [{"role": "user", "content": "hi"}]});
    let r = http.post(&url).bearer_auth(ADMIN).json(&nobody).send().await.unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert_eq!(status, 404, "an unknown model is refused before anything: {v}");
    let model = http
        .get(format!("http://{}/v1/models", api.addr))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let nobody = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let r = http.post(&url).bearer_auth(ADMIN).json(&nobody).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("user") && msg.contains("X-Maas-User"), "{v}");
    // An Idempotency-Key replays the first request, as on /api/query.
    let once = json!({"model": model, "user": "u", "stream": true, "messages": [{"role": "user", "content": "once"}]});
    let mut ids = Vec::new();
    for _ in 0..2 {
        let r = http
            .post(&url)
            .bearer_auth(ADMIN)
            .header("idempotency-key", "chat-once")
            .json(&once)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let replayed = r.headers().get("idempotent-replayed").is_some();
        let text = r.text().await.unwrap();
        let first: Value = serde_json::from_str(text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap()).unwrap();
        ids.push((first["id"].as_str().unwrap().to_owned(), replayed));
    }
    assert_eq!(ids[0].0, ids[1].0, "{ids:?}");
    assert_eq!((ids[0].1, ids[1].1), (false, true), "{ids:?}");
    // Over the body cap: the framework's 413, reshaped.
    let big = "x".repeat(2 << 20);
    let r = http
        .post(&url)
        .bearer_auth(ADMIN)
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
}
