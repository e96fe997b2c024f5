//! Operating on requests with `maasctl requests`: list, show, retry (from
//! the stage that failed), cancel (also of a running stage) and continue of
//! debug requests, against a real database and running `maasd` processes.

use nix::sys::signal::Signal;
use serde_json::Value;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::cli::maasctl;
use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{TestDb, by_name, column, value};
use crate::support::ops::{
    GENEROUS, fast, insert_one, json, status_of, sweeps, wait_listening, wait_status, wait_sweeps, watched,
};
use crate::support::{count, wait_until};

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
    let (reason, actor, detail): (String, String, Value) = by_name!(row, "reason", "actor", "detail");
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
    let id: Uuid = value(
        c,
        "INSERT INTO pipeline_runs (user_id, user_query, status, analysis_result, final_context_payload, error)
             VALUES (gen_random_uuid(), 'made by hand', 'FAILED',
                     CASE WHEN $1 THEN '{\"needs_context\": false}'::jsonb END,
                     CASE WHEN $2 THEN 'ctx' END, 'it broke')
             RETURNING id",
        &[&stages_ok.contains(&"analyze"), &stages_ok.contains(&"assemble")],
    )
    .await;
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
    let stages: Vec<String> = column(
        &c,
        "SELECT stage FROM pipeline_steps WHERE run_id = $1 AND worker <> 'old' ORDER BY id",
        &[&in_respond],
    )
    .await;
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
        by_name!(r, "lease_owner", "error")
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
    let d = Maasd::spawn(&db.url, watched());
    let plain = insert_one(&c, "not debugged").await;
    let id: Uuid = value(&c, "INSERT INTO pipeline_runs (user_id, user_query, debug) VALUES (gen_random_uuid(), 'step by step', true) RETURNING id", &[]).await;
    wait_status(&c, plain, "COMPLETED").await;
    wait_status(&c, id, "ANALYZED").await;
    // It stays there through notifications (another request's, claimed at
    // every stage) and sweeps.
    let mark = sweeps(&d);
    let traffic = insert_one(&c, "traffic").await;
    wait_status(&c, traffic, "COMPLETED").await;
    wait_sweeps(&[(&d, mark)], 2).await;
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
    let mark = sweeps(&d);
    wait_sweeps(&[(&d, mark)], 2).await;
    assert_eq!(status_of(&c, id).await, "READY", "rests again in READY");

    // Step: respond — through the library call the HTTP server uses.
    let pool = db.pool();
    let client = pool.get().await.unwrap();
    let outcome = maas::control::continue_request(&client, id, "http:alice", Some("looks right"))
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
