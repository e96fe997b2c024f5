//! Operating maas: every maasctl command of issue 6, debug mode, callbacks,
//! retention and systemd readiness, against a real database and running
//! `maasd` processes.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::cli::{maasctl, maasctl_env};
use crate::support::daemon::{Maasd, Opts};
use crate::support::db::TestDb;
use crate::support::{count, wait_until};

const GENEROUS: Duration = Duration::from_secs(60);

fn json(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

async fn status_of(c: &Client, id: Uuid) -> String {
    c.query_one("SELECT status FROM pipeline_runs WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

async fn wait_status(c: &Client, id: Uuid, want: &str) {
    wait_until(GENEROUS, &format!("{id} reaches {want}"), || async {
        status_of(c, id).await == want
    })
    .await;
}

async fn insert_one(c: &Client, query: &str) -> Uuid {
    c.query_one(
        "INSERT INTO pipeline_runs (user_id, user_query) VALUES (gen_random_uuid(), $1) RETURNING id",
        &[&query],
    )
    .await
    .unwrap()
    .get(0)
}

async fn wait_listening(c: &Client, n: i64) {
    wait_until(GENEROUS, "the daemons listen", || async {
        count(
            c,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'maasd-listener'",
        )
        .await
            >= n
    })
    .await;
}

fn fast() -> Opts {
    Opts {
        sweep_secs: 1,
        ..Opts::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_is_found_explained_and_retried() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut broken = Maasd::spawn(
        &db.url,
        fast()
            .env("MAAS_MAX_ATTEMPTS", 2)
            .env("MAAS_LLM__OFFLINE__FAIL_WHEN_QUERY_CONTAINS", "boom"),
    );
    let bad = insert_one(&c, "this goes boom").await;
    let good = insert_one(&c, "this is fine").await;
    wait_status(&c, bad, "FAILED").await;
    wait_status(&c, good, "COMPLETED").await;

    // Find it.
    let (code, out, err) = maasctl(&db.url, &["requests", "list", "--status", "failed"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&bad.to_string()), "{out}");
    assert!(!out.contains(&good.to_string()), "{out}");
    let (code, out, _) = maasctl(&db.url, &["--json", "requests", "list", "--status", "FAILED,COMPLETED"]);
    assert_eq!(code, 0);
    assert_eq!(json(&out).as_array().unwrap().len(), 2, "{out}");
    let (code, out, _) = maasctl(&db.url, &["--json", "requests", "list", "--older-than", "1h"]);
    assert_eq!(code, 0);
    assert_eq!(json(&out).as_array().unwrap().len(), 0, "nothing is an hour old: {out}");
    let (code, _, err) = maasctl(&db.url, &["requests", "list", "--status", "EXPLODED"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown status"), "{err}");

    // See why.
    let (code, out, _) = maasctl(&db.url, &["requests", "show", &bad.to_string()]);
    assert_eq!(code, 0);
    assert!(out.contains("status    FAILED"), "{out}");
    assert!(out.contains("analyze failed after 2 attempts"), "{out}");
    assert!(out.contains("injected"), "{out}");

    // Retry it once the cause is gone (a daemon without the fault).
    broken.signal(Signal::SIGTERM);
    assert_eq!(broken.wait_exit(GENEROUS).await, Some(0));
    let _fixed = Maasd::spawn(&db.url, fast());
    wait_listening(&c, 1).await;
    let (code, _, err) = maasctl(&db.url, &["requests", "retry", &bad.to_string()]);
    assert_eq!(code, 2, "--reason is required");
    assert!(err.contains("--reason"), "{err}");
    let (code, out, err) = maasctl(
        &db.url,
        &["requests", "retry", &bad.to_string(), "--reason", "provider fixed"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("analyze stage again from NEW"), "{out}");
    wait_status(&c, bad, "COMPLETED").await;
    let row = c
        .query_one(
            "SELECT reason, actor, detail FROM operator_actions WHERE run_id = $1 AND action = 'retry'",
            &[&bad],
        )
        .await
        .unwrap();
    let (reason, actor, detail): (String, String, Value) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((reason.as_str(), actor.as_str()), ("provider fixed", "night-shift"));
    assert!(detail["error"].as_str().unwrap().contains("injected"), "{detail}");
    let (code, out, _) = maasctl(&db.url, &["requests", "show", &bad.to_string()]);
    assert_eq!(code, 0);
    assert!(out.contains("retry    by night-shift"), "{out}");

    // Only FAILED requests are retried; unknown ids are a finding.
    let (code, _, err) = maasctl(&db.url, &["requests", "retry", &good.to_string(), "--reason", "x"]);
    assert_eq!(code, 1);
    assert!(err.contains("only FAILED requests"), "{err}");
    let (code, _, err) = maasctl(
        &db.url,
        &["requests", "retry", &Uuid::new_v4().to_string(), "--reason", "x"],
    );
    assert_eq!(code, 1);
    assert!(err.contains("no request"), "{err}");
}

/// A FAILED run made by hand with a step history ending in `stage`'s failure.
async fn failed_run(c: &Client, stages_ok: &[&str], failed_stage: Option<&str>) -> Uuid {
    let id: Uuid = c
        .query_one(
            "INSERT INTO pipeline_runs (user_id, user_query, status, analysis_result, final_context_payload, error)
             VALUES (gen_random_uuid(), 'made by hand', 'FAILED',
                     CASE WHEN $1 THEN '{\"needs_context\": false}'::jsonb END,
                     CASE WHEN $2 THEN 'ctx' END, 'it broke')
             RETURNING id",
            &[&stages_ok.contains(&"analyze"), &stages_ok.contains(&"assemble")],
        )
        .await
        .unwrap()
        .get(0);
    for s in stages_ok {
        c.execute(
            "INSERT INTO pipeline_steps (run_id, stage, attempt, worker, started_at, outcome)
             VALUES ($1, $2, 1, 'old', now(), 'succeeded')",
            &[&id, s],
        )
        .await
        .unwrap();
    }
    if let Some(s) = failed_stage {
        c.execute(
            "INSERT INTO pipeline_steps (run_id, stage, attempt, worker, started_at, outcome, error_class, error_message)
             VALUES ($1, $2, 3, 'old', now(), 'failed', 'timeout', 'gave up')",
            &[&id, &s],
        )
        .await
        .unwrap();
    }
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_resumes_at_the_stage_that_failed() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Pause first, so the test sees where each retry lands.
    let (code, _, err) = maasctl(&db.url, &["pause", "--reason", "look before it runs"]);
    assert_eq!(code, 0, "{err}");
    let _d = Maasd::spawn(&db.url, fast());
    wait_listening(&c, 1).await;
    let in_respond = failed_run(&c, &["analyze", "assemble"], Some("respond")).await;
    let in_assemble = failed_run(&c, &["analyze"], Some("assemble")).await;
    let by_hand = failed_run(&c, &["analyze"], None).await; // failed by hand after analyze succeeded
    let no_history = failed_run(&c, &[], None).await;

    let (code, out, err) = maasctl(
        &db.url,
        &[
            "--json",
            "requests",
            "retry",
            "--all-failed",
            "--reason",
            "after the outage",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let v = json(&out);
    assert_eq!(v["retried"].as_array().unwrap().len(), 4, "{v}");
    for (id, want) in [
        (in_respond, "READY"),
        (in_assemble, "ANALYZED"),
        (by_hand, "ANALYZED"),
        (no_history, "NEW"),
    ] {
        assert_eq!(status_of(&c, id).await, want, "{id}");
    }
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM pipeline_runs WHERE attempt <> 0 OR error IS NOT NULL"
        )
        .await,
        0,
        "attempts reset, errors cleared"
    );
    let (code, out, _) = maasctl(&db.url, &["requests", "retry", "--all-failed", "--reason", "again"]);
    assert_eq!(code, 0);
    assert!(out.contains("no FAILED requests"), "{out}");

    let (code, _, err) = maasctl(&db.url, &["resume"]);
    assert_eq!(code, 0, "{err}");
    for id in [in_respond, in_assemble, by_hand, no_history] {
        wait_status(&c, id, "COMPLETED").await;
    }
    // The respond retry ran only the respond stage again.
    let stages: Vec<String> = c
        .query(
            "SELECT stage FROM pipeline_steps WHERE run_id = $1 AND worker <> 'old' ORDER BY id",
            &[&in_respond],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(stages, vec!["respond".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_discards_a_late_result() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // The stage takes 1.5 s and the heartbeat comes every 10 s: the result
    // arrives after the cancel, before the daemon notices.
    let d = Maasd::spawn(&db.url, fast().env("MAAS_LLM__OFFLINE__LATENCY_MS", 1500));
    let id = insert_one(&c, "cancel me").await;
    wait_status(&c, id, "ANALYZING").await;
    let (code, out, err) = maasctl(
        &db.url,
        &["requests", "cancel", &id.to_string(), "--reason", "user gave up"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("was ANALYZING"), "{out}");
    let (lease_owner, error): (Option<String>, String) = {
        let r = c
            .query_one("SELECT lease_owner, error FROM pipeline_runs WHERE id = $1", &[&id])
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(lease_owner, None);
    assert_eq!(error, "cancelled by night-shift: user gave up");
    wait_until(GENEROUS, "the daemon discards the late result", || async {
        d.log_text().contains("result discarded")
    })
    .await;
    assert_eq!(status_of(&c, id).await, "CANCELLED");
    assert_eq!(
        count(&c, "SELECT count(*) FROM pipeline_steps WHERE outcome = 'succeeded'").await,
        0
    );
    let (code, _, err) = maasctl(&db.url, &["requests", "cancel", &id.to_string(), "--reason", "again"]);
    assert_eq!(code, 1);
    assert!(err.contains("already CANCELLED"), "{err}");
    let (code, out, _) = maasctl(&db.url, &["--json", "requests", "show", &id.to_string()]);
    assert_eq!(code, 0);
    let v = json(&out);
    assert_eq!(v["actions"][0]["action"], "cancel");
    assert_eq!(v["actions"][0]["from_status"], "ANALYZING");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_running_stage_through_the_heartbeat() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let d = Maasd::spawn(
        &db.url,
        Opts {
            lease_secs: 3,
            sweep_secs: 1,
            ..Opts::default()
        }
        .env("MAAS_LLM__OFFLINE__LATENCY_MS", 60_000),
    );
    let id = insert_one(&c, "a very slow one").await;
    wait_status(&c, id, "ANALYZING").await;
    let (code, _, err) = maasctl(&db.url, &["requests", "cancel", &id.to_string(), "--reason", "stuck"]);
    assert_eq!(code, 0, "{err}");
    wait_until(GENEROUS, "the heartbeat cancels the running stage", || async {
        d.log_text().contains("lease lost while the stage was running")
    })
    .await;
    assert_eq!(status_of(&c, id).await, "CANCELLED");
    // A NEW request is cancelled before any stage runs.
    let (code, _, err) = maasctl(&db.url, &["pause"]);
    assert_eq!(code, 0, "{err}");
    let waiting = insert_one(&c, "never mind").await;
    let (code, out, _) = maasctl(
        &db.url,
        &["requests", "cancel", &waiting.to_string(), "--reason", "dup"],
    );
    assert_eq!(code, 0);
    assert!(out.contains("was NEW"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debug_run_rests_in_analyzed_and_ready_until_continued() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = Maasd::spawn(&db.url, fast());
    let plain = insert_one(&c, "not debugged").await;
    let id: Uuid = c
        .query_one(
            "INSERT INTO pipeline_runs (user_id, user_query, debug) VALUES (gen_random_uuid(), 'step by step', true) RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    wait_status(&c, plain, "COMPLETED").await;
    wait_status(&c, id, "ANALYZED").await;
    // It stays there through several sweeps and notifications.
    insert_one(&c, "traffic").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(status_of(&c, id).await, "ANALYZED");
    let (code, out, _) = maasctl(&db.url, &["sweep", "--dry-run"]);
    assert_eq!(code, 0);
    assert!(out.contains("found: 0 due"), "a held run is not due: {out}");
    let (code, out, _) = maasctl(&db.url, &["requests", "show", &id.to_string()]);
    assert_eq!(code, 0);
    assert!(out.contains("HELD in ANALYZED"), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("analyze") && l.contains("succeeded")),
        "{out}"
    );
    let (code, out, _) = maasctl(&db.url, &["requests", "list"]);
    assert_eq!(code, 0);
    assert!(
        out.lines().any(|l| l.contains(&id.to_string()) && l.contains("dH")),
        "{out}"
    );
    let (code, out, _) = maasctl(&db.url, &["--json", "stats"]);
    assert_eq!(code, 0);
    let v = json(&out);
    let analyzed = v["backlog"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["status"] == "ANALYZED")
        .unwrap();
    assert_eq!(
        (analyzed["held"].as_i64(), analyzed["due"].as_i64()),
        (Some(1), Some(0)),
        "{v}"
    );

    // Step: assemble.
    let (code, out, err) = maasctl(&db.url, &["requests", "continue", &id.to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("the assemble stage will pick it up"), "{out}");
    wait_status(&c, id, "READY").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(status_of(&c, id).await, "READY", "rests again in READY");

    // Step: respond — through the library call the HTTP server uses.
    let cfg = maas::config::Config {
        database_url: maas::config::Secret(db.url.clone()),
        ..Default::default()
    };
    let pool = maas::db::connect_pool(&cfg, "test").unwrap();
    let client = pool.get().await.unwrap();
    let outcome = maas::control::continue_run(&client, id, "http:alice", Some("looks right"))
        .await
        .unwrap();
    assert_eq!(
        outcome,
        maas::control::ContinueOutcome::Released {
            status: maas::model::Status::Ready,
            next: maas::model::StageKind::Respond
        }
    );
    wait_status(&c, id, "COMPLETED").await;

    // Nothing to continue now.
    let (code, _, err) = maasctl(&db.url, &["requests", "continue", &id.to_string()]);
    assert_eq!(code, 1);
    assert!(err.contains("not held"), "{err}");
    let actions = count(
        &c,
        &format!("SELECT count(*) FROM operator_actions WHERE run_id = '{id}' AND action = 'continue'"),
    )
    .await;
    assert_eq!(actions, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_every_daemon_and_resume_restarts_them() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _a = Maasd::spawn(&db.url, fast());
    let _b = Maasd::spawn(&db.url, fast());
    wait_listening(&c, 2).await;
    let (code, out, err) = maasctl(&db.url, &["pause", "--reason", "database maintenance"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("paused"), "{out}");
    crate::support::insert_requests(&c, 30, "while paused").await;
    tokio::time::sleep(Duration::from_millis(2500)).await; // two sweeps, every notification
    assert_eq!(
        count(&c, "SELECT count(*) FROM pipeline_runs WHERE status = 'NEW'").await,
        30
    );
    let (code, out, _) = maasctl(&db.url, &["stats"]);
    assert_eq!(code, 0);
    assert!(out.contains("PAUSED") && out.contains("database maintenance"), "{out}");
    let (code, out, _) = maasctl(&db.url, &["doctor"]);
    assert_eq!(code, 0, "a pause is a warning, not a failure: {out}");
    assert!(out.contains("warn  claiming"), "{out}");

    let (code, out, err) = maasctl(&db.url, &["resume", "--reason", "done"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("resumed"), "{out}");
    crate::support::wait_all_terminal(&c, GENEROUS).await;
    crate::support::assert_completed(&c, 30).await;
    let actions: Vec<String> = c
        .query("SELECT action FROM operator_actions ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(actions, vec!["pause".to_owned(), "resume".to_owned()]);
}

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
    wait_until(GENEROUS, "five in flight", || async {
        count(&c, "SELECT count(*) FROM pipeline_runs WHERE status = 'ANALYZING'").await == 5
    })
    .await;
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

    // A reachable provider whose key is accepted; the key is never printed.
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

    // A missing trigger and an unsigned callback backlog fail by name.
    c.batch_execute(
        "DROP TRIGGER pipeline_runs_notify_insert ON pipeline_runs;
         INSERT INTO pipeline_runs (user_id, user_query, callback_url) VALUES (gen_random_uuid(), 'cb', 'http://127.0.0.1:1/hook');",
    )
    .await
    .unwrap();
    let cb: Uuid = c
        .query_one("SELECT id FROM pipeline_runs WHERE callback_url IS NOT NULL", &[])
        .await
        .unwrap()
        .get(0);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_are_versioned_and_activated_atomically() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = Maasd::spawn(&db.url, fast());
    let (code, out, err) = maasctl(&db.url, &["prompts", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("FinalResponder"), "{out}");
    let (code, out, _) = maasctl(&db.url, &["prompts", "show", "responder"]);
    assert_eq!(code, 0);
    assert!(out.contains("helpful assistant"), "{out}");

    let file = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("prompt-{}.txt", Uuid::new_v4()));
    std::fs::write(&file, "You are terse. Answer in one sentence.").unwrap();
    let (code, out, err) = maasctl(
        &db.url,
        &[
            "prompts",
            "set",
            "FinalResponder",
            file.to_str().unwrap(),
            "--reason",
            "shorter answers",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("version 2 is active") && out.contains("version 1 kept"),
        "{out}"
    );
    let (code, out, _) = maasctl(&db.url, &["prompts", "show", "finalresponder"]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "You are terse. Answer in one sentence.");
    let (code, out, _) = maasctl(&db.url, &["prompts", "show", "responder", "--version", "1"]);
    assert_eq!(code, 0);
    assert!(out.contains("helpful assistant"), "the old one is kept: {out}");
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM system_prompts WHERE role_name = 'FinalResponder' AND is_active"
        )
        .await,
        1
    );

    // Roll back; an unknown version changes nothing.
    let (code, _, err) = maasctl(&db.url, &["prompts", "activate", "responder", "9"]);
    assert_eq!(code, 1);
    assert!(err.contains("no version 9"), "{err}");
    let (code, out, _) = maasctl(&db.url, &["--json", "prompts", "list"]);
    assert_eq!(code, 0);
    let v = json(&out);
    let fr = v
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == "FinalResponder")
        .unwrap();
    assert_eq!(
        (fr["active_version"].as_i64(), fr["versions"].as_i64()),
        (Some(2), Some(2))
    );
    let (code, out, err) = maasctl(
        &db.url,
        &["prompts", "activate", "responder", "1", "--reason", "rollback"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("version 1 is active"), "{out}");
    let (code, out, _) = maasctl(&db.url, &["prompts", "show", "responder"]);
    assert_eq!(code, 0);
    assert!(out.contains("helpful assistant"), "{out}");

    let (code, _, err) = maasctl(&db.url, &["prompts", "show", "Poet"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown role"), "{err}");
    std::fs::write(&file, "  \n").unwrap();
    let (code, _, err) = maasctl(&db.url, &["prompts", "set", "Analyzer", file.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("empty"), "{err}");
    let _ = std::fs::remove_file(&file);
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM operator_actions WHERE action IN ('prompt_set', 'prompt_activate')"
        )
        .await,
        2
    );
}

/// One received callback.
#[derive(Clone, Debug)]
struct Received {
    headers: HashMap<String, String>,
    body: Bytes,
}

#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    /// Answer 500 to this many requests first.
    fail_first: Arc<Mutex<usize>>,
    /// Take this long to answer.
    slow: Duration,
}

async fn callback_receiver(fail_first: usize) -> (String, Receiver) {
    slow_callback_receiver(fail_first, Duration::ZERO).await
}

async fn slow_callback_receiver(fail_first: usize, slow: Duration) -> (String, Receiver) {
    let state = Receiver {
        got: Arc::default(),
        fail_first: Arc::new(Mutex::new(fail_first)),
        slow,
    };
    async fn hook(State(s): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
        tokio::time::sleep(s.slow).await;
        let headers = headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        s.got.lock().unwrap().push(Received { headers, body });
        let mut fail = s.fail_first.lock().unwrap();
        if *fail > 0 {
            *fail -= 1;
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::NO_CONTENT
        }
    }
    let app = Router::new().route("/hook", post(hook)).with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hook"), state)
}

const SECRET: &str = "cb-secret-for-tests";

fn callback_daemon(url: &str) -> Maasd {
    Maasd::spawn(
        url,
        fast()
            .env("MAAS_CALLBACKS__SECRET", SECRET)
            .env("MAAS_CALLBACKS__POLL_SECS", 1)
            .env("MAAS_CALLBACKS__RETRY_BASE_MS", 100)
            .env("MAAS_CALLBACKS__TIMEOUT_SECS", 2),
    )
}

fn verified(r: &Received) -> Value {
    let ts: i64 = r.headers["x-maas-timestamp"].parse().unwrap();
    assert!(
        maas::callbacks::verify(SECRET.as_bytes(), ts, &r.body, &r.headers["x-maas-signature"]),
        "bad signature: {r:?}"
    );
    serde_json::from_slice(&r.body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_are_signed_retried_and_survive_restarts() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (hook, rx) = callback_receiver(2).await;
    let mut d = callback_daemon(&db.url);
    let id: Uuid = c
        .query_one(
            "INSERT INTO pipeline_runs (user_id, user_query, callback_url) VALUES (gen_random_uuid(), 'call me back', $1) RETURNING id",
            &[&hook],
        )
        .await
        .unwrap()
        .get(0);
    wait_status(&c, id, "COMPLETED").await;
    wait_until(GENEROUS, "delivered after two 500s", || async {
        count(&c, "SELECT count(*) FROM callback_outbox WHERE state = 'delivered'").await == 1
    })
    .await;
    {
        let got = rx.got.lock().unwrap().clone();
        assert_eq!(got.len(), 3, "two failures, one success");
        let ids: Vec<&String> = got.iter().map(|r| &r.headers["x-maas-delivery"]).collect();
        assert!(
            ids.iter().all(|i| *i == ids[0]),
            "one delivery id across attempts: {ids:?}"
        );
        let body = verified(&got[2]);
        assert_eq!(body["id"], id.to_string());
        assert_eq!(body["status"], "COMPLETED");
        assert_eq!(got[2].headers["x-maas-event"], "request.completed");
        assert!(body["answer"].as_str().unwrap().starts_with("[offline]"), "{body}");
    }
    let (attempts, last_status): (i32, Option<i32>) = {
        let r = c
            .query_one("SELECT attempts, last_status FROM callback_outbox", &[])
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((attempts, last_status), (3, Some(204)));
    let (code, out, _) = maasctl(&db.url, &["requests", "show", &id.to_string()]);
    assert_eq!(code, 0);
    assert!(out.contains("request.completed") && out.contains("delivered"), "{out}");

    // With no daemon running, a cancel from psql still queues its callback;
    // the next daemon delivers it.
    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait_exit(GENEROUS).await, Some(0));
    c.execute("UPDATE maas_control SET paused = true", &[]).await.unwrap();
    let late: Uuid = c
        .query_one(
            "INSERT INTO pipeline_runs (user_id, user_query, callback_url) VALUES (gen_random_uuid(), 'cancelled by psql', $1) RETURNING id",
            &[&hook],
        )
        .await
        .unwrap()
        .get(0);
    c.execute("UPDATE pipeline_runs SET status = 'CANCELLED' WHERE id = $1", &[&late])
        .await
        .unwrap();
    assert_eq!(
        count(&c, "SELECT count(*) FROM callback_outbox WHERE state = 'pending'").await,
        1
    );
    let _d2 = callback_daemon(&db.url);
    wait_until(GENEROUS, "the restarted daemon delivers the cancel", || async {
        count(&c, "SELECT count(*) FROM callback_outbox WHERE state = 'delivered'").await == 2
    })
    .await;
    let got = rx.got.lock().unwrap().clone();
    let last = verified(got.last().unwrap());
    assert_eq!(last["id"], late.to_string());
    assert_eq!(last["status"], "CANCELLED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_deliver_each_callback_once_and_give_up_on_dead_receivers() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (hook, rx) = callback_receiver(0).await;
    let _a = callback_daemon(&db.url);
    let _b = Maasd::spawn(
        &db.url,
        fast()
            .env("MAAS_CALLBACKS__SECRET", SECRET)
            .env("MAAS_CALLBACKS__POLL_SECS", 1)
            .env("MAAS_CALLBACKS__RETRY_BASE_MS", 50)
            .env("MAAS_CALLBACKS__MAX_ATTEMPTS", 2)
            .env("MAAS_CALLBACKS__TIMEOUT_SECS", 2),
    );
    wait_listening(&c, 2).await;
    c.execute(
        "INSERT INTO pipeline_runs (user_id, user_query, callback_url)
         SELECT gen_random_uuid(), 'many ' || g, $1 FROM generate_series(1, 40) g",
        &[&hook],
    )
    .await
    .unwrap();
    crate::support::wait_all_terminal(&c, GENEROUS).await;
    wait_until(GENEROUS, "forty deliveries", || async {
        count(&c, "SELECT count(*) FROM callback_outbox WHERE state = 'delivered'").await == 40
    })
    .await;
    let got = rx.got.lock().unwrap().clone();
    let mut ids: Vec<String> = got.iter().map(|r| r.headers["x-maas-delivery"].clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 40);
    assert_eq!(got.len(), 40, "each delivery sent once");
    for r in &got {
        verified(r);
    }

    // A receiver that is gone: retried, then dead. Daemon b gives up after 2
    // attempts, daemon a after 12; whichever claims it, start it at 11.
    let gone: Uuid = c
        .query_one(
            "INSERT INTO pipeline_runs (user_id, user_query, callback_url, status)
             VALUES (gen_random_uuid(), 'nobody listens', 'http://127.0.0.1:1/hook', 'NEW') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    wait_status(&c, gone, "COMPLETED").await;
    c.execute(
        "UPDATE callback_outbox SET attempts = greatest(attempts, 11) WHERE run_id = $1",
        &[&gone],
    )
    .await
    .unwrap();
    wait_until(GENEROUS, "the undeliverable callback is dead", || async {
        count(&c, "SELECT count(*) FROM callback_outbox WHERE state = 'dead'").await == 1
    })
    .await;
    let (code, out, _) = maasctl(&db.url, &["--json", "stats"]);
    assert_eq!(code, 0);
    assert_eq!(json(&out)["callbacks"]["dead"], 1);
    let (code, out, _) = maasctl_env(&db.url, &["doctor"], &[("MAAS_CALLBACKS__SECRET", SECRET)]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("warn  callbacks") && out.contains("1 dead"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_every_slot_busy_claims_again_when_one_frees() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Each delivery takes 300 ms, longer than the runs take to complete, so
    // most deliveries are due after the last terminal transition woke the
    // worker: with one slot and a poll far away, only freed slots drive them.
    let (hook, rx) = slow_callback_receiver(0, Duration::from_millis(300)).await;
    let _d = Maasd::spawn(
        &db.url,
        fast()
            .env("MAAS_CALLBACKS__SECRET", SECRET)
            .env("MAAS_CALLBACKS__POLL_SECS", 600)
            .env("MAAS_CALLBACKS__CONCURRENCY", 1),
    );
    wait_listening(&c, 1).await;
    c.execute(
        "INSERT INTO pipeline_runs (user_id, user_query, callback_url)
         SELECT gen_random_uuid(), 'one by one ' || g, $1 FROM generate_series(1, 10) g",
        &[&hook],
    )
    .await
    .unwrap();
    crate::support::wait_all_terminal(&c, GENEROUS).await;
    wait_until(Duration::from_secs(20), "ten deliveries, one at a time", || async {
        count(&c, "SELECT count(*) FROM callback_outbox WHERE state = 'delivered'").await == 10
    })
    .await;
    assert_eq!(rx.got.lock().unwrap().len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_old_finished_runs_in_batches() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.batch_execute(
        "INSERT INTO pipeline_runs (user_id, user_query, status, error, updated_at, created_at)
         SELECT gen_random_uuid(), 'old ' || g, (ARRAY['COMPLETED','FAILED','CANCELLED'])[1 + g % 3], 'e',
                now() - interval '40 days', now() - interval '41 days'
         FROM generate_series(1, 25) g;
         INSERT INTO pipeline_steps (run_id, stage, attempt, worker, started_at, outcome)
         SELECT id, 'analyze', 1, 'w', now() - interval '40 days', 'succeeded' FROM pipeline_runs;
         INSERT INTO pipeline_runs (user_id, user_query, status, final_answer, updated_at)
         SELECT gen_random_uuid(), 'recent ' || g, 'COMPLETED', 'a', now() - interval '3 days'
         FROM generate_series(1, 5) g;
         INSERT INTO operator_actions (action, actor, at) VALUES ('pause', 'old', now() - interval '40 days'),
                                                                ('resume', 'new', now());",
    )
    .await
    .unwrap();
    // An unfinished run that is old is never deleted (held for debugging).
    let old_open: Uuid = c
        .query_one(
            "INSERT INTO pipeline_runs (user_id, user_query, status, debug, held, updated_at)
             VALUES (gen_random_uuid(), 'still open', 'READY', true, true, now() - interval '40 days') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let raw_logs = count(&c, "SELECT count(*) FROM raw_logs").await;
    let d = Maasd::spawn(
        &db.url,
        fast()
            .env("MAAS_RETENTION__KEEP_DAYS", 30)
            .env("MAAS_RETENTION__INTERVAL_SECS", 1)
            .env("MAAS_RETENTION__BATCH", 7),
    );
    wait_until(GENEROUS, "the old finished runs are gone", || async {
        count(&c, "SELECT count(*) FROM pipeline_runs WHERE user_query LIKE 'old %'").await == 0
    })
    .await;
    assert_eq!(
        count(&c, "SELECT count(*) FROM pipeline_steps").await,
        0,
        "steps go with their runs"
    );
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM pipeline_runs WHERE user_query LIKE 'recent %'"
        )
        .await,
        5
    );
    assert_eq!(status_of(&c, old_open).await, "READY");
    assert_eq!(
        count(&c, "SELECT count(*) FROM raw_logs").await,
        raw_logs,
        "memory is kept"
    );
    wait_until(GENEROUS, "the old operator action is gone", || async {
        count(&c, "SELECT count(*) FROM operator_actions").await == 1
    })
    .await;
    wait_until(GENEROUS, "the daemon logs what it deleted", || async {
        d.log_text().contains("retention: deleted")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maasd_is_ready_only_when_migrated_and_listening_and_feeds_the_watchdog() {
    use std::os::unix::net::UnixDatagram;
    let db = TestDb::empty().await; // maasd must migrate it first
    let c = db.client().await;
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("notify");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}.sock", Uuid::new_v4().simple()));
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut d = Maasd::spawn(
        &db.url,
        fast()
            .env("NOTIFY_SOCKET", path.display())
            .env("WATCHDOG_USEC", 1_000_000),
    );
    let deadline = std::time::Instant::now() + GENEROUS;
    let mut messages: Vec<String> = Vec::new();
    let mut buf = [0u8; 4096];
    let recv = |messages: &mut Vec<String>, buf: &mut [u8]| {
        if let Ok(n) = sock.recv(buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            true
        } else {
            false
        }
    };
    while !messages.iter().any(|m| m.contains("READY=1")) {
        assert!(std::time::Instant::now() < deadline, "no READY=1: {messages:?}");
        recv(&mut messages, &mut buf);
    }
    // At READY the schema is migrated and the LISTEN session exists.
    let version: i32 = c
        .query_one("SELECT max(version) FROM maas_migrations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, maas::db::migrate::latest_version());
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'maasd-listener'"
        )
        .await,
        1
    );
    // The watchdog is fed (every half interval).
    let before = messages.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        recv(&mut messages, &mut buf);
    }
    let after = messages.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    assert!(after - before >= 3, "watchdog pings: {messages:?}");
    d.signal(Signal::SIGTERM);
    let deadline = std::time::Instant::now() + GENEROUS;
    while !messages.iter().any(|m| m.contains("STOPPING=1")) {
        assert!(std::time::Instant::now() < deadline, "no STOPPING=1: {messages:?}");
        recv(&mut messages, &mut buf);
    }
    assert_eq!(d.wait_exit(GENEROUS).await, Some(0));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_unit_file_passes_the_exposure_bar() {
    let unit = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/maasd.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    for line in ["Type=notify", "WatchdogSec=", "Restart=on-failure", "TimeoutStopSec=45"] {
        assert!(text.contains(line), "{line} missing from the unit");
    }
    // TimeoutStopSec must exceed the default grace period.
    assert!(45 > maas::config::Config::default().grace_secs);
    let out = match Command::new("systemd-analyze")
        .args(["security", "--offline=yes"])
        .arg(&unit)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("SKIPPED the exposure check: systemd-analyze is not available ({e})");
            return;
        }
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let Some(level) = text
        .lines()
        .find_map(|l| l.split("Overall exposure level for maasd.service:").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
    else {
        if text.contains("--offline") || text.contains("unrecognized option") {
            eprintln!("SKIPPED the exposure check: this systemd-analyze has no --offline mode:\n{text}");
            return;
        }
        panic!("no exposure level in the output:\n{text}");
    };
    assert!(level <= 2.0, "exposure {level} is above 2.0:\n{text}");
}
