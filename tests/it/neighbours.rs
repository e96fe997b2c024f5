//! Bad neighbours on the database: a producer's transaction left open on
//! one user's rows holds up nobody else, and that user's request only until
//! the transaction ends.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use tokio_postgres::{Client, Transaction};
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::daemon::Opts;
use crate::support::db::{TestDb, connect, value};
use crate::support::{GENEROUS, count, insert_held, new_users, release, wait_until};

/// Held requests of `n` other users and of a victim (the last): (the
/// victim, the others, every request's id, the victim's request).
async fn a_victim_among(c: &Client, n: usize) -> (Uuid, Vec<Uuid>, Vec<Uuid>, Uuid) {
    let victim = Uuid::new_v4();
    let others = new_users(n);
    let mut users = others.clone();
    users.push(victim);
    let ids = insert_held(c, &users).await;
    let victim_id = value(c, "SELECT id FROM pipeline_runs WHERE user_id = $1", &[&victim]).await;
    (victim, others, ids, victim_id)
}

/// A turn of `victim` inserted by `producer` and not committed: it holds
/// the victim's archive_marks row until the transaction ends.
async fn uncommitted_turn<'a>(producer: &'a mut Client, victim: Uuid, content: &str) -> Transaction<'a> {
    let tx = producer.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO raw_logs (user_id, message_type, content) VALUES ($1, 'user_query', $2)",
        &[&victim, &content],
    )
    .await
    .unwrap();
    tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_producer_transaction_on_one_user_holds_up_only_that_user() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default().env("MAAS_DB__LOCK_TIMEOUT_MS", 1000)).await;

    let (victim, others, ids, victim_id) = a_victim_among(&c, 40).await;

    // The producer: a turn of the victim inserted and not committed. It
    // holds the victim's archive_marks row (triggers/0004).
    let mut producer = connect(&db.url).await;
    let tx = uncommitted_turn(&mut producer, victim, "typed in psql").await;

    // Everyone's requests become due at once, so the answers share batches.
    release(&c).await;
    let started = Instant::now();
    wait_until(GENEROUS, "every other user's request completed", || async {
        count(
            &c,
            &format!("SELECT count(*) FROM pipeline_runs WHERE status = 'COMPLETED' AND user_id <> '{victim}'"),
        )
        .await
            == i64::try_from(others.len()).unwrap()
    })
    .await;
    let others_took = started.elapsed();
    assert_eq!(
        count(
            &c,
            &format!(
                "SELECT count(*) FROM pipeline_steps s JOIN pipeline_runs r ON r.id = s.run_id
                 WHERE r.user_id <> '{victim}' AND s.outcome <> 'succeeded'"
            ),
        )
        .await,
        0,
        "no other request lost a lease or an attempt"
    );
    assert!(others_took < Duration::from_secs(20), "others took {others_took:?}");

    // The victim's own submit is refused quickly with a reason, not held.
    let t = Instant::now();
    let resp = api.submit(&json!({"user_id": victim, "query": "again"})).await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(resp.headers().get("retry-after").is_some());
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "database_busy", "{body}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // Another user's submit is not.
    let resp = api.submit(&json!({"user_id": Uuid::new_v4(), "query": "hi"})).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);

    // The victim waits while the transaction is open ...
    let status: String = value(&c, "SELECT status FROM pipeline_runs WHERE id = $1", &[&victim_id]).await;
    assert_ne!(status, "COMPLETED");
    // ... and completes once it ends.
    tx.commit().await.unwrap();
    wait_until(GENEROUS, "the victim's request completed", || async {
        let s: String = value(&c, "SELECT status FROM pipeline_runs WHERE id = $1", &[&victim_id]).await;
        s == "COMPLETED"
    })
    .await;
    assert_eq!(
        count(
            &c,
            &format!(
                "SELECT count(*) FROM raw_logs WHERE request_id = '{victim_id}' AND message_type = 'assistant_response'"
            )
        )
        .await,
        1
    );
    assert_eq!(ids.len(), others.len() + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_row_locked_elsewhere_does_not_stop_the_heartbeat_of_the_others() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Stages of 4 s under leases of 2 s: only heartbeats keep them.
    let api = Api::start(
        &db,
        Opts {
            lease_secs: 2,
            ..Opts::default()
        }
        .env("MAAS_DB__LOCK_TIMEOUT_MS", 300)
        .env("MAAS_LLM__OFFLINE__LATENCY_MS", 4000),
    )
    .await;
    let users: Vec<Uuid> = new_users(10);
    let ids = insert_held(&c, &users).await;
    let victim = ids[0];
    release(&c).await;
    wait_until(GENEROUS, "every request is analyzing", || async {
        count(&c, "SELECT count(*) FROM pipeline_runs WHERE status = 'ANALYZING'").await == 10
    })
    .await;
    // An operator's transaction holds one running request's row.
    let mut operator = connect(&db.url).await;
    let tx = operator.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM pipeline_runs WHERE id = $1 FOR UPDATE", &[&victim])
        .await
        .unwrap();
    wait_until(GENEROUS, "the other requests completed", || async {
        count(
            &c,
            &format!("SELECT count(*) FROM pipeline_runs WHERE status = 'COMPLETED' AND id <> '{victim}'"),
        )
        .await
            == 9
    })
    .await;
    assert_eq!(
        count(
            &c,
            &format!("SELECT count(*) FROM pipeline_steps WHERE run_id <> '{victim}' AND outcome <> 'succeeded'"),
        )
        .await,
        0,
        "no other request lost a lease:\n{}",
        api.d.plain_log()
    );
    tx.rollback().await.unwrap();
    wait_until(GENEROUS, "the victim completed", || async {
        let s: String = value(&c, "SELECT status FROM pipeline_runs WHERE id = $1", &[&victim]).await;
        s == "COMPLETED"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_that_never_commits_fails_only_that_users_request_with_a_reason() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _api = Api::start(&db, Opts::default().env("MAAS_DB__LOCK_TIMEOUT_MS", 200)).await;
    let (victim, _, _, victim_id) = a_victim_among(&c, 10).await;
    let mut producer = connect(&db.url).await;
    let tx = uncommitted_turn(&mut producer, victim, "never committed").await;
    release(&c).await;
    let started = Instant::now();
    wait_until(GENEROUS, "the victim's request ended", || async {
        let s: String = value(&c, "SELECT status FROM pipeline_runs WHERE id = $1", &[&victim_id]).await;
        s == "FAILED"
    })
    .await;
    let took = started.elapsed();
    let error: String = value(&c, "SELECT error FROM pipeline_runs WHERE id = $1", &[&victim_id]).await;
    assert!(error.contains("locked by another transaction"), "{error}");
    assert!(error.contains("failed after 3 attempts"), "{error}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert_eq!(
        count(
            &c,
            &format!("SELECT count(*) FROM pipeline_runs WHERE status = 'COMPLETED' AND user_id <> '{victim}'")
        )
        .await,
        10
    );
    // No answer was logged for the victim, and no lease ran out.
    assert_eq!(
        count(
            &c,
            &format!(
                "SELECT count(*) FROM raw_logs WHERE request_id = '{victim_id}' AND message_type = 'assistant_response'"
            )
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM pipeline_steps WHERE outcome = 'lease_expired'"
        )
        .await,
        0
    );
    tx.rollback().await.unwrap();
}
