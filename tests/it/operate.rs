//! `POST /api/query/{id}/cancel` and `/retry` with a reason, against a real
//! daemon: the same outcomes as `maasctl requests cancel|retry`, recorded in
//! `operator_actions` with the actor `http`.

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::api::{Api, accepted};
use crate::support::db::TestDb;
use crate::support::ops::{fast, insert_one, wait_status};

async fn post(api: &Api, path: &str, body: Value) -> (StatusCode, Value) {
    let resp = api
        .authed(api.http.post(api.url(path)).json(&body))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_retry_over_http_need_a_reason_and_say_why_they_refuse() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(
        &db,
        fast()
            .env("MAAS_LLM__OFFLINE__FAIL_WHEN_QUERY_CONTAINS", "boom")
            .env("MAAS_MAX_ATTEMPTS", 1)
            .env("MAAS_LLM__OFFLINE__LATENCY_MS", 60_000),
    )
    .await;

    // A running request (60 s per model call): cancelled, with its reason.
    let slow = insert_one(&c, "a slow one").await;
    let path = format!("/api/query/{slow}/cancel");
    let (status, body) = post(&api, &path, json!({})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("missing_field")),
        "{body}"
    );
    let (status, body) = post(&api, &path, json!({ "reason": "user left" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "CANCELLED");
    wait_status(&c, slow, "CANCELLED").await;
    let (status, body) = post(&api, &path, json!({ "reason": "again" })).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.to_string().contains("already CANCELLED"), "{body}");
    let row = c
        .query_one(
            "SELECT actor, reason FROM operator_actions WHERE run_id = $1 AND action = 'cancel'",
            &[&slow],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, String>("actor"), row.get::<_, Option<String>>("reason")),
        ("http".into(), Some("user left".into()))
    );

    // Retry: refused for a request that is not FAILED, done for one that is.
    let (status, body) = post(&api, &format!("/api/query/{slow}/retry"), json!({ "reason": "x" })).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.to_string().contains("only FAILED"), "{body}");
    let failed: Uuid = c
        .query_one(
            "INSERT INTO pipeline_runs (user_id, user_query, status, attempt) VALUES (gen_random_uuid(), 'boom', 'FAILED', 1) RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let (status, body) = post(
        &api,
        &format!("/api/query/{failed}/retry"),
        json!({ "reason": "provider back" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "NEW", "{body}");
    let (status, _) = post(
        &api,
        &format!("/api/query/{}/retry", Uuid::new_v4()),
        json!({ "reason": "x" }),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = post(&api, "/api/query/not-a-uuid/cancel", json!({ "reason": "x" })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// Without api_tokens (loopback only), a request whose Host or Origin is not
/// the loopback — what a web page in a local browser sends, DNS rebinding
/// included — is refused, naming the header; local programs pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_only_loopback_hosts_and_origins_are_served() {
    let db = TestDb::new().await;
    let api = Api::start(&db, fast()).await;
    let id = Uuid::new_v4();
    let status_url = api.url(&format!("/api/query/{id}/status"));
    let plain = api.http.get(&status_url).send().await.unwrap();
    assert_eq!(plain.status(), StatusCode::NOT_FOUND, "a local client gets the answer");
    let by_name = api
        .http
        .get(&status_url)
        .header("host", format!("localhost:{}", api.addr.port()))
        .header("origin", "http://localhost:5173")
        .send()
        .await
        .unwrap();
    assert_eq!(by_name.status(), StatusCode::NOT_FOUND);

    let rebound = api
        .http
        .get(&status_url)
        .header("host", "rebind.example:8080")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), StatusCode::FORBIDDEN);
    let body: Value = rebound.json().await.unwrap();
    assert_eq!(body["code"], "forbidden_host", "{body}");
    assert!(body["error"].as_str().unwrap().contains("rebind.example"), "{body}");

    let page = api
        .http
        .post(api.url("/api/query"))
        .header("origin", "https://evil.example")
        .json(&json!({ "user_id": Uuid::new_v4(), "query": "from a web page" }))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::FORBIDDEN);
    let body: Value = page.json().await.unwrap();
    assert_eq!(body["code"], "forbidden_origin", "{body}");
    let c = db.client().await;
    assert_eq!(crate::support::count(&c, "SELECT count(*) FROM pipeline_runs").await, 0);
    // Every door has the guard: health and metrics too.
    let ready = api
        .http
        .get(api.url("/readyz"))
        .header("host", "rebind.example")
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::FORBIDDEN);
}

/// `POST /api/query` takes `callback_url` and `debug`: stored on the
/// request, the debug request rests after analyze until continued, and a bad
/// value is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_takes_callback_url_and_debug() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, fast()).await;
    let user = Uuid::new_v4();
    let resp = api
        .submit(&json!({
            "user_id": user, "query": "step by step", "debug": true,
            "callback_url": "https://hooks.example/maas?k=1"
        }))
        .await;
    let id = accepted(resp).await;
    wait_status(&c, id, "ANALYZED").await;
    let row = c
        .query_one(
            "SELECT callback_url, debug, held FROM pipeline_runs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, Option<String>>("callback_url").as_deref(),
        Some("https://hooks.example/maas?k=1")
    );
    assert!(row.get::<_, bool>("debug"));
    let (status, _) = post(&api, &format!("/api/query/{id}/continue"), json!({})).await;
    assert_eq!(status, StatusCode::OK);
    wait_status(&c, id, "READY").await;

    for (body, field) in [
        (
            json!({ "user_id": user, "query": "q", "callback_url": "ftp://x.example/" }),
            "callback_url",
        ),
        (
            json!({ "user_id": user, "query": "q", "callback_url": "not a url" }),
            "callback_url",
        ),
        (
            json!({ "user_id": user, "query": "q", "callback_url": 5 }),
            "callback_url",
        ),
        (json!({ "user_id": user, "query": "q", "debug": "yes" }), "debug"),
    ] {
        let resp = api.submit(&body).await;
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let err: Value = resp.json().await.unwrap();
        assert!(err["error"].as_str().unwrap().starts_with(field), "{err}");
    }
    // A plain submit is neither debug nor called back.
    let resp = api.submit(&json!({ "user_id": user, "query": "plain" })).await;
    let id = accepted(resp).await;
    wait_status(&c, id, "COMPLETED").await;
}
