//! One bad neighbour harms nobody else (invariant 9): rows with
//! odd values, replies with odd bytes, a batch the database refuses. The
//! offender is refused by name or fails alone with a reason; every other
//! request completes on its first attempt.

use std::time::Duration;

use serde_json::json;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{TestDb, apply_migration, by_name, rows, value};
use crate::support::fake_llm::{FakeConfig, FakeLlm, Reply};
use crate::support::{GENEROUS, count, summary, wait_until};

const KEY: &str = "sk-test-key-poison";

/// Requests of `ids` that are not COMPLETED, or that have a step other than
/// one succeeded first attempt per stage.
async fn harmed(c: &Client, ids: &[Uuid]) -> Vec<String> {
    rows(
        c,
        "SELECT r.id::text || ' ' || r.status || ' ' || coalesce(r.error, '') || ' steps: ' ||
                coalesce((SELECT string_agg(s.stage || '#' || s.attempt || ' ' || s.outcome, ', ' ORDER BY s.id)
                          FROM pipeline_steps s WHERE s.run_id = r.id), '')
         FROM pipeline_runs r
         WHERE r.id = ANY($1)
           AND (r.status <> 'COMPLETED'
                OR (SELECT count(*) FROM pipeline_steps s WHERE s.run_id = r.id) <> 3
                OR EXISTS (SELECT 1 FROM pipeline_steps s
                           WHERE s.run_id = r.id AND (s.outcome <> 'succeeded' OR s.attempt <> 1)))",
        &[&ids],
        |r| r.get::<_, String>(0),
    )
    .await
}

async fn wait_terminal(c: &Client, ids: &[Uuid]) {
    wait_until(GENEROUS, "the requests are terminal", || async {
        value::<i64>(
            c,
            "SELECT count(*) FROM pipeline_runs WHERE id = ANY($1)
               AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')",
            &[&ids],
        )
        .await
            == 0
    })
    .await;
}

/// `n` requests of fresh users, inserted in one statement (claimed and
/// finished together, so their results share batches).
async fn innocents(c: &Client, n: i64, tag: &str) -> Vec<Uuid> {
    crate::support::db::column(
        c,
        "INSERT INTO pipeline_runs (user_id, user_query)
         SELECT gen_random_uuid(), $2 || ' innocent #' || g FROM generate_series(1, $1::int8) g
         RETURNING id",
        &[&n, &tag],
    )
    .await
}

/// The error of a statement the database refused, as the daemon and maasctl
/// show it.
async fn refusal(c: &Client, sql: &str) -> String {
    let e = c.batch_execute(sql).await.expect_err(sql);
    maas::db::Error::from(e).to_string()
}

// ---------------------------------------------------------------- errors --

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_error_says_what_happened() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let text = refusal(
        &c,
        "INSERT INTO pipeline_runs (user_id, user_query, status) VALUES (gen_random_uuid(), 'x', 'EXPLODED')",
    )
    .await;
    assert!(!text.contains("db error"), "{text}");
    assert!(
        text.contains("violates check constraint"),
        "the server's message: {text}"
    );
    assert!(text.contains("SQLSTATE 23514"), "the SQLSTATE: {text}");
    assert!(
        text.contains("constraint pipeline_runs_status_valid"),
        "the constraint: {text}"
    );
    assert!(text.contains("table pipeline_runs"), "the table: {text}");
    assert!(text.contains("detail: Failing row contains"), "the detail: {text}");
    // A missing column: message and code, no constraint.
    let text = refusal(&c, "SELECT no_such_column FROM pipeline_runs").await;
    assert!(text.contains("column \"no_such_column\" does not exist"), "{text}");
    assert!(text.contains("SQLSTATE 42703"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_claim_is_logged_with_the_servers_message() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Every analyze claim is refused by the database, as an overflowing
    // row used to make it.
    c.batch_execute(
        "CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.status = 'ANALYZING' THEN
                 RAISE EXCEPTION 'the test refuses every claim' USING ERRCODE = 'P0001', HINT = 'drop the trigger';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_claims BEFORE UPDATE ON pipeline_runs FOR EACH ROW EXECUTE FUNCTION refuse_claims();",
    )
    .await
    .unwrap();
    innocents(&c, 1, "refused").await;
    let d = Maasd::spawn(&db.url, crate::support::ops::fast());
    wait_until(GENEROUS, "the daemon logs the failed claim", || async {
        d.plain_log().contains("claim failed")
    })
    .await;
    let log = d.plain_log();
    let line = log.lines().find(|l| l.contains("claim failed")).unwrap();
    assert!(line.contains("the test refuses every claim"), "{line}");
    assert!(line.contains("SQLSTATE P0001"), "{line}");
    assert!(line.contains("hint: drop the trigger"), "{line}");
    assert!(!line.contains("db error"), "{line}");
}

// ------------------------------------------------------------------ rows --

/// Each class of bad value a producer may insert, refused by its constraint.
const REFUSED: &[(&str, &str)] = &[
    (
        "INSERT INTO pipeline_runs (user_id, user_query, attempt) VALUES (gen_random_uuid(), 'x', 2147483647)",
        "pipeline_runs_attempt_range",
    ),
    (
        "INSERT INTO pipeline_runs (user_id, user_query, lease_token) VALUES (gen_random_uuid(), 'x', 9223372036854775807)",
        "pipeline_runs_lease_token_range",
    ),
    (
        "INSERT INTO pipeline_runs (user_id, user_query, run_after) VALUES (gen_random_uuid(), 'x', '-infinity')",
        "pipeline_runs_time_range",
    ),
    (
        "INSERT INTO pipeline_runs (user_id, user_query, updated_at) VALUES (gen_random_uuid(), 'x', 'infinity')",
        "pipeline_runs_time_range",
    ),
    (
        "INSERT INTO pipeline_runs (user_id, user_query, status, analysis_result)
         VALUES (gen_random_uuid(), 'x', 'ANALYZED', '\"just a string\"')",
        "pipeline_runs_analysis_shape",
    ),
    (
        "INSERT INTO pipeline_runs (user_id, user_query, status, final_answer)
         VALUES (gen_random_uuid(), 'x', 'COMPLETED', repeat('a', 1000001))",
        "pipeline_runs_answer_size",
    ),
    (
        "INSERT INTO pipeline_runs (user_id, user_query, status, lease_owner, lease_expires_at)
         VALUES (gen_random_uuid(), 'x', 'ANALYZING', repeat('w', 300), now())",
        "pipeline_runs_lease_owner_size",
    ),
    (
        "INSERT INTO raw_logs (user_id, message_type, content, created_at)
         VALUES (gen_random_uuid(), 'user_query', 'x', 'infinity')",
        "raw_logs_time_range",
    ),
    (
        "INSERT INTO raw_logs (user_id, message_type, content)
         VALUES (gen_random_uuid(), 'user_query', repeat('a', 1000001))",
        "raw_logs_content_size",
    ),
    (
        "INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, summary)
         VALUES (gen_random_uuid(), '-infinity', now(), 's')",
        "lsm_storage_time_range",
    ),
    (
        "INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, summary)
         VALUES (gen_random_uuid(), now(), now(), repeat('a', 1000001))",
        "lsm_storage_summary_size",
    ),
    (
        "INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, summary, tags)
         VALUES (gen_random_uuid(), now(), now(), 's', array_fill('t'::text, ARRAY[1001]))",
        "lsm_storage_tags_size",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_producer_value_is_refused_by_name_and_others_complete() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // The first example: a row at attempt's type limit used to be
    // accepted and then failed every analyze claim, for ever.
    for (sql, constraint) in REFUSED {
        let text = refusal(&c, sql).await;
        assert!(text.contains("SQLSTATE 23514"), "{sql}: {text}");
        assert!(text.contains(&format!("constraint {constraint}")), "{sql}: {text}");
    }
    let _d = Maasd::spawn(&db.url, crate::support::ops::fast());
    let ids = innocents(&c, 5, "after the refusals").await;
    wait_terminal(&c, &ids).await;
    assert_eq!(harmed(&c, &ids).await, Vec::<String>::new(), "{}", summary(&c).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_at_the_bounds_are_accepted_and_handled_alone() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Inside the bounds, at their edges: each is claimed, run and written.
    let edge: Vec<Uuid> = crate::support::db::column(
        &c,
        "INSERT INTO pipeline_runs (user_id, user_query, attempt, lease_token, run_after, created_at)
         VALUES (gen_random_uuid(), 'attempt at the bound', 1000, 0, now(), now()),
                (gen_random_uuid(), 'token at the bound', 0, 4611686018427387904, now(), now()),
                (gen_random_uuid(), 'due since year 1', 0, 0, '0001-01-01 00:00:00+00', '0001-01-01 00:00:00+00')
         RETURNING id",
        &[],
    )
    .await;
    // Memory at the edges of its bounds, read by the analyze claim.
    c.batch_execute(
        "INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, summary)
         SELECT user_id, '0001-01-01 00:00:00+00', '9999-12-30 00:00:00+00', 'edge'
         FROM pipeline_runs",
    )
    .await
    .unwrap();
    // Accepted values a stage cannot use: a ready status with what it
    // needs missing or malformed. Each ends alone, COMPLETED or FAILED with
    // a reason.
    let odd: Vec<Uuid> = crate::support::db::column(
        &c,
        "INSERT INTO pipeline_runs (user_id, user_query, status, analysis_result, final_context_payload)
         VALUES (gen_random_uuid(), 'odd analysis', 'ANALYZED',
                 '{\"needs_context\": \"yes\", \"context_found\": [1, 2], \"time_scope\": 7}', NULL),
                (gen_random_uuid(), 'no analysis', 'ANALYZED', NULL, NULL),
                (gen_random_uuid(), 'no context', 'READY', NULL, NULL)
         RETURNING id",
        &[],
    )
    .await;
    let others = innocents(&c, 5, "beside the edges").await;
    let _d = Maasd::spawn(&db.url, crate::support::ops::fast());
    wait_terminal(&c, &edge).await;
    wait_terminal(&c, &odd).await;
    wait_terminal(&c, &others).await;
    let unexplained = count(
        &c,
        "SELECT count(*) FROM pipeline_runs WHERE user_query IN ('odd analysis', 'no analysis', 'no context')
           AND NOT (status = 'COMPLETED' OR (status = 'FAILED' AND coalesce(error, '') <> ''
                                             AND error NOT LIKE 'lease expired%'))",
    )
    .await;
    assert_eq!(unexplained, 0, "{}", summary(&c).await);
    assert_eq!(harmed(&c, &others).await, Vec::<String>::new(), "{}", summary(&c).await);
    let done = count(
        &c,
        "SELECT count(*) FROM pipeline_runs WHERE status = 'COMPLETED' AND user_query IN
           ('attempt at the bound', 'token at the bound', 'due since year 1')",
    )
    .await;
    assert_eq!(done, 3, "{}", summary(&c).await);
    // The claim saturated the token instead of overflowing.
    let token: i64 = value(
        &c,
        "SELECT lease_token FROM pipeline_runs WHERE user_query = 'token at the bound'",
        &[],
    )
    .await;
    assert_eq!(token, 4_611_686_018_427_387_904);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_0009_brings_existing_bad_rows_inside_the_bounds() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // The database as it was before 0009, holding rows 0009 forbids.
    c.batch_execute(
        "ALTER TABLE pipeline_runs DROP CONSTRAINT pipeline_runs_attempt_range,
             DROP CONSTRAINT pipeline_runs_lease_token_range, DROP CONSTRAINT pipeline_runs_time_range,
             DROP CONSTRAINT pipeline_runs_lease_owner_size, DROP CONSTRAINT pipeline_runs_error_size,
             DROP CONSTRAINT pipeline_runs_answer_size, DROP CONSTRAINT pipeline_runs_context_size,
             DROP CONSTRAINT pipeline_runs_analysis_shape;
         ALTER TABLE raw_logs DROP CONSTRAINT raw_logs_time_range, DROP CONSTRAINT raw_logs_content_size;
         ALTER TABLE lsm_storage DROP CONSTRAINT lsm_storage_time_range,
             DROP CONSTRAINT lsm_storage_summary_size, DROP CONSTRAINT lsm_storage_tags_size;
         INSERT INTO pipeline_runs (user_id, user_query, attempt) VALUES (gen_random_uuid(), 'stuck', 2147483647);
         INSERT INTO pipeline_runs (user_id, user_query, status, attempt, final_answer)
             VALUES (gen_random_uuid(), 'done long ago', 'COMPLETED', 5000, repeat('a', 1000005));
         INSERT INTO pipeline_runs (user_id, user_query, updated_at) VALUES (gen_random_uuid(), 'future', 'infinity');
         INSERT INTO raw_logs (user_id, message_type, content, created_at)
             VALUES (gen_random_uuid(), 'user_query', 'x', 'infinity');
         INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, summary)
             VALUES (gen_random_uuid(), '-infinity', 'infinity', 's');",
    )
    .await
    .unwrap();
    apply_migration(&c, 9).await;
    let (status, error): (String, Option<String>) = c
        .query_one(
            "SELECT status, error FROM pipeline_runs WHERE user_query = 'stuck'",
            &[],
        )
        .await
        .map(|r| by_name!(r, "status", "error"))
        .unwrap();
    assert_eq!(status, "FAILED");
    assert!(error.unwrap_or_default().contains("attempt 2147483647 is over 1000"));
    let kept: (String, i32, i32) = c
        .query_one(
            "SELECT status, attempt, length(final_answer) AS answer_length FROM pipeline_runs WHERE user_query = 'done long ago'",
            &[],
        )
        .await
        .map(|r| by_name!(r, "status", "attempt", "answer_length"))
        .unwrap();
    assert_eq!(kept, ("COMPLETED".to_owned(), 1000, 1_000_000));
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM pipeline_runs WHERE user_query = 'future' AND status = 'NEW' AND isfinite(updated_at)"
        )
        .await,
        1
    );
    // Every constraint validated.
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM pg_constraint WHERE NOT convalidated AND conrelid IN
                     ('pipeline_runs'::regclass, 'raw_logs'::regclass, 'lsm_storage'::regclass)"
        )
        .await,
        0
    );
}

// --------------------------------------------------------------- replies --

fn analysis(keywords: serde_json::Value) -> String {
    json!({"needs_context": false, "context_type": "none", "time_scope": "none",
           "search_keywords": keywords, "context_found": null})
    .to_string()
}

/// A provider whose every reply is an analysis with the keyword `fine`,
/// after `latency`.
async fn fine_after(latency: Duration) -> FakeLlm {
    FakeLlm::start_with(FakeConfig {
        default_text: analysis(json!(["fine"])),
        default_latency: Some(latency),
        ..FakeConfig::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_reply_harms_only_its_own_request() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Every reply takes a moment, so the requests of one INSERT finish
    // together and their results share batches.
    let fake = fine_after(Duration::from_millis(300)).await;
    poison_the_replies(&fake);
    let api = Api::start(
        &db,
        crate::support::ops::fast()
            .env("MAAS_LLM_PROVIDER", "openai")
            .env("OPENAI_BASE_URL", fake.openai_base_url())
            .env("OPENAI_API_KEY", KEY)
            .env("MAAS_LLM__ANALYZER__MODEL", "cheap-model")
            .env("MAAS_LLM__RESPONDER__MODEL", "strong-model"),
    )
    .await;
    let ids = insert_poisoned_and_innocent(&c).await;
    let all: Vec<Uuid> = ids.iter().map(|(id, _)| *id).collect();
    wait_terminal(&c, &all).await;
    let innocent: Vec<Uuid> = ids
        .iter()
        .filter(|(_, q)| q.starts_with("innocent"))
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(
        harmed(&c, &innocent).await,
        Vec::<String>::new(),
        "{}",
        summary(&c).await
    );
    poison_is_stored_sanitised_or_refused_with_a_reason(&c).await;
    poison_is_counted_by_kind(&api).await;
}

/// Arms `fake` with a poisoned reply for each POISON-… query: NULs, a huge
/// answer, a lone surrogate, a long model name, deep nesting.
fn poison_the_replies(fake: &FakeLlm) {
    let slow = |r: Reply| r.after(Duration::from_millis(300));
    // A NUL inside the analysis JSON (PostgreSQL's jsonb refuses \u0000).
    fake.answer_when(
        &["POISON-NUL-ANALYSIS", "cheap-model"],
        slow(Reply::text(analysis(json!(["a\u{0}b"])))),
    );
    // A NUL in the answer (text refuses it).
    fake.answer_when(&["POISON-NUL-ANSWER", "strong-model"], slow(Reply::text("ans\u{0}wer")));
    // An enormous answer.
    fake.answer_when(
        &["POISON-HUGE-ANSWER", "strong-model"],
        slow(Reply::text("x".repeat(1_200_000))),
    );
    // A lone surrogate escaped in the analysis JSON: not valid text.
    fake.answer_when(
        &["POISON-SURROGATE", "cheap-model"],
        slow(Reply::text(r#"{"needs_context": false, "context_type": "none", "time_scope": "none", "search_keywords": ["\ud800"], "context_found": null}"#)),
    );
    // A model name of 10 kB.
    let long_model = "m".repeat(10_000);
    let body = json!({
        "id": "x", "object": "chat.completion", "created": 0, "model": long_model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": analysis(json!(["k"]))}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    });
    fake.answer_when(
        &["POISON-LONG-MODEL", "cheap-model"],
        slow(Reply::status(200, body.to_string())),
    );
    // Deep nesting inside context_found (kept as the model gave it).
    let mut deep = json!("bottom");
    for _ in 0..100 {
        deep = json!({"d": deep});
    }
    let nested = json!({"needs_context": false, "context_type": "none", "time_scope": "none",
                        "search_keywords": [], "context_found": {"lsm_record_id": null, "deep": deep}})
    .to_string();
    fake.answer_when(&["POISON-DEEP", "cheap-model"], slow(Reply::text(nested)));
}

/// Six poisoned requests and fourteen innocent ones, in one INSERT:
/// (id, query) of each.
async fn insert_poisoned_and_innocent(c: &tokio_postgres::Client) -> Vec<(Uuid, String)> {
    rows(
        c,
        "INSERT INTO pipeline_runs (user_id, user_query)
         SELECT gen_random_uuid(), q
         FROM unnest(ARRAY['POISON-NUL-ANALYSIS', 'POISON-NUL-ANSWER', 'POISON-HUGE-ANSWER', 'POISON-SURROGATE',
                           'POISON-LONG-MODEL', 'POISON-DEEP']
                     || array(SELECT 'innocent #' || g FROM generate_series(1, 14) g)) q
         RETURNING id, user_query",
        &[],
        |r| by_name!(r, "id", "user_query"),
    )
    .await
}

/// What a poisoned reply leaves: stored sanitised, or refused with a reason
/// that says what was wrong.
async fn poison_is_stored_sanitised_or_refused_with_a_reason(c: &tokio_postgres::Client) {
    let of = |q: &'static str| async move {
        c.query_one(
            "SELECT status, coalesce(error, '') AS error, analysis_result::text AS analysis,
                    coalesce(final_answer, '') AS answer
             FROM pipeline_runs WHERE user_query = $1",
            &[&q],
        )
        .await
        .map(|r| {
            (
                r.get::<_, String>("status"),
                r.get::<_, String>("error"),
                r.get::<_, Option<String>>("analysis"),
                r.get::<_, String>("answer"),
            )
        })
        .unwrap()
    };
    let (st, err, an, _) = of("POISON-NUL-ANALYSIS").await;
    assert_eq!(st, "COMPLETED", "{err}");
    assert!(an.unwrap_or_default().contains("\"ab\""));
    let (st, err, _, answer) = of("POISON-NUL-ANSWER").await;
    assert_eq!((st.as_str(), answer.as_str()), ("COMPLETED", "answer"), "{err}");
    let (st, err, _, answer) = of("POISON-HUGE-ANSWER").await;
    assert_eq!((st.as_str(), answer.len()), ("COMPLETED", 1_000_000), "{err}");
    let (st, err, _, _) = of("POISON-LONG-MODEL").await;
    assert_eq!(st, "COMPLETED", "{err}");
    let model_len: i32 = value(
        c,
        "SELECT max(length(s.model)) FROM pipeline_steps s JOIN pipeline_runs r ON r.id = s.run_id
         WHERE r.user_query = 'POISON-LONG-MODEL'",
        &[],
    )
    .await;
    assert!(model_len <= 200, "model name stored at {model_len} characters");
    let (st, err, _, _) = of("POISON-DEEP").await;
    assert_eq!(st, "COMPLETED", "{err}");
    // Refused with a reason that says what was wrong.
    let (st, err, _, _) = of("POISON-SURROGATE").await;
    assert_eq!(st, "FAILED");
    assert!(
        err.to_lowercase().contains("json") || err.contains("surrogate"),
        "{err}"
    );
    assert!(!err.contains("lease expired"), "{err}");
}

/// Counted, by kind.
async fn poison_is_counted_by_kind(api: &Api) {
    let metrics = api.get("/metrics").await.text().await.unwrap();
    for kind in ["nul", "oversize", "nesting"] {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("maas_poison_total{{kind=\"{kind}\"}}")))
            .unwrap_or_else(|| panic!("no maas_poison_total for {kind}: {metrics}"));
        let n: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n >= 1.0, "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_database_refuses_fails_alone_and_the_batch_is_written() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let ids = innocents(&c, 16, "batch").await;
    let victim = ids[7];
    // Any result the sanitiser cannot foresee: the database refuses the
    // successful analyze step of one request.
    c.batch_execute(&format!(
        "CREATE FUNCTION refuse_one() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.run_id = '{victim}' AND NEW.outcome = 'succeeded' THEN
                 RAISE EXCEPTION 'the test refuses this result' USING ERRCODE = 'P0001';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_one BEFORE INSERT ON pipeline_steps FOR EACH ROW EXECUTE FUNCTION refuse_one();"
    ))
    .await
    .unwrap();
    let _d = Maasd::spawn(
        &db.url,
        crate::support::ops::fast().env("MAAS_LLM__OFFLINE__LATENCY_MS", 300),
    );
    wait_terminal(&c, &ids).await;
    let others: Vec<Uuid> = ids.iter().copied().filter(|id| *id != victim).collect();
    assert_eq!(harmed(&c, &others).await, Vec::<String>::new(), "{}", summary(&c).await);
    let (status, error): (String, String) = c
        .query_one(
            "SELECT status, coalesce(error, '') AS error FROM pipeline_runs WHERE id = $1",
            &[&victim],
        )
        .await
        .map(|r| by_name!(r, "status", "error"))
        .unwrap();
    assert_eq!(status, "FAILED");
    assert!(error.contains("the test refuses this result"), "{error}");
    assert!(error.contains("SQLSTATE P0001"), "{error}");
    let steps: Vec<(String, String)> = rows(
        &c,
        "SELECT outcome, coalesce(error_class, '') AS error_class FROM pipeline_steps WHERE run_id = $1 ORDER BY id",
        &[&victim],
        |r| by_name!(r, "outcome", "error_class"),
    )
    .await;
    assert_eq!(steps, vec![("failed".to_owned(), "unwritable_result".to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archivist_reply_with_nul_and_huge_tags_is_stored_sanitised() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let poisoned = json!({
        "time_bucket_start": "2024-05-01T10:00:00Z",
        "time_bucket_end": "2024-05-01T11:00:00Z",
        "tags": ["t\u{0}ag", "x".repeat(5000)],
        "summary": "sum\u{0}mary",
    })
    .to_string();
    let fake = FakeLlm::start_with(FakeConfig {
        default_text: poisoned,
        ..FakeConfig::default()
    })
    .await;
    let user = Uuid::new_v4();
    c.execute(
        "INSERT INTO raw_logs (user_id, message_type, content, created_at)
         VALUES ($1, 'user_query', 'remember the zebra', now() - interval '1 minute')",
        &[&user],
    )
    .await
    .unwrap();
    let env = [
        ("MAAS_LLM__ARCHIVIST__PROVIDER", "openai".to_owned()),
        ("MAAS_LLM__ARCHIVIST__MODEL", "archive-model".to_owned()),
        ("OPENAI_BASE_URL", fake.openai_base_url()),
        ("OPENAI_API_KEY", KEY.to_owned()),
        ("MAAS_ARCHIVIST__MIN_PENDING", "1".to_owned()),
    ];
    let (code, out, err) =
        crate::support::cli::maasctl_async(&db.url, &["archivist", "run", "--user", &user.to_string()], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    let (summary, tags): (String, Vec<String>) = c
        .query_one("SELECT summary, tags FROM lsm_storage WHERE user_id = $1", &[&user])
        .await
        .map(|r| by_name!(r, "summary", "tags"))
        .unwrap();
    assert_eq!(summary, "summary");
    assert_eq!(tags[0], "tag");
    assert_eq!(tags[1].chars().count(), 200);
}

/// Cutting a logged text of a million characters to the archivist's budget
/// holds up nothing else in the daemon. The daemon runs on one runtime
/// thread with a 3 s lease. The newcomer's first archive run plans that
/// text while the daemon's requests wait 4 s for their model, and a
/// second daemon sweeps expired leases. Every request still completes on
/// its first attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archiving_a_huge_turn_holds_up_no_lease() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let fake = fine_after(Duration::from_secs(4)).await;
    let huge = Uuid::new_v4();
    c.execute(
        "INSERT INTO raw_logs (user_id, message_type, content, created_at)
         VALUES ($1, 'user_query', repeat('h', 1000000), now() - interval '1 minute')",
        &[&huge],
    )
    .await
    .unwrap();
    let opts = || {
        Opts {
            lease_secs: 3,
            sweep_secs: 1,
            ..Opts::default()
        }
        .env("MAAS_LLM_PROVIDER", "openai")
        .env("OPENAI_BASE_URL", fake.openai_base_url())
        .env("OPENAI_API_KEY", KEY)
    };
    let _archiving = Maasd::spawn(
        &db.url,
        opts()
            .env("TOKIO_WORKER_THREADS", "1")
            // A model tiktoken knows: its tokens are counted by the real BPE.
            .env("MAAS_LLM__ARCHIVIST__MODEL", "gpt-4o")
            .env("MAAS_ARCHIVIST__MIN_PENDING", "1")
            .env("MAAS_ARCHIVIST__FIRST_RUN_POLL_SECS", "1"),
    );
    let ids = innocents(&c, 6, "beside a huge turn").await;
    wait_until(GENEROUS, "the first daemon holds every request", || async {
        value::<i64>(
            &c,
            "SELECT count(*) FROM pipeline_runs WHERE id = ANY($1) AND status = 'ANALYZING'",
            &[&ids],
        )
        .await
            == 6
    })
    .await;
    let _sweeping = Maasd::spawn(&db.url, opts().env("MAAS_ARCHIVIST__ENABLED", "false"));
    wait_until(GENEROUS, "the huge turn's archive run ends", || async {
        value::<i64>(
            &c,
            "SELECT count(*) FROM archive_runs WHERE only_user = $1 AND finished_at IS NOT NULL",
            &[&huge],
        )
        .await
            > 0
    })
    .await;
    wait_terminal(&c, &ids).await;
    assert_eq!(harmed(&c, &ids).await, Vec::<String>::new(), "{}", summary(&c).await);
}
