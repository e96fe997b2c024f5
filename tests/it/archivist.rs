//! The archivist against a real database, through `maasctl archivist` (a
//! real process) and, for the analyzer, a real `maasd`: the right records
//! with the right `raw_log_ids`, thresholds and cooldown, concurrent runs,
//! a run killed mid-way, failures, and memory that stays with its user.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::cli::{NO_ENV, maasctl_async, tokio_command};
use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{TestDb, by_name, column, value};
use crate::support::fake_llm::{Api, FakeConfig, FakeLlm, Reply};
use crate::support::{assert_no_overlapping_cron_runs, count, wait_until};

const KEY: &str = "sk-test-key-arch";
const WAIT: Duration = Duration::from_secs(60);

/// The archivist on the fake provider (OpenAI shape).
fn fake_env(fake: &FakeLlm) -> Vec<(&'static str, String)> {
    vec![
        ("MAAS_LLM__ARCHIVIST__PROVIDER", "openai".into()),
        ("MAAS_LLM__ARCHIVIST__MODEL", "archive-model".into()),
        ("OPENAI_BASE_URL", fake.openai_base_url()),
        ("OPENAI_API_KEY", KEY.into()),
    ]
}

fn summary_json(text: &str) -> String {
    json!({
        "time_bucket_start": "2024-05-01T10:00:00Z",
        "time_bucket_end": "2024-05-01T11:00:00Z",
        "tags": ["test"],
        "summary": text,
    })
    .to_string()
}

/// Inserts one raw log `age_secs` old; returns its id.
async fn log(c: &Client, user: Uuid, thread: Option<Uuid>, content: &str, age_secs: f64) -> i64 {
    c.query_one(
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content, created_at)
         VALUES ($1, $2, 'user_query', $3, now() - make_interval(secs => $4)) RETURNING id",
        &[&user, &thread, &content, &age_secs],
    )
    .await
    .unwrap()
    .get(0)
}

async fn logs(c: &Client, user: Uuid, thread: Option<Uuid>, n: usize, age_secs: f64) -> Vec<i64> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            log(
                c,
                user,
                thread,
                &format!("message {i} about gardening tomatoes"),
                age_secs,
            )
            .await,
        );
    }
    ids
}

/// Every record of `user`: its raw_log_ids, in id order of the records.
async fn records(c: &Client, user: Uuid) -> Vec<Vec<i64>> {
    column(
        c,
        "SELECT raw_log_ids FROM lsm_storage WHERE user_id = $1 ORDER BY id",
        &[&user],
    )
    .await
}

/// No log is covered twice; every log is covered by a record of its own
/// user when `all` (else: no log is covered by another user's record).
async fn assert_exactly_once(c: &Client, all: bool) {
    let dup = count(
        c,
        "SELECT count(*) FROM (SELECT u.lid FROM lsm_storage l, unnest(l.raw_log_ids) u(lid) GROUP BY u.lid HAVING count(*) > 1) d",
    )
    .await;
    assert_eq!(dup, 0, "a log is covered by two records");
    let foreign = count(
        c,
        "SELECT count(*) FROM lsm_storage l, unnest(l.raw_log_ids) u(lid) JOIN raw_logs r ON r.id = u.lid
         WHERE r.user_id <> l.user_id",
    )
    .await;
    assert_eq!(foreign, 0, "a record covers another user's log");
    let dangling = count(
        c,
        "SELECT count(*) FROM lsm_storage l, unnest(l.raw_log_ids) u(lid) WHERE NOT EXISTS (SELECT 1 FROM raw_logs r WHERE r.id = u.lid)",
    )
    .await;
    assert_eq!(dangling, 0);
    if all {
        let uncovered = count(
            c,
            "SELECT count(*) FROM raw_logs r WHERE NOT EXISTS (
                 SELECT 1 FROM lsm_storage l WHERE l.user_id = r.user_id AND r.id = ANY (l.raw_log_ids))",
        )
        .await;
        assert_eq!(uncovered, 0, "some log is not archived");
        let behind = count(c, "SELECT count(*) FROM archive_marks WHERE archived_seq <> logged_seq").await;
        assert_eq!(behind, 0, "some mark is behind");
    }
}

async fn mark(c: &Client, user: Uuid) -> (i64, i64, i64) {
    let r = c
        .query_one(
            "SELECT logged_seq, archived_seq, memory_version FROM archive_marks WHERE user_id = $1",
            &[&user],
        )
        .await
        .unwrap();
    by_name!(r, "logged_seq", "archived_seq", "memory_version")
}

/// Logs of three users in four threads (and one without a thread),
/// interleaved as real traffic is: three rounds, the third user in the
/// first only. Returns each user's expected records: one per thread.
async fn interleaved_threads(
    c: &Client,
    [a, b, u3]: [Uuid; 3],
    [t1, t2, t3, t4]: [Uuid; 4],
) -> BTreeMap<Uuid, BTreeSet<Vec<i64>>> {
    let mut expect: BTreeMap<Uuid, BTreeSet<Vec<i64>>> = BTreeMap::new();
    let mut threads: BTreeMap<(Uuid, Option<Uuid>), Vec<i64>> = BTreeMap::new();
    for round in 0..3 {
        for (user, thread) in [(a, Some(t1)), (a, Some(t2)), (b, Some(t3)), (b, None), (u3, Some(t4))] {
            if user == u3 && round > 0 {
                continue;
            }
            let id = log(c, user, thread, &format!("round {round} talk about travel plans"), 60.0).await;
            threads.entry((user, thread)).or_default().push(id);
        }
    }
    for ((user, _), ids) in threads {
        expect.entry(user).or_default().insert(ids);
    }
    expect
}

/// No record's period strays more than a second from its turns' times (the
/// offline provider's buckets are the messages' own times).
async fn assert_buckets_span_their_turns(c: &Client) {
    let bad_buckets = count(
        c,
        "SELECT count(*) FROM lsm_storage l,
                LATERAL (SELECT min(created_at) AS first, max(created_at) AS last
                         FROM raw_logs r WHERE r.id = ANY (l.raw_log_ids)) m
         WHERE abs(extract(epoch FROM m.first - l.time_bucket_start)) > 1
            OR abs(extract(epoch FROM m.last - l.time_bucket_end)) > 1",
    )
    .await;
    assert_eq!(bad_buckets, 0);
}

/// Every run left a row, finished and timed; the first counts what it did.
async fn assert_every_run_recorded(c: &Client) {
    let runs = c
        .query(
            "SELECT users, users_archived, logs, records, failures, finished_at IS NOT NULL AS finished, duration_ms IS NOT NULL AS timed
             FROM archive_runs ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(runs.len(), 3);
    assert_eq!(
        (
            runs[0].get::<_, i32>("users"),
            runs[0].get::<_, i32>("users_archived"),
            runs[0].get::<_, i64>("logs"),
            runs[0].get::<_, i32>("records"),
            runs[0].get::<_, i32>("failures")
        ),
        (3, 3, 13, 5, 0)
    );
    assert!(
        runs.iter()
            .all(|r| r.get::<_, bool>("finished") && r.get::<_, bool>("timed"))
    );
}

/// `maasctl archivist show` gives the memory version of `user`; a new log
/// in `thread` is pending again, and the version moves on the next archive.
async fn assert_memory_version_shown_and_moved(url: &str, c: &Client, user: Uuid, thread: Uuid) {
    let id = user.to_string();
    let (code, out, _) = maasctl_async(url, &["--json", "archivist", "show", "--user", &id], NO_ENV).await;
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["memory_version"], 2);
    assert_eq!(v["pending"], 0);
    log(c, user, Some(thread), "one more", 0.0).await;
    let (_, out, _) = maasctl_async(url, &["archivist", "show", "--user", &id], NO_ENV).await;
    assert!(out.contains("7 logged, 6 archived, 1 pending"), "{out}");
    let (code, out, _) = maasctl_async(url, &["--json", "archivist", "run", "--user", &id], NO_ENV).await;
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["users"][0]["outcome"], "archived");
    assert_eq!(v["users"][0]["memory_version"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_users_with_threads_get_the_right_records() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (a, b, u3) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let threads = [Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4()];
    let expect = interleaved_threads(&c, [a, b, u3], threads).await;
    let env = [("MAAS_ARCHIVIST__MIN_PENDING", "1".to_owned())];
    let (code, out, err) = maasctl_async(&db.url, &["archivist", "run"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("3 users, 3 archived, 13 logs, 5 records, 0 failed"),
        "{out}"
    );
    for (user, want) in &expect {
        let got: BTreeSet<Vec<i64>> = records(&c, *user).await.into_iter().collect();
        assert_eq!(&got, want, "records of {user}");
    }
    assert_exactly_once(&c, true).await;
    assert_eq!(mark(&c, a).await, (6, 6, 2));
    assert_eq!(mark(&c, b).await, (6, 6, 2));
    assert_eq!(mark(&c, u3).await, (1, 1, 1));
    assert_buckets_span_their_turns(&c).await;

    // A second run with nothing new adds nothing, with or without --user.
    let (code, out, err) = maasctl_async(&db.url, &["archivist", "run"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("0 users"), "{out}");
    let (code, out, _) = maasctl_async(&db.url, &["archivist", "run", "--user", &a.to_string()], &env).await;
    assert_eq!(code, 0);
    assert!(out.contains("nothing pending (memory version 2)"), "{out}");
    assert_eq!(count(&c, "SELECT count(*) FROM lsm_storage").await, 5);

    assert_every_run_recorded(&c).await;
    assert_memory_version_shown_and_moved(&db.url, &c, b, threads[2]).await;
    assert_exactly_once(&c, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_thread_is_split_into_chunks_by_the_budget() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let thread = Some(Uuid::new_v4());
    let mut ids = Vec::new();
    for i in 0..6 {
        // About 100 estimated tokens each (one per three bytes).
        ids.push(log(&c, user, thread, &format!("{i} {}", "word ".repeat(60)), 10.0).await);
    }
    let env = [
        ("MAAS_ARCHIVIST__CHUNK_TOKENS", "300".to_owned()),
        ("MAAS_ARCHIVIST__BATCH_LOGS", "4".to_owned()),
    ];
    let (code, out, err) = maasctl_async(&db.url, &["archivist", "run", "--user", &user.to_string()], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    let got = records(&c, user).await;
    // Batches of 4 then 2; each chunk holds two ~124-token messages.
    assert_eq!(got, vec![ids[0..2].to_vec(), ids[2..4].to_vec(), ids[4..6].to_vec()]);
    assert_eq!(mark(&c, user).await, (6, 6, 3));
    assert_exactly_once(&c, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thresholds_activity_and_cooldown_decide_who_is_archived() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let many = Uuid::new_v4(); // 3 fresh logs: N reached
    let few = Uuid::new_v4(); // 1 fresh log: neither N nor T
    let old = Uuid::new_v4(); // 1 log two hours old: T reached, active within A
    let gone = Uuid::new_v4(); // 5 logs two days old: not active within A
    let cooled = Uuid::new_v4(); // 3 fresh logs but archived ten minutes ago
    logs(&c, many, None, 3, 5.0).await;
    logs(&c, few, None, 1, 5.0).await;
    logs(&c, old, None, 1, 7200.0).await;
    logs(&c, gone, None, 5, 2.0 * 86_400.0).await;
    logs(&c, cooled, None, 3, 5.0).await;
    c.execute(
        "UPDATE archive_marks SET last_archived_at = now() - interval '10 minutes' WHERE user_id = $1",
        &[&cooled],
    )
    .await
    .unwrap();
    let env = [
        ("MAAS_ARCHIVIST__MIN_PENDING", "3".to_owned()),
        ("MAAS_ARCHIVIST__MAX_PENDING_AGE_SECS", "3600".to_owned()),
        ("MAAS_ARCHIVIST__ACTIVE_WITHIN_SECS", "86400".to_owned()),
        ("MAAS_ARCHIVIST__COOLDOWN_SECS", "3600".to_owned()),
    ];

    // A dry run names them and changes nothing.
    let (code, out, err) = maasctl_async(&db.url, &["--json", "archivist", "run", "--dry-run"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    let planned: BTreeSet<String> = v["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["user_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(planned, BTreeSet::from([many.to_string(), old.to_string()]));
    assert_eq!(count(&c, "SELECT count(*) FROM lsm_storage").await, 0);
    assert_eq!(count(&c, "SELECT count(*) FROM archive_runs").await, 0);

    let (code, out, err) = maasctl_async(&db.url, &["archivist", "run"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    let archived: BTreeSet<Uuid> = column::<Uuid>(&c, "SELECT DISTINCT user_id FROM lsm_storage", &[])
        .await
        .into_iter()
        .collect();
    assert_eq!(archived, BTreeSet::from([many, old]), "{out}");

    // The cooldown holds even when N is reached again.
    logs(&c, many, None, 3, 0.0).await;
    let (_, out, _) = maasctl_async(&db.url, &["archivist", "run"], &env).await;
    assert!(out.contains("0 users"), "{out}");
    // --user ignores thresholds and cooldown.
    for user in [few, many, cooled] {
        let (code, out, _) = maasctl_async(&db.url, &["archivist", "run", "--user", &user.to_string()], &env).await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("archived"), "{out}");
    }
    assert_eq!(mark(&c, gone).await.1, 0, "the inactive user is untouched");
    assert_exactly_once(&c, false).await;
}

#[tokio::test]
async fn candidate_selection_reads_the_marks_index_not_the_logs() {
    let db = TestDb::new().await;
    let c = db.client().await;
    for _ in 0..20 {
        logs(&c, Uuid::new_v4(), None, 2, 5.0).await;
    }
    c.batch_execute("ANALYZE; SET enable_seqscan = off").await.unwrap();
    let sql = maas::repo::statement("archive_candidates").unwrap();
    let plan: Vec<String> = column(
        &c,
        &format!(
            "EXPLAIN {}",
            sql.replace("$1", "20")
                .replace("$2", "86400")
                .replace("$3", "86400")
                .replace("$4", "3600")
                .replace("$5", "256")
        ),
        &[],
    )
    .await;
    let plan = plan.join("\n");
    assert!(!plan.contains("raw_logs"), "{plan}");
    assert!(plan.contains("archive_marks_pending_idx"), "{plan}");
}

#[tokio::test]
async fn a_commit_from_a_stale_mark_writes_nothing() {
    use maas::repo::archive::{Committed, NewRecord, commit_batch};
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let ids = logs(&c, user, None, 2, 1.0).await;
    let pool = db.pool();
    let client = pool.get().await.unwrap();
    let rec = NewRecord {
        time_bucket_start: chrono::Utc::now(),
        time_bucket_end: chrono::Utc::now(),
        tags: vec!["x".into()],
        summary: "s".into(),
        raw_log_ids: ids.clone(),
    };
    let first = commit_batch(&client, user, 0, 2, std::slice::from_ref(&rec))
        .await
        .unwrap();
    assert_eq!(
        first,
        Committed::Applied {
            memory_version: 1,
            records: 1
        }
    );
    let second = commit_batch(&client, user, 0, 2, &[rec]).await.unwrap();
    assert_eq!(second, Committed::Fenced);
    assert_eq!(records(&c, user).await, vec![ids]);
    assert_eq!(mark(&c, user).await, (2, 2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_archive_each_log_once() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let users: Vec<Uuid> = (0..12).map(|_| Uuid::new_v4()).collect();
    for (i, u) in users.iter().enumerate() {
        for t in 0..2 {
            let thread = Some(Uuid::from_u128(u128::try_from(i * 10 + t).unwrap() + 1));
            logs(&c, *u, thread, 4, 30.0).await;
        }
    }
    let env = vec![
        ("MAAS_ARCHIVIST__MIN_PENDING", "1".to_owned()),
        ("MAAS_ARCHIVIST__BATCH_LOGS", "3".to_owned()),
        ("MAAS_ARCHIVIST__COOLDOWN_SECS", "0".to_owned()),
        ("MAAS_LLM__OFFLINE__LATENCY_MS", "20".to_owned()),
    ];
    // Four runs of everything and two of one user, all at once; traffic
    // keeps arriving meanwhile.
    let run = |args: Vec<String>| {
        let (url, env) = (db.url.clone(), env.clone());
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            tokio_command(&url, &args, &env).output().await
        }
    };
    let mut children = Vec::new();
    for _ in 0..4 {
        children.push(run(vec!["archivist".into(), "run".into()]));
    }
    for _ in 0..2 {
        children.push(run(vec![
            "archivist".into(),
            "run".into(),
            "--user".into(),
            users[0].to_string(),
        ]));
    }
    let writer = async {
        for u in &users {
            log(&c, *u, None, "late arrival", 0.0).await;
        }
    };
    let (outs, ()) = tokio::join!(futures_util::future::join_all(children), writer);
    for o in outs {
        let o = o.unwrap();
        assert!(
            o.status.code() == Some(0),
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert_exactly_once(&c, false).await;
    // One more run picks up whatever arrived after the others read.
    let (code, out, err) = maasctl_async(&db.url, &["archivist", "run"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_exactly_once(&c, true).await;
    let versions = count(
        &c,
        "SELECT count(*) FROM archive_marks m WHERE memory_version <> (SELECT count(*) FROM lsm_storage l WHERE l.user_id = m.user_id)",
    )
    .await;
    assert_eq!(versions, 0, "the memory version counts the user's records");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_mid_way_resumes_without_duplicates() {
    let fake = FakeLlm::start_with(FakeConfig {
        default_text: summary_json("slow summary"),
        default_latency: Some(Duration::from_millis(1500)),
        ..FakeConfig::default()
    })
    .await;
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let ids = logs(&c, user, None, 6, 10.0).await;
    let mut env = fake_env(&fake);
    env.push(("MAAS_ARCHIVIST__BATCH_LOGS", "2".to_owned()));
    env.push(("MAAS_ARCHIVIST__LEASE_SECS", "3".to_owned()));
    let mut child = tokio_command(&db.url, &["archivist", "run", "--user", &user.to_string()], &env)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The first batch is committed and the second call is in flight: kill.
    wait_until(WAIT, "the first batch is committed", || async {
        count(&c, "SELECT count(*) FROM lsm_storage").await >= 1
    })
    .await;
    fake.wait_for_requests(2, WAIT).await;
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    assert_eq!(records(&c, user).await, vec![ids[0..2].to_vec()]);
    assert_eq!(mark(&c, user).await, (6, 2, 1));
    let crashed = count(&c, "SELECT count(*) FROM archive_runs WHERE finished_at IS NULL").await;
    assert_eq!(crashed, 1, "the killed run's record stays open");

    // Its lease runs out; the next run resumes at the mark.
    fake.set_default(summary_json("fast summary"), None);
    wait_until(WAIT, "the dead runner's lease expires", || async {
        count(
            &c,
            "SELECT count(*) FROM archive_marks WHERE lease_expires_at IS NULL OR lease_expires_at < now()",
        )
        .await
            == 1
    })
    .await;
    let (code, out, err) = maasctl_async(&db.url, &["archivist", "run", "--user", &user.to_string()], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        records(&c, user).await,
        vec![ids[0..2].to_vec(), ids[2..4].to_vec(), ids[4..6].to_vec()]
    );
    assert_eq!(mark(&c, user).await, (6, 6, 3));
    assert_exactly_once(&c, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_failure_backs_off_that_user_and_not_the_others() {
    let fake = FakeLlm::start_with(FakeConfig {
        default_text: summary_json("fine"),
        ..FakeConfig::default()
    })
    .await;
    // The first call fails with a 500, the second and third are invalid JSON.
    fake.push(Api::OpenAi, Reply::server_error());
    let db = TestDb::new().await;
    let c = db.client().await;
    let (first, second, third) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    logs(&c, first, None, 2, 300.0).await;
    logs(&c, second, None, 2, 200.0).await;
    logs(&c, third, None, 2, 100.0).await;
    let mut env = fake_env(&fake);
    env.push(("MAAS_ARCHIVIST__MIN_PENDING", "1".to_owned()));
    env.push(("MAAS_ARCHIVIST__CONCURRENCY", "1".to_owned()));
    env.push(("MAAS_RETRY_BASE_MS", "60000".to_owned()));
    let (code, out, err) = maasctl_async(&db.url, &["archivist", "run"], &env).await;
    assert_eq!(code, 1, "a failed user is a finding: {out}{err}");
    assert!(out.contains(&format!("user {first}: failed: server")), "{out}");
    assert!(out.contains("3 users, 2 archived"), "{out}");
    assert!(records(&c, first).await.is_empty());
    assert_eq!(records(&c, second).await.len(), 1);
    assert_eq!(records(&c, third).await.len(), 1);
    let r = c
        .query_one(
            "SELECT failures, retry_after > now() + interval '20 seconds' AS backing_off, last_error FROM archive_marks WHERE user_id = $1",
            &[&first],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, i32>("failures"), 1);
    assert!(r.get::<_, bool>("backing_off"), "durable backoff");
    let run = c
        .query_one("SELECT failures, errors FROM archive_runs", &[])
        .await
        .unwrap();
    assert_eq!(run.get::<_, i32>(0), 1);
    assert_eq!(run.get::<_, Value>(1)[0]["user_id"], first.to_string());
    // Backing off: the next run leaves it alone; --user does not wait.
    let (code, out, _) = maasctl_async(&db.url, &["archivist", "run"], &env).await;
    assert_eq!(code, 0);
    assert!(out.contains("0 users"), "{out}");
    fake.push(Api::OpenAi, Reply::text("not json"));
    fake.push(Api::OpenAi, Reply::text("```json\n{\"summary\": \"no times\"}\n```"));
    let (code, out, _) = maasctl_async(&db.url, &["archivist", "run", "--user", &first.to_string()], &env).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("invalid_json"), "{out}");
    let (code, out, _) = maasctl_async(&db.url, &["archivist", "run", "--user", &first.to_string()], &env).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(mark(&c, first).await, (2, 2, 1));
    let failures: i32 = value(&c, "SELECT failures FROM archive_marks WHERE user_id = $1", &[&first]).await;
    assert_eq!(failures, 0, "a success clears the backoff");
    // What the archivist model was sent: the prompt and the messages.
    let req = &fake.requests_for(Api::OpenAi)[0];
    assert_eq!(req.body["model"], "archive-model");
    let body = req.body.to_string();
    assert!(body.contains("You are the archivist"), "{body}");
    assert!(body.contains("gardening tomatoes"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_request_sees_its_own_users_new_memory_and_nobody_elses() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (alice, bob) = (Uuid::new_v4(), Uuid::new_v4());
    log(&c, alice, None, "Alice planned a zebra safari in Kenya", 60.0).await;
    log(&c, bob, None, "Bob hides a walrus surprise party", 60.0).await;
    let (code, out, err) = maasctl_async(
        &db.url,
        &["archivist", "run"],
        &[("MAAS_ARCHIVIST__MIN_PENDING", "1".to_owned())],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");

    let fake = FakeLlm::start().await;
    fake.push(
        Api::OpenAi,
        Reply::text(
            json!({"needs_context": false, "context_type": "none", "time_scope": "none",
                   "search_keywords": [], "context_found": null})
            .to_string(),
        ),
    );
    fake.push(Api::OpenAi, Reply::text("an answer"));
    let _d = Maasd::spawn(
        &db.url,
        Opts::default()
            .env("MAAS_LLM_PROVIDER", "openai")
            .env("OPENAI_BASE_URL", fake.openai_base_url())
            .env("OPENAI_API_KEY", KEY)
            .env("MAAS_ARCHIVIST__ENABLED", "false"),
    );
    c.execute(
        "INSERT INTO pipeline_runs (user_id, user_query) VALUES ($1, 'What was my trip?')",
        &[&alice],
    )
    .await
    .unwrap();
    let got = fake.wait_for_requests(1, WAIT).await;
    let analyzer = got[0].body.to_string();
    assert!(
        analyzer.contains("zebra"),
        "the analyzer sees her new memory: {analyzer}"
    );
    assert!(!analyzer.contains("walrus"), "and nobody else's: {analyzer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_archives_unattended_once_per_tick_across_daemons() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let opts = || {
        Opts::default()
            .env("MAAS_ARCHIVIST__SCHEDULE", "* * * * * *")
            .env("MAAS_ARCHIVIST__MIN_PENDING", "1")
            .env("MAAS_ARCHIVIST__COOLDOWN_SECS", "0")
            .env("MAAS_ARCHIVIST__BATCH_LOGS", "2")
            .env("MAAS_LLM__OFFLINE__LATENCY_MS", "30")
    };
    let _a = Maasd::spawn(&db.url, opts());
    let _b = Maasd::spawn(&db.url, opts());
    let users: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
    for round in 0..3 {
        for u in &users {
            logs(&c, *u, Some(Uuid::from_u128(round + 1)), 3, 1.0).await;
        }
        wait_until(WAIT, "the schedule archives every log", || async {
            count(&c, "SELECT count(*) FROM archive_marks WHERE archived_seq < logged_seq").await == 0
        })
        .await;
    }
    assert_exactly_once(&c, true).await;
    let runs = count(
        &c,
        "SELECT count(*) FROM archive_runs WHERE trigger = 'cron' AND logs > 0",
    )
    .await;
    assert!(runs >= 1);
    // One run per tick, and never two at once across both daemons.
    let per_tick = count(
        &c,
        "SELECT count(*) FROM (SELECT tick FROM archive_runs WHERE trigger = 'cron' GROUP BY tick HAVING count(*) > 1) d",
    )
    .await;
    assert_eq!(per_tick, 0);
    assert_no_overlapping_cron_runs(&c).await;
    let workers = count(
        &c,
        "SELECT count(DISTINCT worker) FROM archive_runs WHERE trigger = 'cron'",
    )
    .await;
    assert!(workers >= 1);
}
