//! The query's embedding is made once, during the analyze stage: an
//! assemble stage claimed on its own (not fused with the analyzer) reads
//! it from the stored analysis instead of embedding the query again.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::cli::{NO_ENV, maasctl_async};
use crate::support::daemon::Opts;
use crate::support::db::TestDb;
use crate::support::fake_llm::{FakeConfig, FakeLlm};
use crate::support::poll::{count, poll_until};
use crate::support::{assert_completed, wait_all_terminal};

const QUERY: &str = "When is my pottery class?";

/// An analysis that asks for context and names a record the analyzer was
/// not given, so the assemble stage cannot be fused with it.
fn analysis_naming_another_record() -> String {
    json!({
        "needs_context": true,
        "context_type": "topic",
        "time_scope": "none",
        "search_keywords": ["pottery"],
        "context_found": {"lsm_record_id": 987_654_321},
    })
    .to_string()
}

/// A daemon whose models and embeddings all come from `fake` (OpenAI's
/// API), without the archivist.
fn on_fake_openai(fake: &FakeLlm) -> Opts {
    Opts::default()
        .env("MAAS_ARCHIVIST__ENABLED", "false")
        .env("MAAS_LLM_PROVIDER", "openai")
        .env("MAAS_LLM__EMBEDDING__PROVIDER", "openai")
        .env("MAAS_LLM__OPENAI__BASE_URL", fake.openai_base_url())
        .env("OPENAI_API_KEY", "embed-test-key")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assemble_stage_claimed_alone_searches_with_the_analyze_stages_embedding() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let fake = FakeLlm::start_with(FakeConfig {
        default_text: analysis_naming_another_record(),
        ..FakeConfig::default()
    })
    .await;
    let user = Uuid::new_v4();
    c.execute(
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content) VALUES ($1, $2, 'user_query', $3)",
        &[&user, &Uuid::new_v4(), &"Bea: the pottery class moved to Tuesday"],
    )
    .await
    .unwrap();
    let api = Api::start(&db, on_fake_openai(&fake)).await;
    let embedded = format!("SELECT count(*) FROM turn_embeddings WHERE user_id = '{user}'");
    let done = poll_until(Duration::from_secs(60), Duration::from_millis(100), || async {
        count(&c, &embedded).await == 1
    })
    .await;
    assert!(done, "the turn was not embedded");

    let resp = api.submit(&json!({ "user_id": user, "query": QUERY })).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let body: Value = resp.json().await.unwrap();
    let id: Uuid = body["request_id"].as_str().unwrap().parse().unwrap();
    let state: Value = api
        .get(&format!("/api/query/{id}/status?wait=60s&include=context"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(state["status"], "completed", "{state}");
    let context = state["context"].as_str().unwrap_or_default();
    assert!(context.contains("pottery class moved to Tuesday"), "{context}");

    let analysis: Value = c
        .query_one("SELECT analysis_result FROM pipeline_runs WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        analysis["query_embedding"]["model"], "text-embedding-3-small",
        "{analysis}"
    );
    assert!(
        analysis["query_embedding"]["vector"]
            .as_array()
            .is_some_and(|v| !v.is_empty())
    );
    let steps = format!("SELECT count(*) FROM pipeline_steps WHERE run_id = '{id}' AND stage = 'assemble'");
    assert_eq!(count(&c, &steps).await, 1);
    let asked = fake
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/embeddings" && r.body["input"] == json!([QUERY]))
        .count();
    // Once per attempt of the analyze stage (a loaded machine may retry
    // one), never by the assemble stage.
    let analyzed = format!("SELECT count(*) FROM pipeline_steps WHERE run_id = '{id}' AND stage = 'analyze'");
    let attempts = count(&c, &analyzed).await;
    assert!(attempts >= 1, "no analyze attempt was recorded");
    assert_eq!(
        i64::try_from(asked).unwrap(),
        attempts,
        "the query is embedded once per analyze attempt, never by the assemble stage"
    );
}

/// A user without an earlier turn has nothing for the semantic part to
/// compare a query with: the analyze stage does not embed the query (it
/// would cost a model call per newcomer's request and find nothing). The
/// query's own turn is still embedded, once, by the embedder; that call is
/// waited for while the daemons are paused, so the count after the
/// request is the search's calls alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomers_query_is_not_embedded_for_the_search() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let query = "Which film should I watch tonight?";
    let fake = FakeLlm::start_with(FakeConfig {
        default_text: json!({
            "needs_context": false,
            "context_type": "none",
            "time_scope": "none",
            "search_keywords": [],
            "context_found": null,
        })
        .to_string(),
        ..FakeConfig::default()
    })
    .await;
    let _api = Api::start(&db, on_fake_openai(&fake)).await;
    let embedded_alone = || {
        fake.requests()
            .iter()
            .filter(|r| r.path == "/v1/embeddings" && r.body["input"] == json!([query]))
            .count()
    };
    let (code, _, err) = maasctl_async(&db.url, &["pause", "--reason", "embed the turn first"], NO_ENV).await;
    assert_eq!(code, 0, "{err}");
    let user = Uuid::new_v4();
    c.execute(
        "INSERT INTO pipeline_runs (user_id, user_query) VALUES ($1, $2)",
        &[&user, &query],
    )
    .await
    .unwrap();
    let turn_embedded = format!("SELECT count(*) FROM turn_embeddings WHERE user_id = '{user}'");
    let done = poll_until(Duration::from_secs(60), Duration::from_millis(100), || async {
        count(&c, &turn_embedded).await == 1
    })
    .await;
    assert!(done, "the query's turn was not embedded");
    assert_eq!(embedded_alone(), 1, "the turn's own embedding");

    let (code, _, err) = maasctl_async(&db.url, &["resume"], NO_ENV).await;
    assert_eq!(code, 0, "{err}");
    wait_all_terminal(&c, Duration::from_secs(60)).await;
    assert_completed(&c, 1).await;
    let analyzed = fake
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .count();
    assert!(analyzed >= 1, "the analyzer was not called");
    assert_eq!(embedded_alone(), 1, "the query was embedded for a search over no turns");
}
