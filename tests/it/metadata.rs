//! `metadata` on a request: given at submit over HTTP, stored in the
//! request's row, returned by the status API and shown by `maasctl requests
//! show`; anything but a bounded JSON object is a 400 naming the field.

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::cli::{NO_ENV, maasctl_async};
use crate::support::daemon::Opts;
use crate::support::db::{TestDb, value};

/// Submits `body`; the request id of a 202.
async fn accepted(api: &Api, body: &Value) -> Uuid {
    api.submit_accepted(body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_is_stored_returned_and_shown() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let meta = json!({ "order": 1234, "source": "checkout", "tags": ["a", "b"], "nested": { "x": null } });

    let id = accepted(
        &api,
        &json!({ "user_id": user, "query": "where is my parcel?", "metadata": meta }),
    )
    .await;
    let stored: Option<Value> = value(&c, "SELECT metadata FROM pipeline_runs WHERE id = $1", &[&id]).await;
    assert_eq!(stored.as_ref(), Some(&meta));

    let resp = api.get(&format!("/api/query/{id}/status?wait=30s")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let state: Value = resp.json().await.unwrap();
    assert_eq!(state["status"], "completed", "{state}");
    assert_eq!(state["metadata"], meta, "{state}");

    // Without metadata (and with null): no `metadata` in the answer, NULL in the row.
    let plain = accepted(&api, &json!({ "user_id": user, "query": "q", "metadata": null })).await;
    let state: Value = api
        .get(&format!("/api/query/{plain}/status"))
        .await
        .json()
        .await
        .unwrap();
    assert!(state.get("metadata").is_none(), "{state}");
    let stored: Option<Value> = value(&c, "SELECT metadata FROM pipeline_runs WHERE id = $1", &[&plain]).await;
    assert_eq!(stored, None);

    metadata_is_part_of_an_idempotent_request(&api, &c, user).await;

    // maasctl requests show prints it; --json carries it.
    let (code, out, err) = maasctl_async(&db.url, &["requests", "show", &id.to_string()], NO_ENV).await;
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("metadata"))
        .unwrap_or_else(|| panic!("{out}"));
    let shown: Value = serde_json::from_str(line.trim_start_matches("metadata").trim()).unwrap();
    assert_eq!(shown, meta);
    let (code, out, err) = maasctl_async(&db.url, &["requests", "show", &id.to_string(), "--json"], NO_ENV).await;
    assert_eq!(code, 0, "{err}");
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["request"]["metadata"], meta);

    // A row inserted by SQL is held to the same shape by the table.
    let refused = c
        .execute(
            "INSERT INTO pipeline_runs (user_id, user_query, metadata) VALUES ($1, 'q', '[1]'::jsonb)",
            &[&user],
        )
        .await
        .unwrap_err();
    assert_eq!(
        refused.as_db_error().and_then(|e| e.constraint()),
        Some("pipeline_runs_metadata_object")
    );
}

/// With an idempotency key: stored, and a replay with other metadata is
/// another request (422, the key already names a different one).
async fn metadata_is_part_of_an_idempotent_request(api: &Api, c: &tokio_postgres::Client, user: Uuid) {
    let keyed = |m: Value| {
        api.authed(api.http.post(api.url("/api/query")).header("idempotency-key", "k-1"))
            .json(&json!({ "user_id": user, "query": "keyed", "metadata": m }))
            .send()
    };
    let first = keyed(json!({ "n": 1 })).await.unwrap();
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let first_id: String = first.json::<Value>().await.unwrap()["request_id"]
        .as_str()
        .unwrap()
        .into();
    let stored: Option<Value> = value(
        c,
        "SELECT metadata FROM pipeline_runs WHERE id = $1::text::uuid",
        &[&first_id],
    )
    .await;
    assert_eq!(stored, Some(json!({ "n": 1 })));
    assert_eq!(keyed(json!({ "n": 1 })).await.unwrap().status(), StatusCode::ACCEPTED);
    assert_eq!(
        keyed(json!({ "n": 2 })).await.unwrap().status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_metadata_is_a_400_naming_the_field() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let mut deep = json!({});
    for _ in 0..9 {
        deep = json!({ "d": deep });
    }
    for (bad, says) in [
        (json!([1, 2]), "must be a JSON object"),
        (json!("text"), "must be a JSON object"),
        (json!(42), "must be a JSON object"),
        (json!({ "big": "x".repeat(5000) }), "bytes as JSON"),
        (deep, "levels deep"),
        (json!({ "nul": "a\u{0}b" }), "NUL"),
    ] {
        let resp = api
            .submit(&json!({ "user_id": user, "query": "q", "metadata": bad }))
            .await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["code"], "invalid_metadata", "{body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.starts_with("metadata ") && error.contains(says), "{error}");
    }
    let n: i64 = value(&c, "SELECT count(*) FROM pipeline_runs", &[]).await;
    assert_eq!(n, 0, "a refused submission stored nothing");
}
