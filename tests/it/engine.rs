//! The engine in-process against real PostgreSQL, with a test pipeline:
//! a request goes NEW → COMPLETED, and a failing stage follows the
//! attempt policy (retries to the limit, permanent failures at once).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use maas::config::{Config, Secret};
use maas::dispatcher::Engine;
use maas::error::Disposition;
use maas::listener::Notifier;
use maas::metrics::Stats;
use maas::model::StageKind;
use maas::stage::{Pipeline, StageError, StageInput, StageOutput, StageSuccess, Usage};
use tokio_util::sync::CancellationToken;

use crate::support::db::{TestDb, by_name, rows, value};
use crate::support::{GENEROUS, count, insert_requests, wait_all_terminal};

/// What the respond stage does in a test.
#[derive(Clone, Copy)]
enum Respond {
    Answer,
    Fail(Disposition),
}

/// Analyze and assemble always succeed; respond as told. Counts its calls.
struct TestPipeline {
    respond: Respond,
    calls: [AtomicU32; 3],
}

impl TestPipeline {
    fn new(respond: Respond) -> Arc<TestPipeline> {
        Arc::new(TestPipeline {
            respond,
            calls: Default::default(),
        })
    }

    fn calls(&self, stage: StageKind) -> u32 {
        self.calls[stage.index()].load(Ordering::Relaxed)
    }
}

impl Pipeline for TestPipeline {
    fn run<'a>(&'a self, stage: StageKind, input: &'a StageInput) -> BoxFuture<'a, Result<StageSuccess, StageError>> {
        self.calls[stage.index()].fetch_add(1, Ordering::Relaxed);
        let output = match (stage, self.respond) {
            (StageKind::Analyze, _) => Ok(StageOutput::Analysis(serde_json::json!({ "intent": "test" }))),
            (StageKind::Assemble, _) => Ok(StageOutput::Context(format!("context of {}", input.user_query))),
            (StageKind::Respond, Respond::Answer) => Ok(StageOutput::Answer(format!("answer to {}", input.user_query))),
            (StageKind::Respond, Respond::Fail(disposition)) => Err(StageError {
                class: "test_failure".into(),
                message: "the test pipeline fails here".into(),
                disposition,
                usage: Usage::default(),
            }),
        };
        async move {
            output.map(|output| StageSuccess {
                output,
                usage: Usage::default(),
                context_sources: None,
            })
        }
        .boxed()
    }
}

/// Runs an engine on `db` until the returned token fires.
fn start_engine(
    db: &TestDb,
    pipeline: Arc<TestPipeline>,
    max_attempts: u32,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let cfg = Arc::new(Config {
        database_url: Secret(db.url.clone()),
        max_attempts,
        retry_base_ms: 10,
        retry_max_secs: 1,
        sweep_secs: 1,
        ..Config::default()
    });
    let pool = maas::db::connect_pool(&cfg, "maas-engine-test").unwrap();
    let notifier = Notifier::new(Arc::new(Stats::default()));
    let engine = Engine::new(pool, cfg, pipeline, "engine-test".into(), notifier, None);
    let shutdown = CancellationToken::new();
    let sweep: Arc<dyn maas::service::Service> = Arc::new(maas::dispatcher::Sweep::new(engine.clone()));
    let services = maas::service::start(vec![sweep], &shutdown);
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        engine.run(stop).await;
        services.wait().await;
    });
    (shutdown, task)
}

async fn stop(engine: (CancellationToken, tokio::task::JoinHandle<()>)) {
    engine.0.cancel();
    tokio::time::timeout(GENEROUS, engine.1).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_goes_from_new_to_completed() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let pipeline = TestPipeline::new(Respond::Answer);
    let engine = start_engine(&db, pipeline.clone(), 3);
    let ids = insert_requests(&c, 5, "in process").await;
    wait_all_terminal(&c, GENEROUS).await;
    stop(engine).await;
    for id in ids {
        let row = c
            .query_one(
                "SELECT status, final_answer, final_context_payload, lease_owner FROM pipeline_runs WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>("status"), "COMPLETED");
        let answer: String = row.get("final_answer");
        assert!(answer.starts_with("answer to in process #"), "{answer}");
        assert!(
            row.get::<_, String>("final_context_payload")
                .starts_with("context of in process #")
        );
        assert_eq!(row.get::<_, Option<String>>("lease_owner"), None, "lease released");
    }
    // One success per stage per request; nothing ran twice.
    assert_eq!(
        count(&c, "SELECT count(*) FROM pipeline_steps WHERE outcome = 'succeeded'").await,
        15
    );
    assert_eq!(count(&c, "SELECT count(*) FROM pipeline_steps").await, 15);
    for stage in StageKind::ALL {
        assert_eq!(pipeline.calls(stage), 5, "{stage}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retryable_failure_retries_up_to_max_attempts_then_fails() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let pipeline = TestPipeline::new(Respond::Fail(Disposition::Retry {
        after: None,
        max_attempts: None,
    }));
    let engine = start_engine(&db, pipeline.clone(), 3);
    let ids = insert_requests(&c, 2, "always times out").await;
    wait_all_terminal(&c, GENEROUS).await;
    stop(engine).await;
    for id in &ids {
        let row = c
            .query_one("SELECT status, error FROM pipeline_runs WHERE id = $1", &[id])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>("status"), "FAILED");
        let error: String = row.get("error");
        assert!(error.contains("respond failed after 3 attempts"), "{error}");
        let outcomes: Vec<(i32, String)> = rows(
            &c,
            "SELECT attempt, outcome FROM pipeline_steps WHERE run_id = $1 AND stage = 'respond' ORDER BY id",
            &[id],
            |r| by_name!(r, "attempt", "outcome"),
        )
        .await;
        assert_eq!(
            outcomes,
            [(1, "retrying".into()), (2, "retrying".into()), (3, "failed".into())]
        );
    }
    assert_eq!(pipeline.calls(StageKind::Respond), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_fails_at_once_and_invalid_output_retries_once() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let pipeline = TestPipeline::new(Respond::Fail(Disposition::Fail));
    let engine = start_engine(&db, pipeline.clone(), 3);
    insert_requests(&c, 2, "refused").await;
    wait_all_terminal(&c, GENEROUS).await;
    stop(engine).await;
    assert_eq!(
        count(&c, "SELECT count(*) FROM pipeline_runs WHERE status = 'FAILED'").await,
        2
    );
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM pipeline_steps WHERE stage = 'respond' AND outcome = 'failed' AND attempt = 1"
        )
        .await,
        2
    );
    assert_eq!(pipeline.calls(StageKind::Respond), 2);

    // A failure with its own lower limit (the analyzer's invalid JSON: one
    // retry) stops at that limit even with more attempts configured.
    let db = TestDb::new().await;
    let c = db.client().await;
    let pipeline = TestPipeline::new(Respond::Fail(Disposition::Retry {
        after: None,
        max_attempts: Some(2),
    }));
    let engine = start_engine(&db, pipeline.clone(), 5);
    let ids = insert_requests(&c, 1, "one retry").await;
    wait_all_terminal(&c, GENEROUS).await;
    stop(engine).await;
    let error: String = value(&c, "SELECT error FROM pipeline_runs WHERE id = $1", &[&ids[0]]).await;
    assert!(error.contains("respond failed after 2 attempts"), "{error}");
    assert_eq!(pipeline.calls(StageKind::Respond), 2);
}
