//! What the hot path writes (sql/0025_fewer_index_writes.sql,
//! sql/0026_answer_logs_in_finish.sql): a heartbeat
//! and a user's next log are HOT updates (no index entry), and every
//! statement that read an index the migration replaced still reads an
//! index, never the whole table.

use maas::repo::statement;
use uuid::Uuid;

use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{TestDb, plan_with as plan, rows};
use crate::support::{GENEROUS, assert_one_answer_logged, insert_held, release, wait_all_terminal};

/// Updates of `table` this session has not yet reported, and how many were
/// HOT (PostgreSQL 15 counts earlier transactions' there too: compare two).
async fn updates(c: &tokio_postgres::Transaction<'_>, table: &str) -> (i64, i64) {
    let r = c
        .query_one(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = $1",
            &[&table],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

#[tokio::test]
async fn a_heartbeat_and_a_users_next_log_write_no_index_entry() {
    let db = TestDb::new().await;
    let mut c = db.client().await;
    let user = Uuid::new_v4();
    let id: Uuid = c
        .query_one(
            "INSERT INTO pipeline_runs (user_id, user_query) VALUES ($1, 'a question') RETURNING id",
            &[&user],
        )
        .await
        .unwrap()
        .get(0);
    c.execute(
        "UPDATE pipeline_runs SET status = 'ANALYZING', lease_owner = 'w', lease_token = 7,
                lease_expires_at = now() + interval '30 seconds' WHERE id = $1",
        &[&id],
    )
    .await
    .unwrap();

    let tx = c.transaction().await.unwrap();
    let (upd, hot) = updates(&tx, "pipeline_runs").await;
    let renewed = tx
        .query(statement("heartbeat").unwrap(), &[&vec![id], &vec![7_i64], &60_f64])
        .await
        .unwrap();
    assert_eq!(renewed.len(), 1);
    assert_eq!(
        updates(&tx, "pipeline_runs").await,
        (upd + 1, hot + 1),
        "the heartbeat is a HOT update"
    );
    tx.commit().await.unwrap();

    // The query's log (inserted with the request) made the user's mark;
    // the answer's log bumps it.
    let tx = c.transaction().await.unwrap();
    let (upd, hot) = updates(&tx, "archive_marks").await;
    tx.execute(
        "INSERT INTO raw_logs (user_id, request_id, message_type, content)
         VALUES ($1, $2, 'assistant_response', 'an answer')",
        &[&user, &id],
    )
    .await
    .unwrap();
    assert_eq!(
        updates(&tx, "archive_marks").await,
        (upd + 1, hot + 1),
        "the mark's bump is a HOT update"
    );
    tx.commit().await.unwrap();
}

fn assert_reads(what: &str, plan: &str, index: &str) {
    assert!(plan.contains(index), "{what}: expected {index}:\n{plan}");
    assert!(!plan.contains("Seq Scan"), "{what}: a sequential scan:\n{plan}");
}

/// The claim and the finish find a batch's rows by key, never by reading
/// the table, when the statistics were gathered before any lease was held
/// (a burst into a quiet table, or a table analysed between bursts): a
/// plan with a sequential scan there cost 0.4 s per batch of 128.
#[tokio::test]
async fn a_batchs_claim_and_finish_find_their_rows_by_key_on_stale_statistics() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // 20,000 due requests (triggers off: no logs), analysed as they are;
    // then 1,000 of them leased to daemon `w`, unknown to the statistics.
    c.batch_execute(
        "SET session_replication_role = replica;
         INSERT INTO pipeline_runs (user_id, user_query)
         SELECT gen_random_uuid(), 'question ' || g FROM generate_series(1, 20000) g;
         RESET session_replication_role;
         ANALYZE pipeline_runs;
         UPDATE pipeline_runs SET status = 'ANALYZING', lease_owner = 'w', lease_token = 7, attempt = 1,
                                  lease_expires_at = now() + interval '1 minute'
         WHERE id IN (SELECT id FROM pipeline_runs ORDER BY id LIMIT 1000);",
    )
    .await
    .unwrap();
    let no_table_scan = |what: &str, plan: &str| {
        assert!(
            !plan.contains("Seq Scan on pipeline_runs"),
            "{what}: reads the whole table:\n{plan}"
        );
    };
    let claim = maas::repo::attempts::claim_sql(maas::model::StageKind::Analyze);
    no_table_scan("claim", &plan(&c, claim, &["128", "'w'", "60", "5"]).await);

    let ids: Vec<Uuid> = rows(
        &c,
        "SELECT id FROM pipeline_runs WHERE lease_owner = 'w' ORDER BY random() LIMIT 128",
        &[],
        |r| r.get(0),
    )
    .await;
    let n = ids.len();
    let list = |v: &str, ty: &str| format!("array_fill({v}::{ty}, ARRAY[{n}])");
    let ids = format!(
        "ARRAY[{}]::uuid[]",
        ids.iter().map(|id| format!("'{id}'")).collect::<Vec<_>>().join(",")
    );
    // In the order of finish.sql's parameters: one analyze result each,
    // fused with the two stages after it.
    let values = [
        ids,
        list("7", "int8"),
        list("'analyze'", "text"),
        list("'ANALYZING'", "text"),
        list("'ANALYZED'", "text"),
        list("'succeeded'", "text"),
        list("1", "int4"),
        list("now()", "timestamptz"),
        list("'{}'", "jsonb"),
        list("'context'", "text"),
        list("NULL", "text"),
        list("NULL", "text"),
        list("NULL", "text"),
        list("0", "int8"),
        list("'m'", "text"),
        list("1", "int4"),
        list("1", "int4"),
        list("1", "int4"),
        "'w'".to_owned(),
        list("NULL", "text"),
        "60".to_owned(),
        list("true", "bool"),
        list("1", "int4"),
        list("1", "int4"),
        list("'[]'", "jsonb"),
        list("'answer'", "text"),
        list("'m'", "text"),
        list("1", "int4"),
        list("1", "int4"),
        list("1", "int4"),
    ];
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    let finish = statement("finish").unwrap();
    let finish_plan = plan(&c, finish, &values).await;
    no_table_scan("finish", &finish_plan);
    assert!(
        finish_plan.contains("pipeline_runs_pkey"),
        "finish: not by primary key:\n{finish_plan}"
    );
}

#[tokio::test]
async fn the_sweep_the_lease_counts_the_console_and_the_archivist_read_an_index() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // 30,000 finished requests of 3,000 users (triggers off: no logs), 40
    // due, 60 in flight; 3,000 marks, 20 with something pending.
    c.batch_execute(
        "SET session_replication_role = replica;
         INSERT INTO pipeline_runs (user_id, user_query, status, lease_owner, lease_expires_at, created_at)
         SELECT md5('u' || g % 3000)::uuid, 'question ' || g,
                CASE WHEN g > 29900 AND g % 5 < 2 THEN 'NEW'
                     WHEN g > 29900 THEN (ARRAY['ANALYZING', 'ASSEMBLING', 'RESPONDING'])[1 + g % 3]
                     ELSE 'COMPLETED' END,
                CASE WHEN g > 29900 AND g % 5 >= 2 THEN 'w' END,
                CASE WHEN g > 29900 AND g % 5 >= 2 THEN now() + interval '30 seconds' END,
                now() - make_interval(secs => 30000 - g)
         FROM generate_series(1, 30000) g;
         INSERT INTO archive_marks (user_id, logged_seq, archived_seq, pending_since, last_active_at)
         SELECT md5('u' || g)::uuid, 10, CASE WHEN g < 20 THEN 5 ELSE 10 END,
                CASE WHEN g < 20 THEN now() - interval '1 hour' END, now()
         FROM generate_series(0, 2999) g
         ON CONFLICT DO NOTHING;
         RESET session_replication_role;",
    )
    .await
    .unwrap();
    for table in ["pipeline_runs", "archive_marks"] {
        c.batch_execute(&format!("VACUUM ANALYZE {table}")).await.unwrap();
    }
    let in_flight = "pipeline_runs_in_flight_idx";
    let cases: Vec<(&str, &str, Vec<&str>, &str)> = vec![
        ("sweep", "reclaim_expired", vec!["5", "100"], in_flight),
        ("expired leases", "count_expired_leases", vec![], in_flight),
        ("leases", "stats_leases", vec![], in_flight),
        ("backlog", "count_backlog", vec![], in_flight),
        ("backlog stats", "stats_backlog", vec![], in_flight),
        (
            "archive candidates",
            "archive_candidates",
            vec!["5", "60", "86400", "0", "10"],
            "archive_marks_pending_idx",
        ),
        (
            "archive newcomers",
            "archive_newcomers",
            vec!["1", "10"],
            "archive_marks_pending_idx",
        ),
    ];
    for (what, name, values, index) in cases {
        assert_reads(what, &plan(&c, statement(name).unwrap(), &values).await, index);
    }
    // The console's list by one status: in flight from the in-flight
    // index, a dispatchable one from the status index (which leaves out the
    // in-flight statuses; a terminal one: console_list.rs).
    let page = |status: &str| {
        let s = format!("'{{{status}}}'");
        [
            s,
            "NULL".into(),
            "NULL".into(),
            "NULL".into(),
            "NULL".into(),
            "NULL".into(),
            "NULL".into(),
            "NULL".into(),
            "50".into(),
            "2000".into(),
            "NULL".into(),
        ]
    };
    for (status, index) in [("RESPONDING", in_flight), ("NEW", "pipeline_runs_status_created_idx")] {
        let values = page(status);
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let p = plan(&c, statement("requests_page").unwrap(), &values).await;
        assert_reads(status, &p, index);
    }
}

/// The answers' logs are numbered by the statement that records them
/// (sql/0026_answer_logs_in_finish.sql), as the raw_logs triggers number
/// every other log: each user's turns 1..n with no gap or repeat, the mark
/// at n, and a forgotten user's answer dropped and counted.
#[tokio::test]
async fn a_daemons_answers_are_numbered_in_order_and_a_forgotten_users_dropped() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (many, few, forgotten) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let users = [vec![many; 6], vec![few; 2], vec![forgotten]].concat();
    let ids = insert_held(&c, &users).await;
    // Tombstoned after its query was logged and before its answer is.
    c.execute(
        "INSERT INTO forgotten_users (user_id, actor, reason) VALUES ($1, 'test', 'test')",
        &[&forgotten],
    )
    .await
    .unwrap();
    let _d = Maasd::spawn(&db.url, Opts::default());
    release(&c).await;
    wait_all_terminal(&c, GENEROUS).await;

    for (user, n) in [(many, 6_i64), (few, 2)] {
        let r = c
            .query_one(
                "SELECT count(*), count(DISTINCT user_seq), min(user_seq), max(user_seq),
                        (SELECT logged_seq FROM archive_marks WHERE user_id = $1)
                 FROM raw_logs WHERE user_id = $1",
                &[&user],
            )
            .await
            .unwrap();
        let (logs, distinct, lo, hi, mark): (i64, i64, i64, i64, i64) =
            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        assert_eq!(
            (logs, distinct, lo, hi, mark),
            (2 * n, 2 * n, 1, 2 * n, 2 * n),
            "user {user}: logs, distinct numbers, lowest, highest, mark"
        );
    }
    for (id, user) in ids.iter().zip(&users) {
        if *user != forgotten {
            assert_one_answer_logged(&c, *id).await;
        }
    }
    let r = c
        .query_one(
            "SELECT (SELECT count(*) FROM raw_logs WHERE user_id = $1 AND message_type = 'assistant_response'),
                    (SELECT dropped_writes FROM forgotten_users WHERE user_id = $1)",
            &[&forgotten],
        )
        .await
        .unwrap();
    assert_eq!(
        (r.get::<_, i64>(0), r.get::<_, i64>(1)),
        (0, 1),
        "a forgotten user's answer: logged, dropped writes"
    );
}

/// The default tenant, which maps the producer roles below (a role no
/// mapping covers inserts nothing: triggers/0006_assign_tenant.sql).
const NIL: Uuid = Uuid::nil();

/// A log whose number is given skips the triggers only for a role that may
/// update raw_logs (the daemon's); anyone else's number is replaced.
#[tokio::test]
async fn a_producers_given_number_is_replaced_by_the_trigger() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let role = format!("producer_{}", Uuid::new_v4().simple());
    let user = Uuid::new_v4();
    c.batch_execute(&format!(
        "CREATE ROLE {role}; GRANT INSERT ON raw_logs TO {role};
         INSERT INTO tenant_roles (role, tenant_id) VALUES ('{role}', '{NIL}');
         SET ROLE {role};
         INSERT INTO raw_logs (user_id, message_type, content, user_seq) VALUES ('{user}', 'user_query', 'hello', 999);
         RESET ROLE;"
    ))
    .await
    .unwrap();
    let r = c
        .query_one(
            "SELECT l.user_seq, m.logged_seq FROM raw_logs l JOIN archive_marks m USING (user_id) WHERE l.user_id = $1",
            &[&user],
        )
        .await
        .unwrap();
    assert_eq!(
        (r.get::<_, i64>(0), r.get::<_, i64>(1)),
        (1, 1),
        "the log's number and the mark"
    );
}

/// A request's query log is numbered by the trigger that logs it (the
/// raw_logs triggers skip that log), whoever inserts the request; a
/// forgotten user's request is still refused and logs nothing.
#[tokio::test]
async fn a_producers_requests_have_their_queries_numbered_and_a_forgotten_users_refused() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let role = format!("producer_{}", Uuid::new_v4().simple());
    let (user, forgotten) = (Uuid::new_v4(), Uuid::new_v4());
    c.batch_execute(&format!(
        "CREATE ROLE {role}; GRANT INSERT ON pipeline_runs, raw_logs TO {role};
         INSERT INTO tenant_roles (role, tenant_id) VALUES ('{role}', '{NIL}');
         INSERT INTO forgotten_users (user_id, actor, reason) VALUES ('{forgotten}', 'test', 'test');
         SET ROLE {role};
         INSERT INTO pipeline_runs (user_id, user_query, run_after) VALUES ('{user}', 'one', now() + interval '1 hour');
         INSERT INTO raw_logs (user_id, message_type, content) VALUES ('{user}', 'assistant_response', 'a turn of its own');
         INSERT INTO pipeline_runs (user_id, user_query, run_after)
         SELECT '{user}', 'more #' || g, now() + interval '1 hour' FROM generate_series(1, 3) g;
         RESET ROLE;"
    ))
    .await
    .unwrap();
    let logs: Vec<(String, i64)> = rows(
        &c,
        "SELECT content, user_seq FROM raw_logs WHERE user_id = $1 ORDER BY user_seq",
        &[&user],
        |r| (r.get(0), r.get(1)),
    )
    .await;
    let want: Vec<(String, i64)> = ["one", "a turn of its own", "more #1", "more #2", "more #3"]
        .iter()
        .zip(1..)
        .map(|(s, n)| ((*s).to_owned(), n))
        .collect();
    assert_eq!(logs, want, "the user's logs in the order inserted, numbered 1..5");
    let mark: i64 = c
        .query_one("SELECT logged_seq FROM archive_marks WHERE user_id = $1", &[&user])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mark, 5, "the user's mark");

    let refused = c
        .batch_execute(&format!(
            "SET ROLE {role};
             INSERT INTO pipeline_runs (user_id, user_query) VALUES ('{forgotten}', 'me again');"
        ))
        .await
        .unwrap_err();
    c.batch_execute("RESET ROLE").await.unwrap();
    assert_eq!(
        refused.as_db_error().map(|e| e.code().code()),
        Some("MA410"),
        "{refused}"
    );
    let r = c
        .query_one(
            "SELECT (SELECT count(*) FROM raw_logs WHERE user_id = $1),
                    (SELECT count(*) FROM archive_marks WHERE user_id = $1),
                    (SELECT dropped_writes FROM forgotten_users WHERE user_id = $1)",
            &[&forgotten],
        )
        .await
        .unwrap();
    assert_eq!(
        (r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, i64>(2)),
        (0, 0, 0),
        "a forgotten user's refused request: logs, mark, dropped writes"
    );
}
