//! The query's embedding is made once, during the analyze stage: an
//! assemble stage claimed on its own (not fused with the analyzer) reads
//! it from the stored analysis instead of embedding the query again.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::daemon::Opts;
use crate::support::db::TestDb;
use crate::support::fake_llm::{FakeConfig, FakeLlm};
use crate::support::poll::{count, poll_until};

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
    let api = Api::start(
        &db,
        Opts::default()
            .env("MAAS_ARCHIVIST__ENABLED", "false")
            .env("MAAS_LLM_PROVIDER", "openai")
            .env("MAAS_LLM__EMBEDDING__PROVIDER", "openai")
            .env("MAAS_LLM__OPENAI__BASE_URL", fake.openai_base_url())
            .env("OPENAI_API_KEY", "embed-test-key"),
    )
    .await;
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
    assert_eq!(asked, 1, "the query is embedded once, by the analyze stage");
}
