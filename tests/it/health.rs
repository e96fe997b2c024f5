//! `maasctl stats` and `maasctl doctor`: backlog, failure rate and leases
//! by daemon; each health check named when it fails, API keys never printed.

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use uuid::Uuid;

use crate::support::cli::{maasctl, maasctl_env};
use crate::support::daemon::Maasd;
use crate::support::db::{TestDb, value};
use crate::support::ops::{fast, json, wait_listening};
use crate::support::wait_analyzing;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_shows_backlog_failure_rate_and_leases_by_daemon() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(
        "INSERT INTO pipeline_runs (user_id, user_query, status, final_answer)
         SELECT gen_random_uuid(), 'done', 'COMPLETED', 'a' FROM generate_series(1, 3);
         INSERT INTO pipeline_runs (user_id, user_query, status, error)
         VALUES (gen_random_uuid(), 'bad', 'FAILED', 'x');",
    )
    .await
    .unwrap();
    let _slow = Maasd::spawn(&db.url, fast().env("MAAS_LLM__OFFLINE__LATENCY_MS", 60_000));
    crate::support::insert_requests(&c, 5, "slow").await;
    wait_analyzing(&c, 5, "five in flight").await;
    let (code, out, err) = maasctl(&db.url, &["--json", "stats", "--window", "15m"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["paused"], false);
    assert_eq!(v["daemons_listening"], 1);
    assert_eq!(v["finished"]["completed"], 3);
    assert_eq!(v["finished"]["failed"], 1);
    assert!((v["failure_rate"].as_f64().unwrap() - 0.25).abs() < 1e-9, "{v}");
    assert_eq!(v["leases"][0]["held"], 5);
    assert_eq!(v["leases"][0]["expired"], 0);
    let analyzing = v["backlog"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["status"] == "ANALYZING")
        .unwrap();
    assert_eq!(analyzing["total"], 5);
    let (code, out, _) = maasctl(&db.url, &["stats"]);
    assert_eq!(code, 0);
    assert!(out.contains("leases by daemon"), "{out}");
    assert!(out.contains("failure rate 25.0 %"), "{out}");
    assert!(out.contains("daemons   1 listening"), "{out}");
}

/// A stand-in for an OpenAI-compatible provider: the model list answers 200
/// with the right key and 401 otherwise.
async fn fake_provider(key: &'static str) -> String {
    let app = Router::new().route(
        "/v1/models",
        get(move |headers: HeaderMap| async move {
            let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
            if auth == format!("Bearer {key}") {
                (StatusCode::OK, "{\"data\": []}")
            } else {
                (StatusCode::UNAUTHORIZED, "{\"error\": \"bad key\"}")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/v1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_passes_when_healthy_and_names_each_failed_check() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (code, out, _) = maasctl(&db.url, &["doctor"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("warn  daemons"), "no daemon yet is a warning: {out}");
    let _d = Maasd::spawn(&db.url, fast());
    wait_listening(&c, 1).await;
    let (code, out, _) = maasctl(&db.url, &["doctor"]);
    assert_eq!(code, 0, "{out}");
    for line in [
        "ok    database",
        "ok    schema",
        "ok    triggers",
        "ok    notify ",
        "ok    daemons",
        "ok    llm.responder",
    ] {
        assert!(out.contains(line), "{line:?} in:\n{out}");
    }
    assert!(out.contains("round trip in"), "{out}");

    doctor_checks_the_provider_and_never_prints_its_key(&db).await;
    doctor_names_a_missing_trigger_and_an_unsigned_callback_backlog(&db, &c).await;
}

/// A reachable provider whose key is accepted, one that rejects it, and an
/// unreachable one; the key is never printed.
async fn doctor_checks_the_provider_and_never_prints_its_key(db: &TestDb) {
    let key = "sk-test-0123456789-secret";
    let base = fake_provider(key).await;
    let env = [
        ("MAAS_LLM_PROVIDER", "openai"),
        ("OPENAI_BASE_URL", base.as_str()),
        ("OPENAI_API_KEY", key),
    ];
    let (code, out, err) = maasctl_env(&db.url, &["doctor"], &env);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("ok    llm.analyzer") && out.contains("key accepted"),
        "{out}"
    );
    assert!(!out.contains(key) && !err.contains(key), "the key leaked:\n{out}{err}");
    let (code, out, _) = maasctl_env(
        &db.url,
        &["--json", "doctor"],
        &[
            ("MAAS_LLM_PROVIDER", "openai"),
            ("OPENAI_BASE_URL", base.as_str()),
            ("OPENAI_API_KEY", "sk-wrong"),
        ],
    );
    assert_eq!(code, 1);
    let v = json(&out);
    let llm = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "llm.analyzer")
        .unwrap();
    assert_eq!(llm["level"], "fail");
    assert!(llm["detail"].as_str().unwrap().contains("key was rejected"), "{llm}");
    assert!(!out.contains("sk-wrong"), "{out}");
    // An unreachable provider.
    let (code, out, _) = maasctl_env(
        &db.url,
        &["doctor"],
        &[
            ("MAAS_LLM_PROVIDER", "anthropic"),
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:1"),
            ("ANTHROPIC_API_KEY", key),
        ],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  llm.responder") && out.contains("unreachable"),
        "{out}"
    );
    assert!(!out.contains(key), "{out}");
}

/// A missing trigger and an unsigned callback backlog fail by name.
async fn doctor_names_a_missing_trigger_and_an_unsigned_callback_backlog(db: &TestDb, c: &tokio_postgres::Client) {
    c.batch_execute(
        "DROP TRIGGER pipeline_runs_notify_insert ON pipeline_runs;
         INSERT INTO pipeline_runs (user_id, user_query, callback_url) VALUES (gen_random_uuid(), 'cb', 'http://127.0.0.1:1/hook');",
    )
    .await
    .unwrap();
    let cb: Uuid = value(c, "SELECT id FROM pipeline_runs WHERE callback_url IS NOT NULL", &[]).await;
    maasctl(&db.url, &["requests", "cancel", &cb.to_string(), "--reason", "test"]);
    let (code, out, _) = maasctl(&db.url, &["doctor"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  triggers") && out.contains("pipeline_runs_notify_insert"),
        "{out}"
    );
    assert!(
        out.contains("FAIL  callbacks") && out.contains("callbacks.secret"),
        "{out}"
    );
    assert!(out.contains("2 check(s) failed"), "{out}");
}
