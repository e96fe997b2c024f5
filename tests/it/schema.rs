//! The schema, migrations, triggers and named queries against a real database.

use std::time::Duration;

use maas::db::migrate;
use maas::repo;
use uuid::Uuid;

use crate::support::count;
use crate::support::db::{TestDb, by_name, column, connect, rows, value};

#[tokio::test]
async fn a_plain_insert_is_all_another_application_needs() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let row = c
        .query_one(
            "INSERT INTO pipeline_runs (user_id, user_query) VALUES ($1, 'hello') RETURNING id, status, attempt, debug",
            &[&user],
        )
        .await
        .unwrap();
    let id: Uuid = row.get("id");
    assert_eq!(row.get::<_, String>("status"), "NEW");
    assert_eq!(row.get::<_, i32>("attempt"), 0);
    assert!(!row.get::<_, bool>("debug"));
    // The logger's first half: the query is in raw_logs, once.
    let logged: i64 = value(&c, "SELECT count(*) FROM raw_logs WHERE request_id = $1 AND user_id = $2 AND message_type = 'user_query' AND content = 'hello'", &[&id, &user]).await;
    assert_eq!(logged, 1);
}

/// The first 48 bits of a version-7 UUID: Unix time in milliseconds.
fn uuid7_millis(id: Uuid) -> i64 {
    id.as_bytes()[..6].iter().fold(0i64, |ms, b| (ms << 8) | i64::from(*b))
}

#[tokio::test]
async fn a_request_id_is_ordered_by_when_it_was_inserted() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let clock = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8";
    let before: i64 = value(&c, clock, &[]).await;
    // One statement of many rows, as a bulk producer writes them.
    let rows = c
        .query(
            "INSERT INTO pipeline_runs (user_id, user_query)
             SELECT gen_random_uuid(), 'question ' || g FROM generate_series(1, 2000) g
             RETURNING id, user_query",
            &[],
        )
        .await
        .unwrap();
    let after: i64 = value(&c, clock, &[]).await;
    let mut ids: Vec<(i64, Uuid)> = rows
        .iter()
        .map(|r| {
            let q: String = r.get("user_query");
            (q["question ".len()..].parse().unwrap(), r.get("id"))
        })
        .collect();
    ids.sort();
    for (_, id) in &ids {
        assert_eq!(id.get_version_num(), 7, "{id} is not a version-7 UUID");
        assert_eq!(id.as_bytes()[8] >> 6, 0b10, "{id} has not the RFC variant");
        let ms = uuid7_millis(*id);
        assert!(
            (before..=after).contains(&ms),
            "{id} names {ms} ms, inserted between {before} and {after}"
        );
    }
    assert!(
        ids.windows(2).all(|w| uuid7_millis(w[0].1) <= uuid7_millis(w[1].1)),
        "a later row of the statement got an earlier time"
    );
    let distinct: std::collections::HashSet<Uuid> = ids.iter().map(|(_, id)| *id).collect();
    assert_eq!(distinct.len(), ids.len(), "two rows got the same id");
}

#[tokio::test]
async fn the_database_refuses_bad_rows() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let bogus = c
        .execute(
            "INSERT INTO pipeline_runs (user_id, user_query, status) VALUES ($1, 'q', 'BOGUS')",
            &[&user],
        )
        .await
        .unwrap_err();
    assert!(
        bogus.to_string().contains("pipeline_runs_status_valid")
            || format!("{bogus:?}").contains("pipeline_runs_status_valid")
    );
    let empty = c
        .execute(
            "INSERT INTO pipeline_runs (user_id, user_query) VALUES ($1, '   ')",
            &[&user],
        )
        .await
        .unwrap_err();
    assert!(format!("{empty:?}").contains("pipeline_runs_query_not_empty"));
    let huge = "x".repeat(100_001);
    let too_big = c
        .execute(
            "INSERT INTO pipeline_runs (user_id, user_query) VALUES ($1, $2)",
            &[&user, &huge],
        )
        .await
        .unwrap_err();
    assert!(format!("{too_big:?}").contains("pipeline_runs_query_size"));
    // An in-flight status without a lease is refused.
    let no_lease = c
        .execute(
            "INSERT INTO pipeline_runs (user_id, user_query, status) VALUES ($1, 'q', 'ANALYZING')",
            &[&user],
        )
        .await
        .unwrap_err();
    assert!(format!("{no_lease:?}").contains("pipeline_runs_lease_matches_status"));
    assert_eq!(count(&c, "SELECT count(*) FROM pipeline_runs").await, 0);
    // Each role has one active default prompt.
    let roles = count(
        &c,
        "SELECT count(DISTINCT role_name) FROM system_prompts WHERE is_active",
    )
    .await;
    assert_eq!(roles, 4);
}

/// A LISTEN session on `pipeline_events` and the payloads it receives (the
/// session lives as long as the returned client).
async fn listen(db: &TestDb) -> (tokio_postgres::Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let (listener, mut conn) = db
        .url
        .parse::<tokio_postgres::Config>()
        .unwrap()
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        use futures_util::StreamExt;
        let mut s = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = s.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    listener.batch_execute("LISTEN pipeline_events").await.unwrap();
    (listener, rx)
}

/// The next `n` notifications of `rx`, each as (request, status); panics
/// when one takes more than five seconds.
async fn next_events(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, n: usize) -> Vec<(Uuid, String)> {
    let mut seen = Vec::new();
    while seen.len() < n {
        let payload = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a notification")
            .unwrap();
        let ev = maas::listener::parse_payload(&payload).unwrap();
        // A status passed inside the statement says so (no daemon claims on it).
        let passed = if ev.passed { " passed" } else { "" };
        seen.push((ev.id, format!("{}{passed}", ev.status.as_str())));
    }
    seen
}

/// Asserts that `rx` receives nothing more within 300 ms.
async fn assert_silent(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, why: &str) {
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rx.recv())
            .await
            .is_err(),
        "{why}"
    );
}

#[tokio::test]
async fn the_trigger_rings_on_insert_and_status_change_only() {
    let db = TestDb::new().await;
    let (_listener, mut rx) = listen(&db).await;
    let c = db.client().await;
    let id: Uuid = value(
        &c,
        "INSERT INTO pipeline_runs (user_id, user_query) VALUES (gen_random_uuid(), 'q') RETURNING id",
        &[],
    )
    .await;
    c.execute("UPDATE pipeline_runs SET error = 'x' WHERE id = $1", &[&id])
        .await
        .unwrap();
    c.execute("UPDATE pipeline_runs SET status = 'CANCELLED' WHERE id = $1", &[&id])
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    let ev1 = maas::listener::parse_payload(&first).unwrap();
    let ev2 = maas::listener::parse_payload(&second).unwrap();
    assert_eq!(
        (ev1.id, ev1.status.as_str(), ev1.operation.as_str()),
        (id, "NEW", "INSERT")
    );
    assert_eq!(
        (ev2.id, ev2.status.as_str(), ev2.operation.as_str()),
        (id, "CANCELLED", "UPDATE")
    );
    // The payload names the row; it never carries it.
    let v: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(v.as_object().unwrap().len(), 3);
    assert_silent(&mut rx, "the non-status update rang nothing").await;
}

#[tokio::test]
async fn every_named_query_prepares_against_the_schema() {
    let db = TestDb::new().await;
    let c = db.client().await;
    for (name, sql) in repo::all() {
        if let Err(e) = c.prepare(sql).await {
            panic!("query {name} does not prepare: {e:?}");
        }
    }
}

/// Rows are read by column name: every result column of every statement
/// has a name of its own (no `?column?`, no two alike).
#[tokio::test]
async fn every_named_query_names_its_columns() {
    let db = TestDb::new().await;
    let c = db.client().await;
    for (name, sql) in repo::all() {
        let stmt = c.prepare(sql).await.unwrap();
        let columns: Vec<&str> = stmt.columns().iter().map(|c| c.name()).collect();
        assert!(
            !columns.contains(&"?column?"),
            "query {name} has an unnamed column: {columns:?}"
        );
        let mut unique = columns.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            columns.len(),
            "query {name} repeats a column name: {columns:?}"
        );
    }
}

#[tokio::test]
async fn concurrent_migrations_apply_once() {
    let db = TestDb::empty().await;
    let mut handles = Vec::new();
    for _ in 0..4 {
        let url = db.url.clone();
        handles.push(tokio::spawn(async move {
            let mut c = connect(&url).await;
            migrate::migrate(&mut c, false).await
        }));
    }
    let mut applied = 0;
    for h in handles {
        let report = h.await.unwrap().unwrap();
        applied += report.applied.len();
    }
    assert_eq!(
        applied,
        migrate::MIGRATIONS.len(),
        "each migration applied exactly once"
    );
    let c = db.client().await;
    let state = migrate::state(&c).await.unwrap();
    assert!(state.is_current(), "{state:?}");
}

#[tokio::test]
async fn a_changed_or_unknown_migration_is_refused() {
    let db = TestDb::new().await;
    let mut c = db.client().await;
    c.execute("UPDATE maas_migrations SET checksum = 'edited' WHERE version = 1", &[])
        .await
        .unwrap();
    let err = migrate::migrate(&mut c, false).await.unwrap_err().to_string();
    assert!(err.contains("changed after it was applied"), "{err}");
    c.execute(
        "UPDATE maas_migrations SET checksum = $1 WHERE version = 1",
        &[&migrate::checksum(migrate::MIGRATIONS[0].sql)],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO maas_migrations (version, name, checksum) VALUES (999, '0999_future.sql', 'x')",
        &[],
    )
    .await
    .unwrap();
    let err = migrate::migrate(&mut c, false).await.unwrap_err().to_string();
    assert!(err.contains("does not know"), "{err}");
}

#[tokio::test]
async fn a_dropped_trigger_is_reinstalled_by_migrate() {
    let db = TestDb::new().await;
    let mut c = db.client().await;
    c.batch_execute("DROP TRIGGER pipeline_runs_notify_insert ON pipeline_runs")
        .await
        .unwrap();
    let state = migrate::state(&c).await.unwrap();
    assert_eq!(state.missing_triggers, vec!["pipeline_runs_notify_insert".to_owned()]);
    let report = migrate::migrate(&mut c, false).await.unwrap();
    assert_eq!(report.triggers, vec!["0001_notify_pipeline_change.sql".to_owned()]);
    assert!(migrate::state(&c).await.unwrap().is_current());
}

/// A fresh test database with the daemon's kind of connection pool on it,
/// one connection from that pool and a plain client; the pool is returned
/// so that it lives as long as the test.
async fn daemon_setup() -> (
    TestDb,
    maas::db::Pool,
    deadpool_postgres::Object,
    tokio_postgres::Client,
) {
    let db = TestDb::new().await;
    let pool = db.pool();
    let client = pool.get().await.unwrap();
    let c = db.client().await;
    (db, pool, client, c)
}

/// The lease every claim in these tests takes.
const LEASE: Duration = Duration::from_secs(30);

/// Claims up to `limit` due requests for analyze as `worker`, with [`LEASE`].
async fn claim_analyze(client: &impl maas::repo::GenericClient, limit: usize, worker: &str) -> Vec<repo::Claimed> {
    repo::claim_next(client, maas::model::StageKind::Analyze, limit, worker, LEASE, 20)
        .await
        .unwrap()
}

/// Inserts a request (a debug request if `debug`); returns its id.
async fn insert_run(c: &tokio_postgres::Client, debug: bool) -> Uuid {
    c.query_one(
        "INSERT INTO pipeline_runs (user_id, user_query, debug) VALUES (gen_random_uuid(), 'q', $1) RETURNING id",
        &[&debug],
    )
    .await
    .unwrap()
    .get(0)
}

/// A writer whose lease was lost changes nothing.
#[tokio::test]
async fn a_stale_writer_is_fenced_out() {
    let (_db, _pool, client, c) = daemon_setup().await;
    let id = insert_run(&c, false).await;
    let a = claim_analyze(&client, 10, "worker-a").await;
    assert_eq!(a.len(), 1);
    // A's lease runs out; the sweep takes the row back; B claims it.
    c.execute(
        "UPDATE pipeline_runs SET lease_expires_at = now() - interval '1 s' WHERE id = $1",
        &[&id],
    )
    .await
    .unwrap();
    let back = repo::reclaim_expired(&client, 3, 100).await.unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].new_status, maas::model::Status::New);
    let b = claim_analyze(&client, 10, "worker-b").await;
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].attempt, 2, "the expired attempt was counted");
    let result = |row: &repo::Claimed, text: &str| {
        let analysis = serde_json::json!({"by": text});
        repo::Finished::succeeded(
            row,
            repo::Output::Analysis { analysis, fused: None },
            Default::default(),
            None,
        )
    };
    // A wakes up and writes late: nothing changes.
    let applied = repo::finish_batch(&client, "worker-a", &[result(&a[0], "a")], |_| None, LEASE)
        .await
        .unwrap();
    assert!(applied.is_empty());
    let status: String = value(&c, "SELECT status FROM pipeline_runs WHERE id = $1", &[&id]).await;
    assert_eq!(status, "ANALYZING");
    // B's result applies.
    let applied = repo::finish_batch(&client, "worker-b", &[result(&b[0], "b")], |_| None, LEASE)
        .await
        .unwrap();
    assert_eq!(applied.iter().map(|a| a.id).collect::<Vec<_>>(), vec![id]);
    assert!(applied[0].chained.is_none());
    let row = c
        .query_one(
            "SELECT status, analysis_result->>'by' AS by_worker, attempt FROM pipeline_runs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>("status"), "ANALYZED");
    assert_eq!(row.get::<_, String>("by_worker"), "b");
    assert_eq!(row.get::<_, i32>("attempt"), 0, "attempts reset for the next stage");
    let steps: Vec<(String, i32, String)> = rows(
        &c,
        "SELECT outcome, attempt, worker FROM pipeline_steps WHERE run_id = $1 ORDER BY id",
        &[&id],
        |r| by_name!(r, "outcome", "attempt", "worker"),
    )
    .await;
    assert_eq!(
        steps,
        vec![
            ("lease_expired".to_owned(), 1, "worker-a".to_owned()),
            ("succeeded".to_owned(), 2, "worker-b".to_owned())
        ]
    );
}

/// A claim commits without waiting for its WAL flush, so a database crash
/// may forget it while the daemon that made it runs the stage. The row is
/// then due again as it was; when the same daemon claims it again, the new
/// lease has a new token, and the stale run's result is fenced out.
#[tokio::test]
async fn a_claim_forgotten_by_a_crash_never_lets_its_stale_result_in() {
    let (_db, _pool, client, c) = daemon_setup().await;
    let id = insert_run(&c, false).await;
    let first = claim_analyze(&client, 10, "w").await;
    assert_eq!(first.len(), 1);
    crate::support::forget_claim(&c, id).await;
    let second = claim_analyze(&client, 10, "w").await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].attempt, first[0].attempt, "the same attempt, made again");
    assert!(
        second[0].lease_token > first[0].lease_token,
        "the new lease's token {} repeats or precedes the forgotten one's {}",
        second[0].lease_token,
        first[0].lease_token
    );
    let stale = repo::finish_batch(&client, "w", &[analyzed(&first[0])], |_| None, LEASE)
        .await
        .unwrap();
    assert!(stale.is_empty(), "the forgotten claim's result was applied");
    let fresh = repo::finish_batch(&client, "w", &[analyzed(&second[0])], |_| None, LEASE)
        .await
        .unwrap();
    assert_eq!(fresh.iter().map(|a| a.id).collect::<Vec<_>>(), vec![id]);
    let steps: i64 = value(&c, "SELECT count(*) FROM pipeline_steps WHERE run_id = $1", &[&id]).await;
    assert_eq!(steps, 1, "one attempt recorded, the applied one");
}

/// A claim a crash forgot and the row's new claim can both have a result
/// in one batch: the stale run's (its respond stage not answered yet, so
/// chained) and the current run's (answered). Only the current one applies,
/// under its own token; its answer ends the request, whatever chaining was
/// asked for, so the row is COMPLETED with no lease.
#[tokio::test]
async fn a_batch_with_a_superseded_result_for_the_same_row_applies_the_current_one() {
    use maas::model::StageKind;
    let (_db, _pool, client, c) = daemon_setup().await;
    let id = insert_run(&c, false).await;
    let first = claim_analyze(&client, 10, "w").await;
    crate::support::forget_claim(&c, id).await;
    let second = claim_analyze(&client, 10, "w").await;
    assert_eq!((first.len(), second.len()), (1, 1));
    let stale = fused(&first).remove(0);
    let current = answered(fused(&second).remove(0));
    let applied = repo::finish_batch(&client, "w", &[stale, current], |_| Some(StageKind::Respond), LEASE)
        .await
        .unwrap();
    assert_eq!(applied.len(), 1, "one result applies: {applied:?}");
    assert_eq!(applied[0].result_token, second[0].lease_token);
    assert!(applied[0].responded && applied[0].chained.is_none());
    assert_completed_with_fused_answer(&c, id).await;
}

/// Request `id` is COMPLETED with the answer [`answered`] gave it, and
/// holds no lease.
async fn assert_completed_with_fused_answer(c: &tokio_postgres::Client, id: Uuid) {
    let r = c
        .query_one(
            "SELECT status, final_answer, lease_owner IS NULL AND lease_expires_at IS NULL AS free
             FROM pipeline_runs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>("status"), "COMPLETED");
    assert_eq!(
        r.get::<_, Option<String>>("final_answer"),
        Some(format!("answer of {id}"))
    );
    assert!(r.get::<_, bool>("free"), "a completed request holds no lease");
}

/// The claim turns synchronous_commit off for its own transaction only: the
/// session's setting is back once it commits.
#[tokio::test]
async fn the_lazy_commit_of_a_claim_stays_inside_its_transaction() {
    let (_db, _pool, mut client, c) = daemon_setup().await;
    insert_run(&c, false).await;
    insert_run(&c, false).await;
    client.batch_execute("SET synchronous_commit = on").await.unwrap();
    let setting = |r: tokio_postgres::Row| r.get::<_, String>(0);
    let tx = client.transaction().await.unwrap();
    let claimed = claim_analyze(&tx, 1, "w").await;
    assert_eq!(claimed.len(), 1);
    let inside = setting(tx.query_one("SHOW synchronous_commit", &[]).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(inside, "off", "the claiming transaction waits for its flush");
    let claimed = claim_analyze(&client, 1, "w").await;
    assert_eq!(claimed.len(), 1);
    let after = setting(client.query_one("SHOW synchronous_commit", &[]).await.unwrap());
    assert_eq!(after, "on", "the claim changed the session's setting");
}

/// The bounds of what only a producer writes (query, callback address,
/// metadata) are checked by a trigger where those columns are written: on
/// every INSERT and on an UPDATE that sets one of them, with the refusal a
/// constraint gave (SQLSTATE, constraint, table) and the column. The
/// daemon's claim and finish do not set them, and do not call the check.
#[tokio::test]
async fn a_requests_producer_bounds_are_checked_where_they_are_written() {
    let (_db, _pool, mut client, c) = daemon_setup().await;
    let calls = "SELECT pg_stat_get_xact_function_calls('check_request_bounds'::regproc)";
    let tx = client.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL track_functions = 'pl'").await.unwrap();
    let id: Uuid = tx
        .query_one(
            "INSERT INTO pipeline_runs (user_id, user_query, metadata) VALUES (gen_random_uuid(), 'q', '{\"a\": 1}') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let after_insert: Option<i64> = tx.query_one(calls, &[]).await.unwrap().get(0);
    let claimed = claim_analyze(&tx, 10, "w").await;
    assert_eq!(claimed.len(), 1);
    let applied = repo::finish_batch(&tx, "w", &[analyzed(&claimed[0])], |_| None, LEASE)
        .await
        .unwrap();
    assert_eq!(applied.len(), 1);
    let after_engine: Option<i64> = tx.query_one(calls, &[]).await.unwrap().get(0);
    tx.commit().await.unwrap();
    assert_eq!(after_insert, Some(1), "the INSERT checks its row once");
    assert_eq!(
        after_engine,
        Some(1),
        "the claim or the finish called the producer's check"
    );

    // (statement, parameter, constraint, column)
    let huge_query = "я".repeat(100_001);
    let huge_metadata = format!("{{\"a\": \"{}\"}}", "x".repeat(16_400));
    let refused = [
        (
            "UPDATE pipeline_runs SET user_query = $2 WHERE id = $1",
            "   ".to_owned(),
            "pipeline_runs_query_not_empty",
            "user_query",
        ),
        (
            "UPDATE pipeline_runs SET user_query = $2 WHERE id = $1",
            huge_query,
            "pipeline_runs_query_size",
            "user_query",
        ),
        (
            "UPDATE pipeline_runs SET callback_url = $2 WHERE id = $1",
            "ftp://example.org/x".to_owned(),
            "pipeline_runs_callback_url_valid",
            "callback_url",
        ),
        (
            "UPDATE pipeline_runs SET metadata = $2::text::jsonb WHERE id = $1",
            "[1, 2]".to_owned(),
            "pipeline_runs_metadata_object",
            "metadata",
        ),
        (
            "UPDATE pipeline_runs SET metadata = $2::text::jsonb WHERE id = $1",
            huge_metadata.clone(),
            "pipeline_runs_metadata_size",
            "metadata",
        ),
        (
            "INSERT INTO pipeline_runs (user_id, user_query, metadata) VALUES ($1, 'q', $2::text::jsonb)",
            huge_metadata,
            "pipeline_runs_metadata_size",
            "metadata",
        ),
        (
            "INSERT INTO pipeline_runs (user_id, user_query, callback_url) VALUES ($1, 'q', $2)",
            "https://example.org/a b".to_owned(),
            "pipeline_runs_callback_url_valid",
            "callback_url",
        ),
    ];
    let schema: String = value(&c, "SELECT current_schema()::text", &[]).await;
    for (sql, value, constraint, col) in refused {
        let e = c.execute(sql, &[&id, &value]).await.expect_err(sql);
        let db = e
            .as_db_error()
            .unwrap_or_else(|| panic!("{sql}: not a database error: {e}"));
        assert_eq!(db.code().code(), "23514", "{sql}: {db}");
        assert_eq!(db.constraint(), Some(constraint), "{sql}: {db}");
        assert_eq!(db.table(), Some("pipeline_runs"), "{sql}: {db}");
        assert_eq!(db.schema(), Some(schema.as_str()), "{sql}: {db}");
        assert_eq!(db.column(), Some(col), "{sql}: {db}");
        assert!(db.message().contains(constraint), "{sql}: {}", db.message());
    }
    let row = c
        .query_one(
            "SELECT user_query, callback_url, metadata::text FROM pipeline_runs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "q", "a refused UPDATE changed the query");
    assert_eq!(row.get::<_, Option<String>>(1), None);
    assert_eq!(row.get::<_, Option<String>>(2).as_deref(), Some("{\"a\": 1}"));
    assert_eq!(count(&c, "SELECT count(*) FROM pipeline_runs").await, 1);
    // Values inside the bounds pass an UPDATE that sets them.
    c.execute(
        "UPDATE pipeline_runs SET user_query = 'a new question', callback_url = 'https://example.org/cb', metadata = '{}' WHERE id = $1",
        &[&id],
    )
    .await
    .unwrap();
}

/// The result of one successful analyze attempt of `row`.
fn analyzed(row: &repo::Claimed) -> repo::Finished {
    let analysis = serde_json::json!({"needs_context": false});
    repo::Finished::succeeded(
        row,
        repo::Output::Analysis { analysis, fused: None },
        Default::default(),
        Some(3),
    )
}

/// Chaining: the statement that records a success claims the row for its
/// next stage, and `pipeline_events` still carries every status, in order.
/// A debug request is not chained: it rests in the status it reached.
#[tokio::test]
async fn a_chained_finish_claims_the_next_stage_and_announces_every_status() {
    use maas::model::StageKind;
    let (db, _pool, client, c) = daemon_setup().await;
    let plain = insert_run(&c, false).await;
    let debug = insert_run(&c, true).await;
    let claimed = claim_analyze(&client, 10, "w").await;
    assert_eq!(claimed.len(), 2);
    let (_listener, mut rx) = listen(&db).await;
    let batch: Vec<repo::Finished> = claimed.iter().map(analyzed).collect();
    let applied = repo::finish_batch(&client, "w", &batch, |_| Some(StageKind::Assemble), LEASE)
        .await
        .unwrap();
    assert_eq!(applied.len(), 2);
    let of = |id: Uuid| applied.iter().find(|a| a.id == id).unwrap();
    let (stage, next) = of(plain).chained.clone().expect("the plain run is chained");
    assert_eq!(stage, StageKind::Assemble);
    let before = claimed.iter().find(|r| r.id == plain).unwrap();
    assert_eq!(next.attempt, 1);
    assert_eq!(
        next.lease_token,
        before.lease_token + 1,
        "the claim bumps the fencing token"
    );
    assert_eq!(next.analysis, Some(serde_json::json!({"needs_context": false})));
    assert!(of(debug).chained.is_none(), "a debug request rests instead");
    let rows = c
        .query(
            "SELECT id, status, lease_owner, attempt, held FROM pipeline_runs ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    for r in rows {
        let id: Uuid = r.get("id");
        let state = (
            r.get::<_, String>("status"),
            r.get::<_, Option<String>>("lease_owner"),
            r.get::<_, i32>("attempt"),
            r.get::<_, bool>("held"),
        );
        if id == plain {
            assert_eq!(state, ("ASSEMBLING".into(), Some("w".into()), 1, false));
        } else {
            assert_eq!(state, ("ANALYZED".into(), None, 0, true));
        }
    }
    // One step per finished attempt; the chained claim writes none.
    assert_eq!(
        count(&c, "SELECT count(*) FROM pipeline_steps WHERE outcome = 'succeeded'").await,
        2
    );
    let seen = next_events(&mut rx, 3).await;
    let plain_seen: Vec<&str> = seen
        .iter()
        .filter(|(id, _)| *id == plain)
        .map(|(_, s)| s.as_str())
        .collect();
    assert_eq!(plain_seen, vec!["ANALYZED passed", "ASSEMBLING"]);
    assert!(seen.contains(&(debug, "ANALYZED".to_owned())));
    assert_silent(&mut rx, "nothing else rang").await;
    // A late second write of the same results changes nothing.
    let again = repo::finish_batch(&client, "w", &batch, |_| Some(StageKind::Assemble), LEASE)
        .await
        .unwrap();
    assert!(again.is_empty());
}

/// One statement that changes many rows rings once per changed row.
#[tokio::test]
async fn a_many_row_update_rings_for_each_row_whose_status_changed() {
    let db = TestDb::new().await;
    let c = db.client().await;
    c.execute(
        "INSERT INTO pipeline_runs (user_id, user_query) SELECT gen_random_uuid(), 'q' || g FROM generate_series(1, 300) g",
        &[],
    )
    .await
    .unwrap();
    let (_listener, mut rx) = listen(&db).await;
    // 200 rows change status, 100 only change a column: 200 notifications.
    c.execute(
        "UPDATE pipeline_runs SET status = CASE WHEN user_query ~ '^q[0-9]{1,2}$' OR user_query ~ '^q1[0-9]{2}$'
                                               THEN 'CANCELLED' ELSE status END,
                                  error = 'x'",
        &[],
    )
    .await
    .unwrap();
    let cancelled = count(&c, "SELECT count(*) FROM pipeline_runs WHERE status = 'CANCELLED'").await;
    assert_eq!(cancelled, 199);
    let mut ids = std::collections::HashSet::new();
    while ids.len() < 199 {
        let payload = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a notification per cancelled row")
            .unwrap();
        let ev = maas::listener::parse_payload(&payload).unwrap();
        assert_eq!((ev.status.as_str(), ev.operation.as_str()), ("CANCELLED", "UPDATE"));
        assert!(ids.insert(ev.id), "one notification per row");
    }
    assert_silent(&mut rx, "rows whose status did not change rang nothing").await;
}

/// Deleting runs deletes their step history (one DELETE of many runs
/// included), and nothing else's.
#[tokio::test]
async fn deleting_runs_deletes_their_steps() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let ids: Vec<Uuid> = column(
        &c,
        "INSERT INTO pipeline_runs (user_id, user_query) SELECT gen_random_uuid(), 'q' || g
             FROM generate_series(1, 5) g RETURNING id",
        &[],
    )
    .await;
    c.execute(
        "INSERT INTO pipeline_steps (run_id, stage, attempt, worker, started_at, outcome)
         SELECT id, s.stage, 1, 'w', now(), 'succeeded'
         FROM pipeline_runs, unnest(ARRAY['analyze', 'assemble']) AS s(stage)",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(count(&c, "SELECT count(*) FROM pipeline_steps").await, 10);
    c.execute("DELETE FROM pipeline_runs WHERE id = ANY($1)", &[&&ids[..3]])
        .await
        .unwrap();
    assert_eq!(count(&c, "SELECT count(*) FROM pipeline_steps").await, 4);
    let left: i64 = value(
        &c,
        "SELECT count(*) FROM pipeline_steps WHERE run_id = ANY($1)",
        &[&&ids[3..]],
    )
    .await;
    assert_eq!(left, 4, "the other runs keep their history");
}

/// The results of analyze for `claimed`, each with its assemble fused in.
fn fused(claimed: &[repo::Claimed]) -> Vec<repo::Finished> {
    claimed
        .iter()
        .map(|r| {
            let mut f = analyzed(r);
            f.fuse(repo::FusedAssemble {
                context: format!("context of {}", r.id),
                context_sources: None,
                tokens: Some(12),
                latency_ms: 1,
                respond: None,
            });
            f
        })
        .collect()
}

/// `f`, a fused analyze result, with its respond stage's answer fused too.
fn answered(mut f: repo::Finished) -> repo::Finished {
    if let Some(mut a) = f.fused().cloned() {
        a.respond = Some(repo::FusedRespond {
            answer: format!("answer of {}", f.id),
            model: Some("m-respond".into()),
            prompt_tokens: Some(30),
            completion_tokens: Some(7),
            latency_ms: 2,
        });
        f.fuse(a);
    }
    f
}

/// Status, context and `held` of request `id`.
async fn fused_state(c: &tokio_postgres::Client, id: Uuid) -> (String, Option<String>, bool) {
    let r = c
        .query_one(
            "SELECT status, final_context_payload, held FROM pipeline_runs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    (
        r.get::<_, String>(0),
        r.get::<_, Option<String>>(1),
        r.get::<_, bool>(2),
    )
}

/// A fused request wrote a step for analyze and one for assemble; `debug`
/// (not fused) wrote its analyze step alone.
async fn assert_fused_steps(c: &tokio_postgres::Client, fused: [Uuid; 2], debug: Uuid) {
    let steps: Vec<(Uuid, String, i32, Option<i32>)> = rows(
        c,
        "SELECT run_id, stage, attempt, prompt_tokens FROM pipeline_steps ORDER BY id",
        &[],
        |r| by_name!(r, "run_id", "stage", "attempt", "prompt_tokens"),
    )
    .await;
    for id in fused {
        let mine: Vec<(&str, i32)> = steps
            .iter()
            .filter(|s| s.0 == id)
            .map(|s| (s.1.as_str(), s.2))
            .collect();
        assert_eq!(mine, vec![("analyze", 1), ("assemble", 1)], "{id}");
    }
    assert_eq!(steps.iter().filter(|s| s.0 == debug).count(), 1);
}

/// Fusing: an analyze result that carries its assemble output moves the row
/// past ASSEMBLING (to RESPONDING when chained, else READY) with both step
/// rows, and every status it passed is announced, in order. A debug request
/// drops the fused output and rests in ANALYZED.
#[tokio::test]
async fn a_fused_analyze_writes_both_stages_and_announces_every_status() {
    use maas::model::StageKind;
    let (db, _pool, client, c) = daemon_setup().await;
    let (chained, resting, debug) = (
        insert_run(&c, false).await,
        insert_run(&c, false).await,
        insert_run(&c, true).await,
    );
    let claimed = claim_analyze(&client, 10, "w").await;
    assert_eq!(claimed.len(), 3);
    let (_listener, mut rx) = listen(&db).await;
    let applied = repo::finish_batch(
        &client,
        "w",
        &fused(&claimed),
        |f| (f.id == chained).then_some(StageKind::Respond),
        LEASE,
    )
    .await
    .unwrap();
    assert_eq!(applied.len(), 3);
    let of = |id: Uuid| applied.iter().find(|a| a.id == id).unwrap();
    assert!(of(chained).fused && of(resting).fused && !of(debug).fused);
    let (stage, next) = of(chained).chained.clone().expect("chained into respond");
    assert_eq!(stage, StageKind::Respond);
    assert_eq!(next.context.as_deref(), Some(format!("context of {chained}").as_str()));
    assert_eq!(fused_state(&c, chained).await.0, "RESPONDING");
    assert_eq!(
        fused_state(&c, resting).await,
        ("READY".into(), Some(format!("context of {resting}")), false)
    );
    assert_eq!(fused_state(&c, debug).await, ("ANALYZED".into(), None, true));
    assert_fused_steps(&c, [chained, resting], debug).await;

    let seen = next_events(&mut rx, 8).await;
    let of_run = |id: Uuid| -> Vec<&str> { seen.iter().filter(|e| e.0 == id).map(|e| e.1.as_str()).collect() };
    assert_eq!(
        of_run(chained),
        vec!["ANALYZED passed", "ASSEMBLING passed", "READY passed", "RESPONDING"]
    );
    assert_eq!(of_run(resting), vec!["ANALYZED passed", "ASSEMBLING passed", "READY"]);
    assert_eq!(of_run(debug), vec!["ANALYZED"]);
    assert_silent(&mut rx, "nothing else rang").await;
}

/// Fusing the respond stage too: an analyze result that carries its
/// assemble output and an answer completes the request in one statement —
/// the answer stored and logged once, three step rows, every status passed
/// announced in order — and while the daemons are paused the row rests in
/// ANALYZED with neither context nor answer.
#[tokio::test]
async fn a_fused_respond_completes_the_request_in_one_statement() {
    use maas::model::StageKind;
    let (db, _pool, client, c) = daemon_setup().await;
    let (done, paused) = (insert_run(&c, false).await, insert_run(&c, false).await);
    let claimed = claim_analyze(&client, 10, "w").await;
    assert_eq!(claimed.len(), 2);
    let results: Vec<repo::Finished> = fused(&claimed).into_iter().map(answered).collect();
    let (_listener, mut rx) = listen(&db).await;
    let (first, second): (Vec<_>, Vec<_>) = results.into_iter().partition(|f| f.id == done);
    let applied = repo::finish_batch(&client, "w", &first, |_| None::<StageKind>, LEASE)
        .await
        .unwrap();
    assert_eq!(applied.len(), 1);
    assert!(applied[0].fused && applied[0].responded && applied[0].chained.is_none());
    assert_completed_with_fused_answer(&c, done).await;
    let attempt: i32 = value(&c, "SELECT attempt FROM pipeline_runs WHERE id = $1", &[&done]).await;
    assert_eq!(attempt, 0);
    let steps: Vec<(String, String, Option<String>, Option<i32>)> = rows(
        &c,
        "SELECT stage, outcome, model, completion_tokens FROM pipeline_steps WHERE run_id = $1 ORDER BY id",
        &[&done],
        |r| by_name!(r, "stage", "outcome", "model", "completion_tokens"),
    )
    .await;
    let stages: Vec<&str> = steps.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(stages, vec!["analyze", "assemble", "respond"]);
    assert!(steps.iter().all(|s| s.1 == "succeeded"));
    assert_eq!((steps[2].2.as_deref(), steps[2].3), (Some("m-respond"), Some(7)));
    let logged: Vec<(String, String)> = rows(
        &c,
        "SELECT message_type, content FROM raw_logs WHERE request_id = $1 ORDER BY user_seq",
        &[&done],
        |r| by_name!(r, "message_type", "content"),
    )
    .await;
    assert_eq!(
        logged,
        vec![
            ("user_query".to_owned(), logged[0].1.clone()),
            ("assistant_response".to_owned(), format!("answer of {done}")),
        ]
    );
    let seen = next_events(&mut rx, 5).await;
    let of_run: Vec<&str> = seen.iter().filter(|e| e.0 == done).map(|e| e.1.as_str()).collect();
    assert_eq!(
        of_run,
        vec![
            "ANALYZED passed",
            "ASSEMBLING passed",
            "READY passed",
            "RESPONDING passed",
            "COMPLETED"
        ]
    );
    assert_silent(&mut rx, "nothing else rang").await;

    c.execute("UPDATE maas_control SET paused = true", &[]).await.unwrap();
    let applied = repo::finish_batch(&client, "w", &second, |_| None::<StageKind>, LEASE)
        .await
        .unwrap();
    assert_eq!(applied.len(), 1);
    assert!(!applied[0].fused && !applied[0].responded);
    let r = c
        .query_one(
            "SELECT status, final_answer, final_context_payload FROM pipeline_runs WHERE id = $1",
            &[&paused],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>("status"), "ANALYZED");
    assert_eq!(r.get::<_, Option<String>>("final_answer"), None);
    assert_eq!(r.get::<_, Option<String>>("final_context_payload"), None);
    let answers: i64 = value(
        &c,
        "SELECT count(*) FROM raw_logs WHERE request_id = $1 AND message_type = 'assistant_response'",
        &[&paused],
    )
    .await;
    assert_eq!(answers, 0, "a dropped answer is not logged");
}

/// Every closed set the code names has exactly the names its table's
/// CHECK constraint lists: a name added on one side only fails here, not
/// at the first row that carries it.
#[tokio::test]
async fn the_vocabulary_matches_the_check_constraints() {
    use maas::model::{DeliveryState, OperatorAction, Outcome, PromptRole, Scope, StageKind, Status};
    let db = TestDb::new().await;
    let c = db.client().await;
    let listed = |constraint: &'static str| {
        let c = &c;
        async move {
            let def: String = value(
                c,
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = $1",
                &[&constraint],
            )
            .await;
            let mut names: Vec<String> = def.split('\'').skip(1).step_by(2).map(str::to_owned).collect();
            names.sort();
            assert!(!names.is_empty(), "{constraint}: {def}");
            names
        }
    };
    let sorted = |names: &[&str]| {
        let mut v: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        v.sort();
        v
    };
    assert_eq!(listed("pipeline_runs_status_valid").await, sorted(&Status::NAMES));
    assert_eq!(listed("pipeline_steps_stage_valid").await, sorted(&StageKind::NAMES));
    assert_eq!(listed("pipeline_steps_outcome_valid").await, sorted(&Outcome::NAMES));
    assert_eq!(listed("system_prompts_role_valid").await, sorted(&PromptRole::NAMES));
    assert_eq!(listed("api_tokens_scope_known").await, sorted(&Scope::NAMES));
    assert_eq!(
        listed("operator_actions_action_valid").await,
        sorted(&OperatorAction::NAMES)
    );
    assert_eq!(
        listed("callback_outbox_state_valid").await,
        sorted(&DeliveryState::NAMES)
    );
}
