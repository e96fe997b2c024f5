//! A newcomer's memory: the second conversation finds the first before
//! any archive run, over HTTP and over SQL inserts, with the offline
//! analyzer and with a provider's analysis. And a newcomer's first start:
//! its log says what runs and where, with nothing that reads as a problem.

use std::time::Duration;

use serde_json::{Value, json};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{TestDb, value};
use crate::support::fake_llm::{Api as Provider, FakeLlm, Reply};
use crate::support::wait_until;

const TOLD: &str = "My sister Olga moves to Lisbon in March; remember that.";
const ASKED: &str = "Where is my sister moving?";
const WAIT: Duration = Duration::from_secs(60);

/// The archivist is off: what is found comes from the turns themselves.
fn no_archivist() -> Opts {
    Opts::default().env("MAAS_ARCHIVIST__ENABLED", "false")
}

/// Submits over HTTP and waits for the end; returns the request's status
/// with its context.
async fn ask_http(api: &Api, user: Uuid, query: &str) -> Value {
    let id = api.ask(user, Some(Uuid::new_v4()), query).await;
    api.status_with(id, "include=context").await
}

/// Inserts a request in a new thread and waits for it; returns its id.
async fn ask_sql(c: &Client, user: Uuid, query: &str) -> Uuid {
    let id: Uuid = value(
        c,
        "INSERT INTO pipeline_runs (user_id, thread_id, user_query) VALUES ($1, gen_random_uuid(), $2) RETURNING id",
        &[&user, &query],
    )
    .await;
    wait_until(WAIT, "the request is terminal", || async {
        let st: String = value(c, "SELECT status FROM pipeline_runs WHERE id = $1", &[&id]).await;
        matches!(st.as_str(), "COMPLETED" | "FAILED" | "CANCELLED")
    })
    .await;
    let st: String = value(c, "SELECT status FROM pipeline_runs WHERE id = $1", &[&id]).await;
    assert_eq!(st, "COMPLETED");
    id
}

async fn context_of(c: &Client, id: Uuid) -> String {
    value(
        c,
        "SELECT final_context_payload FROM pipeline_runs WHERE id = $1",
        &[&id],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomers_second_conversation_finds_the_first_over_http() {
    let db = TestDb::new().await;
    let api = Api::start(&db, no_archivist()).await;
    let user = Uuid::new_v4();
    ask_http(&api, user, TOLD).await;
    let state = ask_http(&api, user, ASKED).await;
    let context = state["context"].as_str().unwrap_or_default();
    assert!(context.contains(TOLD), "{context}");
    let sources = state["context_sources"].as_array().cloned().unwrap_or_default();
    assert!(sources.iter().any(|s| s["kind"] == "turn"), "{sources:?}");
    let records: i64 = value(
        &db.client().await,
        "SELECT count(*) FROM lsm_storage WHERE user_id = $1",
        &[&user],
    )
    .await;
    assert_eq!(records, 0, "no archive run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomers_second_conversation_finds_the_first_over_sql() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = Maasd::spawn(&db.url, no_archivist());
    let user = Uuid::new_v4();
    let first = ask_sql(&c, user, TOLD).await;
    let analysis: Value = value(&c, "SELECT analysis_result FROM pipeline_runs WHERE id = $1", &[&first]).await;
    assert_eq!(analysis["needs_context"], false, "nothing earlier: {analysis}");
    let second = ask_sql(&c, user, ASKED).await;
    let analysis: Value = value(
        &c,
        "SELECT analysis_result FROM pipeline_runs WHERE id = $1",
        &[&second],
    )
    .await;
    assert_eq!(analysis["needs_context"], true, "{analysis}");
    let context = context_of(&c, second).await;
    assert!(context.contains(TOLD), "{context}");
    // A self-contained question of the same user does not search.
    let plain = ask_sql(&c, user, "What is the capital of france?").await;
    let analysis: Value = value(&c, "SELECT analysis_result FROM pipeline_runs WHERE id = $1", &[&plain]).await;
    assert_eq!(analysis["needs_context"], false, "{analysis}");
}

/// With a provider, the analyzer is told the user's earlier turns and its
/// plan (context needed, no record) is followed: the turns are searched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_analysis_of_a_newcomer_is_followed() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let fake = FakeLlm::start().await;
    let opts = no_archivist()
        .env("MAAS_LLM_PROVIDER", Provider::OpenAi.provider())
        .env("OPENAI_BASE_URL", fake.openai_base_url())
        .env("OPENAI_API_KEY", "sk-test-newcomer")
        .env("MAAS_LLM__EMBEDDING__PROVIDER", "off");
    let _d = Maasd::spawn(&db.url, opts);
    let analysis = |needs: bool| {
        json!({"needs_context": needs, "context_type": if needs { "topic" } else { "none" },
               "time_scope": "none", "search_keywords": ["sister", "Lisbon"], "context_found": null})
        .to_string()
    };
    let user = Uuid::new_v4();
    fake.push(Provider::OpenAi, Reply::text(analysis(false)));
    fake.push(Provider::OpenAi, Reply::text("Noted."));
    ask_sql(&c, user, TOLD).await;
    fake.push(Provider::OpenAi, Reply::text(analysis(true)));
    fake.push(Provider::OpenAi, Reply::text("To Lisbon."));
    let second = ask_sql(&c, user, ASKED).await;

    let got = fake.requests_for(Provider::OpenAi);
    assert_eq!(got.len(), 4);
    let analyzer = got[2].body.to_string();
    assert!(analyzer.contains("earlier_turns"), "the prompt explains it: {analyzer}");
    assert!(
        analyzer.contains(r#"\"earlier_turns\":2"#),
        "two turns before: {analyzer}"
    );
    let first_analyzer = got[0].body.to_string();
    assert!(first_analyzer.contains(r#"\"earlier_turns\":0"#), "{first_analyzer}");
    assert!(context_of(&c, second).await.contains(TOLD));
    assert!(
        got[3].body.to_string().contains("Olga moves to Lisbon"),
        "the responder sees it"
    );
}

/// A newcomer who crosses the novelty threshold is archived within the
/// poll, not at the schedule's next tick (every 6 hours by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomers_first_archive_run_does_not_wait_for_the_schedule() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let opts = Opts::default()
        .env("MAAS_ARCHIVIST__MIN_PENDING", "2")
        .env("MAAS_ARCHIVIST__FIRST_RUN_POLL_SECS", "1");
    let _d = Maasd::spawn(&db.url, opts);
    let user = Uuid::new_v4();
    ask_sql(&c, user, TOLD).await;
    wait_until(WAIT, "the newcomer's first record", || async {
        let n: i64 = value(&c, "SELECT count(*) FROM lsm_storage WHERE user_id = $1", &[&user]).await;
        n > 0
    })
    .await;
    let runs: i64 = value(&c, "SELECT count(*) FROM archive_runs", &[]).await;
    assert!(runs >= 1);
}

/// A first start as `bin/run` makes it: a fresh database, the daemon's own
/// log filter (no `RUST_LOG`). Its first lines say what runs and where —
/// the database without its password, the HTTP address and the console,
/// the provider, the memory search — and nothing a newcomer would read as a
/// problem follows: no server NOTICE from the migrations ("… does not
/// exist, skipping") and no cron scheduler chatter ("Uninited", "Job
/// creator created").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_says_what_runs_and_where_and_no_notice_or_scheduler_chatter() {
    let db = TestDb::empty().await;
    // postgres://USER[:PASSWORD]@HOST:PORT/DB; the test cluster trusts
    // local connections, so a password given is sent and never checked.
    let (scheme, rest) = db.url.split_once("://").unwrap();
    let (userinfo, place) = rest.split_once('@').unwrap();
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, "first-start-secret"));
    let url = format!("{scheme}://{user}:{password}@{place}");
    let host_port = place.split(['/', '?']).next().unwrap();
    let opts = Opts::default()
        .default_log()
        .env("MAAS_LLM_PROVIDER", "offline")
        .env("MAAS_LLM__EMBEDDING__PROVIDER", "off");
    let mut d = Maasd::spawn(&url, opts);
    let addr = d.http_addr(WAIT).await;
    // The archivist's schedule starts after "maasd ready"; its scheduler
    // says its chatter before the schedule's own line.
    wait_until(WAIT, "the archivist's schedule and the listener started", || async {
        let log = d.plain_log();
        log.contains("archivist scheduled") && log.contains("listener: listening")
    })
    .await;
    let log = d.plain_log();
    let lines: Vec<&str> = log.lines().collect();
    let first = [
        format!(
            "maasd {} starting: database {user}@{host_port}/{}",
            env!("CARGO_PKG_VERSION"),
            db.name
        ),
        format!("HTTP API on http://{addr}, console http://{addr}/console"),
        "LLM provider: offline for every role".to_owned(),
        "memory search: full text alone".to_owned(),
    ];
    for (i, want) in first.iter().enumerate() {
        assert!(
            lines
                .get(i)
                .is_some_and(|l| l.contains(" INFO ") && l.ends_with(want.as_str())),
            "line {} should say {want:?}:\n{log}",
            i + 1
        );
    }
    assert!(!log.contains(password), "the password is in the log:\n{log}");
    assert!(log.contains("schema updated to version"), "{log}");
    for chatter in ["NOTICE", "does not exist, skipping", "Uninited", "Job creator created"] {
        assert!(!log.contains(chatter), "{chatter:?} at the default log level:\n{log}");
    }
}
