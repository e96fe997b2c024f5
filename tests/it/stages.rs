//! The stages for real, against a fake provider over real HTTP and a real
//! daemon: what the provider receives, and every row of the error policy.

use std::time::Duration;

use serde_json::{Value, json};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{TestDb, by_name, rows, value};
use crate::support::fake_llm::{Api, FakeLlm, Recorded, Reply};
use crate::support::{summary, wait_until};

const KEY: &str = "sk-test-key-3f9a";
const WAIT: Duration = Duration::from_secs(60);

fn analysis(record: Option<i64>) -> String {
    json!({
        "needs_context": record.is_some(),
        "context_type": if record.is_some() { "topic" } else { "none" },
        "time_scope": "none",
        "search_keywords": ["trip"],
        "context_found": record.map(|id| json!({"lsm_record_id": id, "period": "May", "relevance": 0.9})),
    })
    .to_string()
}

fn opts(fake: &FakeLlm, api: Api) -> Opts {
    let o = Opts::default()
        .env("MAAS_LLM_PROVIDER", api.provider())
        .env("MAAS_LLM__ANALYZER__MODEL", "cheap-model")
        .env("MAAS_LLM__RESPONDER__MODEL", "strong-model");
    match api {
        Api::OpenAi => o
            .env("OPENAI_BASE_URL", fake.openai_base_url())
            .env("OPENAI_API_KEY", KEY),
        Api::Anthropic => o
            .env("ANTHROPIC_BASE_URL", fake.base_url())
            .env("ANTHROPIC_API_KEY", KEY),
        Api::Gemini => o.env("GEMINI_BASE_URL", fake.base_url()).env("GEMINI_API_KEY", KEY),
    }
}

async fn submit(c: &Client, user: Uuid, query: &str) -> Uuid {
    c.query_one(
        "INSERT INTO pipeline_runs (user_id, user_query) VALUES ($1, $2) RETURNING id",
        &[&user, &query],
    )
    .await
    .unwrap()
    .get(0)
}

async fn wait_terminal(c: &Client, id: Uuid) -> (String, Option<String>, Option<String>) {
    wait_until(WAIT, "the request is terminal", || async {
        let st: String = value(c, "SELECT status FROM pipeline_runs WHERE id = $1", &[&id]).await;
        matches!(st.as_str(), "COMPLETED" | "FAILED" | "CANCELLED")
    })
    .await;
    let r = c
        .query_one(
            "SELECT status, final_answer, error FROM pipeline_runs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    by_name!(r, "status", "final_answer", "error")
}

/// (stage, attempt, outcome, error_class) of every step, in order.
async fn steps(c: &Client, id: Uuid) -> Vec<(String, i32, String, Option<String>)> {
    rows(
        c,
        "SELECT stage, attempt, outcome, error_class FROM pipeline_steps WHERE run_id = $1 ORDER BY id",
        &[&id],
        |r| by_name!(r, "stage", "attempt", "outcome", "error_class"),
    )
    .await
}

fn step(stage: &str, attempt: i32, outcome: &str, class: Option<&str>) -> (String, i32, String, Option<String>) {
    (stage.into(), attempt, outcome.into(), class.map(Into::into))
}

fn body_text(r: &Recorded) -> String {
    r.body.to_string()
}

/// The analysis (fences stripped) and the assembled context stored for
/// request `id`, whose query was "Where did I travel in May?".
async fn assert_analysis_and_context_stored(c: &Client, id: Uuid) {
    let row = c
        .query_one(
            "SELECT analysis_result, final_context_payload FROM pipeline_runs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let analysis: Value = row.get("analysis_result");
    assert_eq!(analysis["needs_context"], false);
    assert_eq!(analysis["search_keywords"], json!(["trip"]));
    let context: String = row.get("final_context_payload");
    assert!(
        context.contains("<current_query>\nWhere did I travel in May?\n</current_query>"),
        "{context}"
    );
    assert!(
        context.starts_with("<system>\nYou are a helpful assistant"),
        "{context}"
    );
}

/// What the OpenAI-shaped provider received: the analyzer's call, then the
/// responder's, each with its key, model, temperature, limit and prompt.
fn assert_openai_received_both_calls(fake: &FakeLlm) {
    let got = fake.requests_for(Api::OpenAi);
    assert_eq!(got.len(), 2);
    let (an, re) = (&got[0], &got[1]);
    assert_eq!(an.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    assert_eq!(an.body["model"], "cheap-model");
    assert_eq!(an.body["temperature"], 0.0);
    assert_eq!(an.body["max_tokens"], 1024);
    assert!(
        body_text(an).contains("You are the analyzer"),
        "the Analyzer prompt is sent"
    );
    assert!(body_text(an).contains("Where did I travel in May?"));
    assert_eq!(re.body["model"], "strong-model");
    assert_eq!(re.body["temperature"], 0.7);
    assert_eq!(re.body["max_tokens"], 2000);
    assert!(body_text(re).contains("<current_query>"));
}

/// The step history of request `id` records model, tokens and latency.
async fn assert_steps_record_usage(c: &Client, id: Uuid) {
    let step_rows = c
        .query(
            "SELECT stage, model, prompt_tokens, completion_tokens, latency_ms FROM pipeline_steps WHERE run_id = $1 ORDER BY id",
            &[&id],
        )
        .await
        .unwrap();
    type Usage = (String, Option<String>, Option<i32>, Option<i32>);
    let got: Vec<Usage> = step_rows
        .iter()
        .map(|r| by_name!(r, "stage", "model", "prompt_tokens", "completion_tokens"))
        .collect();
    assert_eq!(
        got[0],
        ("analyze".into(), Some("cheap-model".into()), Some(120), Some(30))
    );
    assert_eq!(
        got[2],
        ("respond".into(), Some("strong-model".into()), Some(400), Some(12))
    );
    assert!(step_rows.iter().all(|r| r.get::<_, Option<i32>>(4).is_some()));
}

/// The query and the answer of request `id` are logged once each, with the
/// request's ids.
async fn assert_turns_logged_once(c: &Client, id: Uuid, user: Uuid) {
    let logs: Vec<(String, String)> = rows(
        c,
        "SELECT message_type, content FROM raw_logs WHERE request_id = $1 AND user_id = $2 ORDER BY id",
        &[&id, &user],
        |r| by_name!(r, "message_type", "content"),
    )
    .await;
    assert_eq!(
        logs,
        vec![
            ("user_query".into(), "Where did I travel in May?".into()),
            ("assistant_response".into(), "You went to Lisbon.".into())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_request_completes_with_analysis_context_and_answer() {
    let fake = FakeLlm::start().await;
    fake.push(
        Api::OpenAi,
        Reply::text(format!("```json\n{}\n```", analysis(None))).with_usage(120, 30),
    );
    fake.push(Api::OpenAi, Reply::text("You went to Lisbon.").with_usage(400, 12));
    let db = TestDb::new().await;
    let c = db.client().await;
    let d = Maasd::spawn(&db.url, opts(&fake, Api::OpenAi));
    let user = Uuid::new_v4();
    let id = submit(&c, user, "Where did I travel in May?").await;
    let (status, answer, error) = wait_terminal(&c, id).await;
    assert_eq!(status, "COMPLETED", "{error:?}");
    assert_eq!(answer.as_deref(), Some("You went to Lisbon."));
    assert_analysis_and_context_stored(&c, id).await;
    assert_openai_received_both_calls(&fake);
    assert_steps_record_usage(&c, id).await;
    assert_turns_logged_once(&c, id, user).await;
    assert!(!d.log_text().contains(KEY), "the key never reaches the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_and_gemini_shapes_complete() {
    for api in [Api::Anthropic, Api::Gemini] {
        let fake = FakeLlm::start().await;
        fake.push(api, Reply::text(analysis(None)));
        fake.push(api, Reply::text("answer from the model"));
        let db = TestDb::new().await;
        let c = db.client().await;
        let _d = Maasd::spawn(&db.url, opts(&fake, api));
        let id = submit(&c, Uuid::new_v4(), "hello").await;
        let (status, answer, error) = wait_terminal(&c, id).await;
        assert_eq!(status, "COMPLETED", "{api:?}: {error:?}");
        assert_eq!(answer.as_deref(), Some("answer from the model"));
        let got = fake.requests_for(api);
        assert_eq!(got.len(), 2);
        match api {
            Api::Anthropic => {
                assert_eq!(got[0].header("x-api-key"), Some(KEY));
                assert_eq!(got[0].path, "/v1/messages");
                assert_eq!(got[1].body["model"], "strong-model");
                assert_eq!(got[1].body["max_tokens"], 2000);
            }
            _ => {
                assert_eq!(got[0].header("x-goog-api-key"), Some(KEY));
                assert!(
                    got[1].path.contains("/models/strong-model:generateContent"),
                    "{}",
                    got[1].path
                );
                assert_eq!(got[1].body["generationConfig"]["maxOutputTokens"], 2000);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_waits_for_retry_after_then_succeeds() {
    let fake = FakeLlm::start().await;
    fake.push(Api::OpenAi, Reply::rate_limited(Api::OpenAi, Some("1")));
    fake.push(Api::OpenAi, Reply::text(analysis(None)));
    fake.push(Api::OpenAi, Reply::text("ok"));
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = Maasd::spawn(&db.url, opts(&fake, Api::OpenAi));
    let id = submit(&c, Uuid::new_v4(), "q").await;
    assert_eq!(wait_terminal(&c, id).await.0, "COMPLETED");
    assert_eq!(
        steps(&c, id).await[..2],
        [
            step("analyze", 1, "retrying", Some("rate_limited")),
            step("analyze", 2, "succeeded", None)
        ]
    );
    let got = fake.requests_for(Api::OpenAi);
    let waited = got[1].received_at - got[0].received_at;
    assert!(waited >= Duration::from_secs(1), "Retry-After honoured: {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_and_timeouts_retry_with_backoff() {
    let fake = FakeLlm::start().await;
    fake.push(Api::OpenAi, Reply::text(analysis(None)));
    fake.push(Api::OpenAi, Reply::server_error());
    fake.push(Api::OpenAi, Reply::text("late").after(Duration::from_secs(5)));
    fake.push(Api::OpenAi, Reply::text("third time lucky"));
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = Maasd::spawn(
        &db.url,
        opts(&fake, Api::OpenAi).env("MAAS_LLM__RESPONDER__TIMEOUT_SECS", 1),
    );
    let id = submit(&c, Uuid::new_v4(), "q").await;
    let (status, answer, _) = wait_terminal(&c, id).await;
    assert_eq!(status, "COMPLETED", "{}", summary(&c).await);
    assert_eq!(answer.as_deref(), Some("third time lucky"));
    assert_eq!(
        steps(&c, id).await[2..],
        [
            step("respond", 1, "retrying", Some("server")),
            step("respond", 2, "retrying", Some("timeout")),
            step("respond", 3, "succeeded", None)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_json_gets_exactly_one_retry() {
    let fake = FakeLlm::start().await;
    fake.push(Api::OpenAi, Reply::text("Sure! The user wants to know about trips."));
    fake.push(Api::OpenAi, Reply::text(analysis(None)));
    fake.push(Api::OpenAi, Reply::text("fine"));
    fake.push(Api::OpenAi, Reply::text("still not json"));
    fake.push(Api::OpenAi, Reply::text("{\"needs_context\": \"maybe\"}"));
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = Maasd::spawn(&db.url, opts(&fake, Api::OpenAi));
    let once = submit(&c, Uuid::new_v4(), "q1").await;
    assert_eq!(wait_terminal(&c, once).await.0, "COMPLETED");
    assert_eq!(
        steps(&c, once).await[..2],
        [
            step("analyze", 1, "retrying", Some("invalid_json")),
            step("analyze", 2, "succeeded", None)
        ]
    );
    let twice = submit(&c, Uuid::new_v4(), "q2").await;
    let (status, _, error) = wait_terminal(&c, twice).await;
    assert_eq!(status, "FAILED");
    assert!(
        error.as_deref().unwrap_or_default().contains("not valid JSON"),
        "{error:?}"
    );
    assert_eq!(
        steps(&c, twice).await,
        [
            step("analyze", 1, "retrying", Some("invalid_json")),
            step("analyze", 2, "failed", Some("invalid_json"))
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_and_spend_limits_fail_at_once() {
    let fake = FakeLlm::start().await;
    fake.push(Api::Anthropic, Reply::bad_request(Api::Anthropic));
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = Maasd::spawn(&db.url, opts(&fake, Api::Anthropic));
    let bad = submit(&c, Uuid::new_v4(), "q1").await;
    let (status, _, error) = wait_terminal(&c, bad).await;
    assert_eq!(status, "FAILED");
    assert!(error.as_deref().unwrap_or_default().contains("rejected"), "{error:?}");
    assert_eq!(
        steps(&c, bad).await,
        [step("analyze", 1, "failed", Some("bad_request"))]
    );

    fake.push(Api::Anthropic, Reply::spend_limit(Api::Anthropic));
    let broke = submit(&c, Uuid::new_v4(), "q2").await;
    let (status, _, error) = wait_terminal(&c, broke).await;
    assert_eq!(status, "FAILED");
    assert!(
        error.as_deref().unwrap_or_default().contains("spend limit"),
        "{error:?}"
    );
    assert_eq!(
        steps(&c, broke).await,
        [step("analyze", 1, "failed", Some("quota_exhausted"))]
    );
    assert_eq!(fake.requests_for(Api::Anthropic).len(), 2, "neither was retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_other_users_memory_reaches_the_provider() {
    let fake = FakeLlm::start().await;
    let db = TestDb::new().await;
    let c = db.client().await;
    let (alice, bob) = (Uuid::new_v4(), Uuid::new_v4());
    let insert = "INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, tags, summary)
                  VALUES ($1, now() - interval '2 days', now() - interval '1 day', '{trip}', $2) RETURNING id";
    let alice_rec: i64 = value(&c, insert, &[&alice, &"ALICE-went-to-Lisbon"]).await;
    let bob_rec: i64 = value(&c, insert, &[&bob, &"BOB-secret-plans"]).await;
    // Alice's first analysis points at Bob's record (a confused model); the
    // second at her own.
    fake.push(Api::OpenAi, Reply::text(analysis(Some(bob_rec))));
    fake.push(Api::OpenAi, Reply::text("first"));
    let _d = Maasd::spawn(&db.url, opts(&fake, Api::OpenAi));
    let first = submit(&c, alice, "Where did I go?").await;
    assert_eq!(wait_terminal(&c, first).await.0, "COMPLETED");
    fake.push(Api::OpenAi, Reply::text(analysis(Some(alice_rec))));
    fake.push(Api::OpenAi, Reply::text("second"));
    let second = submit(&c, alice, "Where did I go, again?").await;
    assert_eq!(wait_terminal(&c, second).await.0, "COMPLETED");

    let got = fake.requests_for(Api::OpenAi);
    assert_eq!(got.len(), 4);
    for r in &got {
        assert!(
            !body_text(r).contains("BOB-secret"),
            "another user's memory was sent: {}",
            body_text(r)
        );
    }
    assert!(
        body_text(&got[0]).contains("ALICE-went-to-Lisbon"),
        "the analyzer sees her own memory"
    );
    assert!(
        !body_text(&got[1]).contains("context_from_history"),
        "Bob's record is not used"
    );
    assert!(
        body_text(&got[3]).contains("ALICE-went-to-Lisbon"),
        "her own record is used"
    );
    assert!(body_text(&got[3]).contains("Period: "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_during_a_slow_call_is_recovered_with_one_logged_answer() {
    let fake = FakeLlm::start().await;
    fake.push(Api::OpenAi, Reply::text(analysis(None)));
    fake.push(
        Api::OpenAi,
        Reply::text("never delivered").after(Duration::from_secs(30)),
    );
    fake.push(Api::OpenAi, Reply::text("recovered answer"));
    let db = TestDb::new().await;
    let c = db.client().await;
    let quick = |o: Opts| Opts {
        lease_secs: 2,
        sweep_secs: 1,
        ..o
    };
    let mut first = Maasd::spawn(&db.url, quick(opts(&fake, Api::OpenAi)));
    let id = submit(&c, Uuid::new_v4(), "slow").await;
    fake.wait_for_requests(2, WAIT).await;
    // The respond call started with the analysis in hand; the analysis is
    // written a moment later (`RESPOND_WAIT`), and the kill comes after.
    crate::support::ops::wait_status(&c, id, "RESPONDING").await;
    first.kill();
    let _second = Maasd::spawn(&db.url, quick(opts(&fake, Api::OpenAi)));
    let (status, answer, _) = wait_terminal(&c, id).await;
    assert_eq!(status, "COMPLETED");
    assert_eq!(answer.as_deref(), Some("recovered answer"));
    crate::support::assert_one_answer_logged(&c, id).await;
    assert_eq!(
        steps(&c, id).await[2..],
        [
            step("respond", 1, "lease_expired", Some("lease_expired")),
            step("respond", 2, "succeeded", None)
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_provider_setting_stops_the_daemon_with_a_clear_error() {
    let db = TestDb::new().await;
    let mut d = Maasd::spawn(&db.url, Opts::default().env("MAAS_LLM_PROVIDER", "openai"));
    assert_eq!(d.wait_exit(WAIT).await, Some(1));
    let log = d.log_text();
    assert!(log.contains("OPENAI_API_KEY"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_limit_truncates_the_history_and_tries_again() {
    let fake = FakeLlm::start().await;
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let rec: i64 = value(
        &c,
        "INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, summary)
             VALUES ($1, now() - interval '1 day', now(), 'a long history') RETURNING id",
        &[&user],
    )
    .await;
    fake.push(Api::OpenAi, Reply::text(analysis(Some(rec))));
    fake.push(Api::OpenAi, Reply::token_limit(Api::OpenAi));
    fake.push(Api::OpenAi, Reply::text("short answer"));
    let _d = Maasd::spawn(&db.url, opts(&fake, Api::OpenAi));
    let id = submit(&c, user, "what now?").await;
    let (status, answer, _) = wait_terminal(&c, id).await;
    assert_eq!(status, "COMPLETED");
    assert_eq!(answer.as_deref(), Some("short answer"));
    let got = fake.requests_for(Api::OpenAi);
    assert!(body_text(&got[1]).contains("a long history"));
    assert!(!body_text(&got[2]).contains("a long history"), "history dropped");
    assert!(body_text(&got[2]).contains("what now?"), "the query is kept");
    assert_eq!(steps(&c, id).await[2..], [step("respond", 1, "succeeded", None)]);
}

/// A provider outage longer than a request's tries delays its requests
/// instead of failing them: after the first refused connection, the
/// requests wait for the provider without spending tries, and complete
/// once it is back.
#[tokio::test]
async fn a_provider_outage_delays_requests_instead_of_failing_them() {
    use crate::support::fake_llm::FakeConfig;
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut fake = FakeLlm::start_with(FakeConfig {
        default_text: maas::llm::offline::analysis_example(),
        ..FakeConfig::default()
    })
    .await;
    fake.go_down().await;
    let _d = Maasd::spawn(&db.url, opts(&fake, Api::OpenAi));
    let ids = crate::support::insert_requests(&c, 5, "during the outage").await;
    // Three tries (50 ms apart here) would have failed every request well
    // within two seconds of the first refused connection.
    wait_until(WAIT, "the outage is two seconds old", || async {
        c.query_one(
            "SELECT coalesce(min(finished_at) < now() - interval '2 s', false) FROM pipeline_steps",
            &[],
        )
        .await
        .unwrap()
        .get(0)
    })
    .await;
    let failed: i64 = value(&c, "SELECT count(*) FROM pipeline_runs WHERE status = 'FAILED'", &[]).await;
    assert_eq!(failed, 0, "requests failed during the outage");
    let deferred: i64 = value(
        &c,
        "SELECT count(DISTINCT run_id) FROM pipeline_steps
             WHERE outcome = 'deferred' AND error_class IN ('connect', 'throttled')",
        &[],
    )
    .await;
    assert_eq!(deferred, 5, "every request waited for the provider");
    fake.come_back().await;
    for id in ids {
        let (status, answer, error) = wait_terminal(&c, id).await;
        assert_eq!(status, "COMPLETED", "{error:?}");
        assert!(answer.is_some());
    }
}

/// The respond stage starts right after the fused assemble; a slow one is
/// not written with the analysis but handed to the chained respond stage of
/// its request, which takes it over even after waiting for a respond slot
/// (one slot here, two requests at once). The model is called once per
/// request for the answer, and each request records one respond attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_respond_started_early_is_taken_over_and_never_called_twice() {
    let fake = FakeLlm::start().await;
    fake.set_default(analysis(None), Some(Duration::from_millis(300)));
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = Maasd::spawn(&db.url, opts(&fake, Api::OpenAi).env("MAAS_CONCURRENCY__RESPOND", 1));
    let ids = [
        submit(&c, Uuid::new_v4(), "first").await,
        submit(&c, Uuid::new_v4(), "second").await,
    ];
    for id in ids {
        let (status, answer, _) = wait_terminal(&c, id).await;
        assert_eq!(status, "COMPLETED");
        assert_eq!(answer.as_deref(), Some(analysis(None).as_str()));
        assert_eq!(
            steps(&c, id).await,
            [
                step("analyze", 1, "succeeded", None),
                step("assemble", 1, "succeeded", None),
                step("respond", 1, "succeeded", None)
            ]
        );
        crate::support::assert_one_answer_logged(&c, id).await;
    }
    let calls = fake.requests_for(Api::OpenAi);
    let models: Vec<String> = calls
        .iter()
        .map(|r| r.body["model"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        (
            models.iter().filter(|m| *m == "cheap-model").count(),
            models.iter().filter(|m| *m == "strong-model").count()
        ),
        (2, 2),
        "one analyzer and one responder call per request: {models:?}"
    );
}
