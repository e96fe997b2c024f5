//! The orchestrator against real PostgreSQL and real `maasd` processes.

use std::time::Duration;

use maas::db::devdb::{Cluster, ClusterSpec, ensure_database};
use nix::sys::signal::Signal;
use uuid::Uuid;

use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{TestDb, by_name, column, connect, rows, value};
use crate::support::{
    GENEROUS, assert_all_completed_once, assert_completed, assert_each_stage_succeeded_once, assert_no_lease_held,
    assert_one_answer_logged, count, insert_requests, wait_all_terminal, wait_analyzing, wait_until,
};

/// A 2 s lease and a sweep every second: a lost daemon's work is due again soon.
fn short_lease() -> Opts {
    Opts {
        lease_secs: 2,
        sweep_secs: 1,
        ..Opts::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_rows_inserted_by_sql_all_complete_once() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = Maasd::spawn(&db.url, Opts::default());
    insert_requests(&c, 200, "what did we discuss").await;
    assert_all_completed_once(&c, 200).await;
    // Exactly one step row per stage per request: nothing ran twice.
    assert_eq!(count(&c, "SELECT count(*) FROM pipeline_steps").await, 600);
    let answer: String = value(&c, "SELECT final_answer FROM pipeline_runs LIMIT 1", &[]).await;
    assert!(answer.starts_with("[offline]"), "{answer}");
    // Leases are all released.
    assert_no_lease_held(&c).await;
}

/// Few slots per stage: rows chained into a full stage wait for a slot while
/// holding the one they finished with, and every freed slot reaches a
/// waiting dispatcher. The sweep is far away, so it cannot be what finishes
/// the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_slot_per_stage_freed_slots_alone_drive_every_row_to_completion() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let opts = Opts {
        sweep_secs: 600,
        ..Opts::default()
    }
    .env("MAAS_CONCURRENCY__ANALYZE", 1)
    .env("MAAS_CONCURRENCY__ASSEMBLE", 1)
    .env("MAAS_CONCURRENCY__RESPOND", 2)
    .env("MAAS_CLAIM_BATCH", 1);
    let _d = Maasd::spawn(&db.url, opts);
    insert_requests(&c, 120, "a narrow pipeline").await;
    assert_all_completed_once(&c, 120).await;
    assert_no_lease_held(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backends_reconnect_sweep_and_finish() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = Maasd::spawn(
        &db.url,
        Opts {
            sweep_secs: 2,
            ..Opts::default()
        },
    );
    let listener_pid = || async {
        c.query_opt(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'maasd-listener'",
            &[],
        )
        .await
        .unwrap()
        .map(|r| r.get::<_, i32>(0))
    };
    wait_until(GENEROUS, "the daemon listens", || async {
        listener_pid().await.is_some()
    })
    .await;
    let first = listener_pid().await;
    let mut terminated = 0i64;
    for round in 0..6 {
        insert_requests(&c, 25, &format!("round {round}")).await;
        terminated += c
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name LIKE 'maasd%'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(terminated >= 6, "the daemon's backends were terminated ({terminated})");
    assert_all_completed_once(&c, 150).await;
    wait_until(GENEROUS, "the listener is back on a new session", || async {
        matches!((listener_pid().await, first), (Some(now), Some(before)) if now != before)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_notify_trigger_the_sweep_alone_completes_everything() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let sweep = 1;
    let mut d = Maasd::spawn(
        &db.url,
        Opts {
            sweep_secs: sweep,
            ..Opts::default()
        },
    );
    wait_until(GENEROUS, "the daemon listens", || async {
        count(&c, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'maasd-listener'").await == 1
    })
    .await;
    c.batch_execute(
        "DROP TRIGGER pipeline_runs_notify_insert ON pipeline_runs;
         DROP TRIGGER pipeline_runs_notify_update ON pipeline_runs;",
    )
    .await
    .unwrap();
    insert_requests(&c, 50, "no doorbell").await;
    // Three stages, each found by a sweep at the latest one interval (with
    // 10% jitter) after it became due; allow generous slack for a loaded CI.
    wait_all_terminal(&c, Duration::from_secs(3 * sweep + 20)).await;
    assert_completed(&c, 50).await;
    assert_each_stage_succeeded_once(&c).await;
    assert!(d.is_running());
    let log = d.log_text();
    assert!(
        log.contains("no notification delivered"),
        "the sweep reports what it recovered:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_on_one_database_never_run_a_stage_twice() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Neither daemon can take a whole batch (50 analyze slots each, for
    // batches of 100), and a slot stays busy for 300 ms: the other daemon,
    // rung by the same notifications, claims the rest long before.
    let shared = || {
        Opts::default()
            .env("MAAS_CONCURRENCY__ANALYZE", 50)
            .env("MAAS_LLM__OFFLINE__LATENCY_MS", 300)
    };
    let _a = Maasd::spawn(&db.url, shared());
    let _b = Maasd::spawn(&db.url, shared());
    for _ in 0..4 {
        insert_requests(&c, 100, "shared").await;
    }
    assert_all_completed_once(&c, 400).await;
    // Every attempt leaves a step row, so one row per (request, stage)
    // means no stage ran twice.
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM (SELECT run_id, stage FROM pipeline_steps GROUP BY 1, 2 HAVING count(*) > 1) x"
        )
        .await,
        0
    );
    assert_eq!(count(&c, "SELECT count(*) FROM pipeline_steps").await, 1200);
    let workers = count(&c, "SELECT count(DISTINCT worker) FROM pipeline_steps").await;
    assert_eq!(workers, 2, "both daemons took part");
}

/// Claims commit without waiting for their WAL flush, so a database crash
/// can forget a claim while the daemon that made it runs the stage. The row
/// is then due again; the same daemon claims it anew (a new token), stops
/// the stale attempt, and the request completes with each stage succeeded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_database_forgot_is_claimed_again_and_runs_once() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // A 60 s lease: no heartbeat (every 20 s) notices the lost lease first.
    let d = Maasd::spawn(
        &db.url,
        Opts {
            lease_secs: 60,
            sweep_secs: 1,
            ..Opts::default()
        }
        .env("MAAS_LLM__OFFLINE__LATENCY_MS", 3000),
    );
    let id = insert_requests(&c, 1, "forgotten").await[0];
    wait_analyzing(&c, 1, "the request is claimed").await;
    crate::support::forget_claim(&c, id).await;
    assert_all_completed_once(&c, 1).await;
    assert_eq!(count(&c, "SELECT count(*) FROM pipeline_steps").await, 3);
    let log = d.plain_log();
    assert!(
        log.contains("claimed a row this process still ran under an older lease"),
        "the stale attempt was not stopped:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_stage_is_recovered_after_its_lease() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut slow = Maasd::spawn(&db.url, short_lease().env("MAAS_LLM__OFFLINE__LATENCY_MS", 60_000));
    let ids = insert_requests(&c, 10, "interrupted").await;
    wait_analyzing(&c, 10, "all ten in flight in the slow daemon").await;
    let owner: String = value(&c, "SELECT DISTINCT lease_owner FROM pipeline_runs", &[]).await;
    slow.kill();
    let _rescuer = Maasd::spawn(&db.url, short_lease());
    assert_all_completed_once(&c, 10).await;
    for id in ids {
        let steps: Vec<(String, String, i32, String)> = rows(
            &c,
            "SELECT stage, outcome, attempt, worker FROM pipeline_steps WHERE run_id = $1 ORDER BY id",
            &[&id],
            |r| by_name!(r, "stage", "outcome", "attempt", "worker"),
        )
        .await;
        assert_eq!(steps.len(), 4, "{steps:?}");
        assert_eq!(
            (
                steps[0].0.as_str(),
                steps[0].1.as_str(),
                steps[0].2,
                steps[0].3.as_str()
            ),
            ("analyze", "lease_expired", 1, owner.as_str()),
            "the interrupted attempt is visible"
        );
        assert_eq!(
            (steps[1].0.as_str(), steps[1].1.as_str(), steps[1].2),
            ("analyze", "succeeded", 2),
            "attempt counted"
        );
        assert_ne!(steps[1].3, owner);
        assert_one_answer_logged(&c, id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_row_fails_after_max_attempts_and_holds_nobody_back() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = Maasd::spawn(
        &db.url,
        Opts::default().env("MAAS_LLM__OFFLINE__FAIL_WHEN_QUERY_CONTAINS", "POISON"),
    );
    let poison: Uuid = value(
        &c,
        "INSERT INTO pipeline_runs (user_id, user_query) VALUES (gen_random_uuid(), 'this is POISON') RETURNING id",
        &[],
    )
    .await;
    insert_requests(&c, 30, "healthy").await;
    wait_all_terminal(&c, GENEROUS).await;
    assert_completed(&c, 30).await;
    let row = c
        .query_one(
            "SELECT status, error, attempt FROM pipeline_runs WHERE id = $1",
            &[&poison],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>("status"), "FAILED");
    let error: String = row.get("error");
    assert!(
        error.contains("after 3 attempts") && error.contains("injected"),
        "{error}"
    );
    assert_eq!(row.get::<_, i32>("attempt"), 3);
    let outcomes: Vec<String> = column(
        &c,
        "SELECT outcome FROM pipeline_steps WHERE run_id = $1 ORDER BY id",
        &[&poison],
    )
    .await;
    assert_eq!(outcomes, ["retrying", "retrying", "failed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_on_the_channel_leaves_the_daemon_healthy() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut d = Maasd::spawn(&db.url, Opts::default());
    // The session shows up when it connects; its first query is LISTEN, so
    // a non-empty `query` means notifications from now on reach it.
    wait_until(GENEROUS, "the daemon listens", || async {
        count(&c, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'maasd-listener' AND query <> ''").await == 1
    })
    .await;
    let missing = Uuid::new_v4();
    for payload in [
        "garbage".to_owned(),
        "{}".to_owned(),
        "[1,2,3]".to_owned(),
        r#"{"id":"not-a-uuid","status":"NEW"}"#.to_owned(),
        format!(r#"{{"id":"{missing}","status":"EXPLODED","operation":"UPDATE"}}"#),
        format!(r#"{{"id":"{missing}","status":"NEW","operation":"INSERT"}}"#),
        "x".repeat(7000),
    ] {
        c.execute("SELECT pg_notify('pipeline_events', $1)", &[&payload])
            .await
            .unwrap();
    }
    insert_requests(&c, 20, "after the junk").await;
    wait_all_terminal(&c, GENEROUS).await;
    assert_completed(&c, 20).await;
    assert!(d.is_running());
    let log = d.log_text();
    let skipped = log.matches("skipped a notification").count();
    assert_eq!(skipped, 6, "each junk payload is logged once:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_running_stages_without_spending_attempts() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut slow = Maasd::spawn(
        &db.url,
        Opts::default()
            .env("MAAS_LLM__OFFLINE__LATENCY_MS", 60_000)
            .env("MAAS_GRACE_SECS", 1),
    );
    insert_requests(&c, 5, "released").await;
    wait_analyzing(&c, 5, "all five in flight").await;
    slow.signal(Signal::SIGTERM);
    assert_eq!(
        slow.wait_exit(Duration::from_secs(30)).await,
        Some(0),
        "clean exit:\n{}",
        slow.log_text()
    );
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM pipeline_runs WHERE status = 'NEW' AND attempt = 0 AND lease_owner IS NULL"
        )
        .await,
        5
    );
    assert_eq!(
        count(&c, "SELECT count(*) FROM pipeline_steps WHERE outcome = 'released'").await,
        5
    );
    let _next = Maasd::spawn(&db.url, Opts::default());
    wait_all_terminal(&c, GENEROUS).await;
    assert_completed(&c, 5).await;
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM pipeline_steps WHERE stage = 'analyze' AND outcome = 'succeeded' AND attempt = 1"
        )
        .await,
        5,
        "the released attempt was not spent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_daemon_cannot_overwrite_what_another_did() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let frozen = Maasd::spawn(&db.url, short_lease().env("MAAS_LLM__OFFLINE__LATENCY_MS", 1500));
    insert_requests(&c, 5, "frozen").await;
    wait_analyzing(&c, 5, "all five in flight").await;
    frozen.signal(Signal::SIGSTOP);
    let _other = Maasd::spawn(&db.url, short_lease());
    wait_all_terminal(&c, GENEROUS).await;
    frozen.signal(Signal::SIGCONT);
    // The woken daemon finishes its stale attempts; every one is fenced out.
    wait_until(GENEROUS, "the woken daemon reports its lost leases", || async {
        frozen.log_text().matches("lease lost").count() >= 5
    })
    .await;
    assert_completed(&c, 5).await;
    assert_each_stage_succeeded_once(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_mid_run_the_daemon_reconnects_and_finishes() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("restart-pg-{}", Uuid::new_v4().simple()));
    // Durable commits: an immediate (crash-like) stop then loses nothing
    // that was acknowledged, which is what the daemon relies on.
    let spec = ClusterSpec {
        dir: dir.clone(),
        port: None,
        durable: true,
        max_connections: 50,
    };
    let cluster = tokio::task::spawn_blocking(move || Cluster::ensure(&spec))
        .await
        .unwrap()
        .unwrap();
    struct Destroy(Cluster, std::path::PathBuf);
    impl Drop for Destroy {
        fn drop(&mut self) {
            let _ = self.0.destroy();
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let guard = Destroy(cluster.clone(), dir);
    ensure_database(&cluster.url("postgres"), "maas").await.unwrap();
    let url = cluster.url("maas");
    let mut d = Maasd::spawn(
        &url,
        Opts {
            sweep_secs: 1,
            ..Opts::default()
        }
        .env("MAAS_LLM__OFFLINE__LATENCY_MS", 20),
    );
    wait_until(GENEROUS, "migrated by the daemon", || async {
        let c = connect(&url).await;
        c.query_opt(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'maasd-listener'",
            &[],
        )
        .await
        .ok()
        .flatten()
        .is_some()
    })
    .await;
    let c = connect(&url).await;
    insert_requests(&c, 100, "before the restart").await;
    drop(c);
    let cl = cluster.clone();
    tokio::task::spawn_blocking(move || cl.restart(true))
        .await
        .unwrap()
        .unwrap();
    let c = connect(&url).await;
    insert_requests(&c, 100, "after the restart").await;
    assert_all_completed_once(&c, 200).await;
    assert!(d.is_running());
    drop(c);
    d.kill();
    drop(guard);
}
