//! maasctl against a real database.

use std::process::Command;

use uuid::Uuid;

use crate::support::cli::maasctl;
use crate::support::db::{TestDb, value};

#[tokio::test]
async fn migrate_installs_and_reports_the_schema() {
    let db = TestDb::empty().await;
    let (code, out, err) = maasctl(&db.url, &["migrate", "--check"]);
    assert_eq!(code, 1, "an empty database is not current: {out}{err}");
    let (code, out, err) = maasctl(&db.url, &["migrate"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("applied 0001_pipeline.sql"), "{out}");
    let (code, out, _) = maasctl(&db.url, &["migrate"]);
    assert_eq!(code, 0);
    assert!(out.contains("no pending migrations"), "{out}");
    let (code, out, err) = maasctl(&db.url, &["--json", "migrate", "--check"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["current"], true);
}

#[tokio::test]
async fn sweep_reports_and_recovers_expired_leases() {
    let db = TestDb::new().await;
    let c = db.client().await;
    crate::support::insert_requests(&c, 3, "due").await;
    let stuck: Uuid = value(&c, "INSERT INTO pipeline_runs (user_id, user_query, status, attempt, lease_owner, lease_expires_at, lease_token)
             VALUES (gen_random_uuid(), 'stuck', 'RESPONDING', 1, 'gone:1:dead', now() - interval '1 minute', 1) RETURNING id", &[]).await;
    let (code, out, err) = maasctl(&db.url, &["sweep", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("expired leases: 1"), "{out}");
    assert!(out.contains("found: 3 due"), "{out}");
    let status: String = value(&c, "SELECT status FROM pipeline_runs WHERE id = $1", &[&stuck]).await;
    assert_eq!(status, "RESPONDING", "a dry run changes nothing");

    let (code, out, err) = maasctl(&db.url, &["--json", "sweep"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["recovered"][0]["id"], stuck.to_string());
    assert_eq!(v["recovered"][0]["now"], "READY");
    assert_eq!(v["found_total"], 4);
    assert_eq!(v["dispatched"], 2, "one doorbell each for NEW and READY");
}

#[tokio::test]
async fn requests_show_prints_the_run_and_its_steps() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let id: Uuid = value(
        &c,
        "INSERT INTO pipeline_runs (user_id, user_query) VALUES (gen_random_uuid(), 'show me') RETURNING id",
        &[],
    )
    .await;
    c.execute(
        "INSERT INTO pipeline_steps (run_id, stage, attempt, worker, started_at, outcome, error_class, error_message)
         VALUES ($1, 'analyze', 1, 'w1', now(), 'retrying', 'timeout', 'provider timed out')",
        &[&id],
    )
    .await
    .unwrap();
    let (code, out, err) = maasctl(&db.url, &["requests", "show", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("status    NEW"), "{out}");
    assert!(out.contains("timeout: provider timed out"), "{out}");
    let (code, out, _) = maasctl(&db.url, &["--json", "requests", "show", &id.to_string()]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["request"]["user_query"], "show me");
    assert_eq!(v["steps"][0]["outcome"], "retrying");
    let (code, _, err) = maasctl(&db.url, &["requests", "show", &Uuid::new_v4().to_string()]);
    assert_eq!(code, 1, "unknown id: {err}");
    let (code, _, err) = maasctl(&db.url, &["requests", "show", "not-an-id"]);
    assert_eq!(code, 2);
    assert!(err.contains("not a request id"), "{err}");
}

#[test]
fn a_missing_database_url_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_maasctl"))
        .args(["migrate"])
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("DATABASE_URL"), "{err}");
}
