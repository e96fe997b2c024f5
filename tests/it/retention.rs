//! Retention: old finished requests and their steps are deleted in
//! batches; open requests, memory and recent history are kept.

use uuid::Uuid;

use crate::support::count;
use crate::support::daemon::Maasd;
use crate::support::db::{TestDb, value};
use crate::support::ops::{GENEROUS, fast, status_of};
use crate::support::wait_until;

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
    let old_open: Uuid = value(
        &c,
        "INSERT INTO pipeline_runs (user_id, user_query, status, debug, held, updated_at)
             VALUES (gen_random_uuid(), 'still open', 'READY', true, true, now() - interval '40 days') RETURNING id",
        &[],
    )
    .await;
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
