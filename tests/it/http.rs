//! The HTTP API of a real `maasd` process against a real database, with a
//! real HTTP client (reqwest), WebSocket client (tokio-tungstenite) and a
//! hand-read SSE stream.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{TestDb, value};
use crate::support::metrics::metric;
use crate::support::sse::Sse;
use crate::support::{GENEROUS, count, insert_held, new_users, release, wait_until};

impl Api {
    async fn submit_ok(&self, user: Uuid, query: &str) -> Uuid {
        self.submit_accepted(&json!({ "user_id": user, "query": query })).await
    }

    async fn status(&self, id: Uuid, wait: &str) -> (StatusCode, Value) {
        let resp = self.get(&format!("/api/query/{id}/status?wait={wait}")).await;
        let code = resp.status();
        (code, resp.json().await.unwrap())
    }

    async fn ws(&self, query: &str) -> Result<Ws, tungstenite::Error> {
        let mut req = format!("ws://{}/api/ws?{query}", self.addr)
            .into_client_request()
            .unwrap();
        if let Some(t) = &self.token {
            req.headers_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        let (ws, _) = tokio_tungstenite::connect_async(req).await?;
        Ok(ws)
    }
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next JSON text message, or the close code when the socket closes.
async fn ws_next(ws: &mut Ws) -> Result<Value, Option<u16>> {
    let deadline = tokio::time::Instant::now() + GENEROUS;
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .expect("a WebSocket message within the deadline");
        match msg {
            Some(Ok(Message::Text(t))) => return Ok(serde_json::from_str(t.as_str()).unwrap()),
            Some(Ok(Message::Close(frame))) => return Err(frame.map(|f| u16::from(f.code))),
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return Err(None),
        }
    }
}

/// Asserts that `resp` is an error answer with `status` and the JSON `code`.
async fn assert_error(resp: reqwest::Response, status: StatusCode, code: &str) {
    assert_eq!(resp.status(), status);
    assert_eq!(resp.json::<Value>().await.unwrap()["code"], code);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_submit_then_poll_to_completed() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default()).await;
    assert_eq!(
        api.get("/healthz").await.json::<Value>().await.unwrap()["status"],
        "alive"
    );
    let ready: Value = api.get("/readyz").await.json().await.unwrap();
    assert_eq!(ready["status"], "ready", "{ready}");

    let (user, thread) = (Uuid::new_v4(), Uuid::new_v4());
    let resp = api
        .submit(&json!({ "user_id": user, "thread_id": thread, "query": "what did we decide?" }))
        .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let location = resp.headers()["location"].to_str().unwrap().to_owned();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "processing");
    let id: Uuid = body["request_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(location, format!("/api/query/{id}/status"));
    let row = c
        .query_one(
            "SELECT user_id, thread_id, user_query FROM pipeline_runs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, Uuid>("user_id"),
            row.get::<_, Option<Uuid>>("thread_id"),
            row.get::<_, String>("user_query")
        ),
        (user, Some(thread), "what did we decide?".to_owned())
    );

    let (code, state) = api.status(id, "30s").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(state["status"], "completed", "{state}");
    assert_eq!(state["stage"], "COMPLETED");
    assert_eq!(state["request_id"], id.to_string());
    assert!(state["answer"].as_str().unwrap().starts_with("[offline]"), "{state}");
    assert!(state.get("error").is_none());
    // Without a wait: the same, at once.
    let again: Value = api.get(&format!("/api/query/{id}/status")).await.json().await.unwrap();
    assert_eq!(again, state);

    finished_requests_show_their_outcome(&api, &c, user).await;
    assert_error(
        api.get(&format!("/api/query/{}/status", Uuid::new_v4())).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    assert_error(
        api.get("/api/query/not-a-uuid/status").await,
        StatusCode::BAD_REQUEST,
        "invalid_id",
    )
    .await;
}

/// A failed request shows its error; a cancelled one shows as failed.
async fn finished_requests_show_their_outcome(api: &Api, c: &tokio_postgres::Client, user: Uuid) {
    // (status, stage, error) of the status answer for a request of `user`
    // inserted already finished with `status` and `error`.
    let answer = |status: &'static str, error: Option<&'static str>, wait: &'static str| async move {
        let id: Uuid = value(
            c,
            "INSERT INTO pipeline_runs (user_id, user_query, status, error) VALUES ($1, 'x', $2, $3) RETURNING id",
            &[&user, &status, &error],
        )
        .await;
        let (_, state) = api.status(id, wait).await;
        let field = |k: &str| state[k].as_str().map(str::to_owned);
        (field("status"), field("stage"), field("error"))
    };
    let some = |s: &str| Some(s.to_owned());
    assert_eq!(
        answer("FAILED", Some("respond failed (timeout)"), "0s").await,
        (some("failed"), some("FAILED"), some("respond failed (timeout)"))
    );
    assert_eq!(
        answer("CANCELLED", None, "10s").await,
        (some("failed"), some("CANCELLED"), some("cancelled"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_bad_requests_get_clear_codes() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(
        &db,
        Opts::default()
            .env("MAAS_HTTP__MAX_BODY_BYTES", 200_000)
            .env("MAAS_HTTP__MAX_WAIT_SECS", 1),
    )
    .await;
    let user = Uuid::new_v4().to_string();
    bad_submissions_get_clear_codes(&api, &user).await;
    // With a charset the content type is still JSON.
    let ok = post_raw(
        &api,
        json!({"user_id": user, "query": "q"}).to_string(),
        Some("application/json; charset=utf-8"),
    )
    .await;
    assert_eq!(ok.0, StatusCode::ACCEPTED);
    let bad_key = api
        .http
        .post(api.url("/api/query"))
        .header("idempotency-key", "k".repeat(300))
        .json(&json!({"user_id": user, "query": "q"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad_key.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        count(&c, "SELECT count(*) FROM pipeline_runs").await,
        1,
        "only the good request was stored"
    );
    status_waits_are_checked_and_capped(&api, &c).await;
    assert_error(api.get("/api/nowhere").await, StatusCode::NOT_FOUND, "no_route").await;
}

/// POSTs `body` to /api/query with content type `ct`: (status, the
/// accepted request's status or the error's code).
async fn post_raw(api: &Api, body: String, ct: Option<&str>) -> (StatusCode, String) {
    let mut rb = api.http.post(api.url("/api/query")).body(body);
    if let Some(ct) = ct {
        rb = rb.header("content-type", ct);
    }
    let resp = rb.send().await.unwrap();
    let code = resp.status();
    let body: Value = resp.json().await.unwrap();
    if code.is_success() {
        return (code, body["status"].as_str().unwrap().to_owned());
    }
    assert!(body["error"].is_string(), "{body}");
    (code, body["code"].as_str().unwrap().to_owned())
}

/// Malformed JSON, ids, fields, sizes and content types: each its status
/// and code.
async fn bad_submissions_get_clear_codes(api: &Api, user: &str) {
    let json_ct = Some("application/json");
    let good = json!({"user_id": user, "query": "q"}).to_string();
    let cases: Vec<(String, Option<&str>, u16, &str)> = vec![
        (r#"{"user_id": "#.into(), json_ct, 400, "malformed_json"),
        ("[1, 2]".into(), json_ct, 400, "malformed_json"),
        (
            json!({"user_id": "nope", "query": "q"}).to_string(),
            json_ct,
            400,
            "invalid_id",
        ),
        (
            json!({"user_id": 42, "query": "q"}).to_string(),
            json_ct,
            400,
            "invalid_id",
        ),
        (
            json!({"user_id": user, "thread_id": "x", "query": "q"}).to_string(),
            json_ct,
            400,
            "invalid_id",
        ),
        (json!({"query": "q"}).to_string(), json_ct, 422, "missing_field"),
        (
            json!({"user_id": "", "query": "q"}).to_string(),
            json_ct,
            422,
            "empty_field",
        ),
        (json!({"user_id": user}).to_string(), json_ct, 422, "missing_field"),
        (
            json!({"user_id": user, "query": null}).to_string(),
            json_ct,
            422,
            "missing_field",
        ),
        (
            json!({"user_id": user, "query": ""}).to_string(),
            json_ct,
            422,
            "empty_field",
        ),
        (
            json!({"user_id": user, "query": "  \n "}).to_string(),
            json_ct,
            422,
            "empty_field",
        ),
        (
            json!({"user_id": user, "query": 5}).to_string(),
            json_ct,
            422,
            "invalid_field",
        ),
        (
            json!({"user_id": user, "query": "x".repeat(100_001)}).to_string(),
            json_ct,
            422,
            "field_too_long",
        ),
        (
            json!({"user_id": user, "query": "x".repeat(300_000)}).to_string(),
            json_ct,
            413,
            "body_too_large",
        ),
        (good.clone(), Some("text/plain"), 415, "unsupported_media_type"),
        (good, None, 415, "unsupported_media_type"),
    ];
    for (body, ct, want, code) in cases {
        let shown: String = body.chars().take(60).collect();
        assert_eq!(
            post_raw(api, body, ct).await,
            (StatusCode::from_u16(want).unwrap(), code.to_owned()),
            "{shown} ({ct:?})"
        );
    }
}

/// Status: a malformed wait is refused, and a wait past the cap (1 s here)
/// answers at the cap.
async fn status_waits_are_checked_and_capped(api: &Api, c: &tokio_postgres::Client) {
    let held = insert_held(c, &new_users(1)).await[0];
    assert_error(
        api.get(&format!("/api/query/{held}/status?wait=soon")).await,
        StatusCode::BAD_REQUEST,
        "invalid_wait",
    )
    .await;
    let started = Instant::now();
    let (code, state) = api.status(held, "30s").await;
    let took = started.elapsed();
    assert_eq!((code, state["status"].as_str()), (StatusCode::OK, Some("processing")));
    assert_eq!(state["stage"], "NEW");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(20),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_bearer_tokens_guard_every_api_route() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // With tokens, a public address is allowed.
    let mut api = Api::start(
        &db,
        Opts::default()
            .env("MAAS_API_TOKENS", "tok-a,tok-b")
            .env("MAAS_HTTP_ADDR", "0.0.0.0:0"),
    )
    .await;
    assert!(api.d.plain_log().contains("auth=true"));
    let held = insert_held(&c, &new_users(1)).await[0];
    let body = json!({"user_id": Uuid::new_v4(), "query": "q"});
    for token in [None, Some("wrong"), Some("tok-a,tok-b")] {
        api.token = token.map(str::to_owned);
        let resp = api.submit(&body).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
        for path in [
            format!("/api/query/{held}/status"),
            format!("/api/query/{held}/events"),
            format!("/api/ws?request_id={held}"),
        ] {
            assert_eq!(
                api.get(&path).await.status(),
                StatusCode::UNAUTHORIZED,
                "{path} {token:?}"
            );
        }
        match api.ws(&format!("request_id={held}")).await {
            Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 401),
            other => panic!("expected 401, got {:?}", other.map(|_| ())),
        }
    }
    for token in ["tok-a", "tok-b"] {
        api.token = Some(token.into());
        assert_eq!(api.submit(&body).await.status(), StatusCode::ACCEPTED);
        assert_eq!(
            api.get(&format!("/api/query/{held}/status")).await.status(),
            StatusCode::OK
        );
        let mut ws = api.ws(&format!("request_id={held}")).await.unwrap();
        assert_eq!(ws_next(&mut ws).await.unwrap()["stage"], "NEW");
    }
    // Operator routes need no token.
    api.token = None;
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        assert_eq!(api.get(path).await.status(), StatusCode::OK, "{path}");
    }
    assert!(!api.d.log_text().contains("tok-a"), "tokens never appear in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_without_tokens_a_public_address_is_refused_at_start() {
    let db = TestDb::new().await;
    for addr in ["0.0.0.0:0", "[::]:0"] {
        let mut d = Maasd::spawn(&db.url, Opts::default().env("MAAS_HTTP_ADDR", addr));
        assert_eq!(d.wait_exit(GENEROUS).await, Some(1), "{}", d.log_text());
        let log = d.plain_log();
        assert!(
            log.contains("http_addr") && log.contains("not a loopback address") && log.contains("MAAS_API_TOKENS"),
            "{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_idempotency_key_returns_the_first_request_durably_and_under_concurrency() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut api = Api::start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let body = json!({"user_id": user, "query": "book the trip"});
    let id = a_key_replays_its_first_request(&api, user, &body).await;
    let ids = concurrent_duplicates_make_one_request(&api, &c, user).await;
    expired_keys_start_anew_and_are_deleted(&api, &c, user, &ids).await;

    // Durable: another daemon process still knows the key.
    api.d.kill();
    let api = Api::start(&db, Opts::default()).await;
    let after = post_with_key(&api, "key-1", &body).await;
    assert_eq!(after.headers()["idempotent-replayed"], "true");
    assert_eq!(after.json::<Value>().await.unwrap()["request_id"], id);
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM pipeline_runs WHERE user_query = 'book the trip'"
        )
        .await,
        2,
        "one per user"
    );
}

/// Submits `body` with Idempotency-Key `key`.
async fn post_with_key(api: &Api, key: &str, body: &Value) -> reqwest::Response {
    api.http
        .post(api.url("/api/query"))
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .unwrap()
}

/// A retry with the same key replays the first request (marked so); the
/// key for a different request is refused; another user's same key is
/// another request. Returns the first request's id.
async fn a_key_replays_its_first_request(api: &Api, user: Uuid, body: &Value) -> Value {
    let first = post_with_key(api, "key-1", body).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let id = first.json::<Value>().await.unwrap()["request_id"].clone();
    let retry = post_with_key(api, "key-1", body).await;
    assert_eq!(retry.status(), StatusCode::ACCEPTED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.json::<Value>().await.unwrap()["request_id"], id);
    let other = post_with_key(api, "key-1", &json!({"user_id": user, "query": "something else"})).await;
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.json::<Value>().await.unwrap()["code"], "idempotency_key_reused");
    let stranger = post_with_key(
        api,
        "key-1",
        &json!({"user_id": Uuid::new_v4(), "query": "book the trip"}),
    )
    .await;
    assert_eq!(stranger.status(), StatusCode::ACCEPTED);
    assert_ne!(stranger.json::<Value>().await.unwrap()["request_id"], id);
    id
}

/// Fifty concurrent duplicates make one request; returns its id (as JSON
/// text).
async fn concurrent_duplicates_make_one_request(api: &Api, c: &tokio_postgres::Client, user: Uuid) -> HashSet<String> {
    let concurrent = json!({"user_id": user, "query": "at once"});
    let answers = futures_util::future::join_all((0..50).map(|_| post_with_key(api, "key-2", &concurrent))).await;
    let mut ids = HashSet::new();
    for resp in answers {
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        ids.insert(resp.json::<Value>().await.unwrap()["request_id"].to_string());
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(
        count(c, "SELECT count(*) FROM pipeline_runs WHERE user_query = 'at once'").await,
        1
    );
    ids
}

/// An expired key starts a new request; expired keys are deleted.
async fn expired_keys_start_anew_and_are_deleted(
    api: &Api,
    c: &tokio_postgres::Client,
    user: Uuid,
    ids: &HashSet<String>,
) {
    let age_key = || async {
        c.execute(
            "UPDATE http_idempotency_keys SET created_at = now() - interval '2 days' WHERE key = 'key-2'",
            &[],
        )
        .await
        .unwrap();
    };
    age_key().await;
    let renewed = post_with_key(api, "key-2", &json!({"user_id": user, "query": "at once"})).await;
    assert!(renewed.headers().get("idempotent-replayed").is_none());
    assert!(!ids.contains(&renewed.json::<Value>().await.unwrap()["request_id"].to_string()));
    age_key().await;
    let expire = maas::repo::statement("expire_idempotency_keys").unwrap();
    let deleted = c.execute(expire, &[&86_400f64, &100i64]).await.unwrap();
    assert_eq!(deleted, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_websocket_and_sse_follow_a_request_to_completed() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let held = insert_held(&c, &[user]).await[0];

    let (mut by_request, mut by_user, mut sse) = streams_show_the_current_state_first(&api, held, user).await;
    release(&c).await;
    streams_follow_the_request_to_its_answer(&mut by_request, &mut by_user, &mut sse).await;
    the_users_socket_shows_only_the_users_next_requests(&api, &mut by_user, user).await;
    bad_subscriptions_are_refused(&api, held, user).await;
}

/// A WebSocket by request, one by user and an SSE stream on `held`, each
/// showing its current state first.
async fn streams_show_the_current_state_first(api: &Api, held: Uuid, user: Uuid) -> (Ws, Ws, Sse) {
    let mut by_request = api.ws(&format!("request_id={held}")).await.unwrap();
    let mut by_user = api.ws(&format!("user_id={user}")).await.unwrap();
    let resp = api.get(&format!("/api/query/{held}/events")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut sse = Sse::new(resp);
    for first in [
        ws_next(&mut by_request).await.unwrap(),
        ws_next(&mut by_user).await.unwrap(),
        sse.next().await.unwrap(),
    ] {
        assert_eq!(
            first,
            json!({"request_id": held, "status": "processing", "stage": "NEW"})
        );
    }
    (by_request, by_user, sse)
}

/// Then every change, ending with the answer; the request's streams end.
async fn streams_follow_the_request_to_its_answer(by_request: &mut Ws, by_user: &mut Ws, sse: &mut Sse) {
    let mut seen = Vec::new();
    let last = loop {
        let s = ws_next(by_request).await.unwrap();
        seen.push(s["stage"].as_str().unwrap().to_owned());
        if s["status"] != "processing" {
            break s;
        }
    };
    assert_eq!(last["status"], "completed", "{seen:?}");
    assert!(last["answer"].as_str().unwrap().starts_with("[offline]"));
    assert_eq!(
        ws_next(by_request).await,
        Err(Some(1000)),
        "closed normally after the answer"
    );
    let sse_last = loop {
        let s = sse.next().await.unwrap();
        if s["status"] != "processing" {
            break s;
        }
    };
    assert_eq!(sse_last, last);
    assert!(sse.next().await.is_none(), "the SSE stream ends after the answer");
    let user_last = loop {
        let s = ws_next(by_user).await.unwrap();
        if s["status"] != "processing" {
            break s;
        }
    };
    assert_eq!(user_last, last);
}

/// The user's socket stays open and shows the user's next request, and
/// nobody else's.
async fn the_users_socket_shows_only_the_users_next_requests(api: &Api, by_user: &mut Ws, user: Uuid) {
    let next = api.submit_ok(user, "and now?").await;
    let done = loop {
        let s = ws_next(by_user).await.unwrap();
        assert_eq!(s["request_id"], next.to_string(), "{s}");
        if s["status"] != "processing" {
            break s;
        }
    };
    assert_eq!(done["status"], "completed");
    api.submit_ok(Uuid::new_v4(), "someone else").await;
    let mine = api.submit_ok(user, "mine again").await;
    let s = ws_next(by_user).await.unwrap();
    assert_eq!(s["request_id"], mine.to_string(), "{s}");
}

/// Bad subscriptions: both ids, none, a malformed or unknown one, no
/// upgrade.
async fn bad_subscriptions_are_refused(api: &Api, held: Uuid, user: Uuid) {
    for (query, code) in [
        (format!("request_id={held}&user_id={user}"), 400),
        (String::new(), 400),
        ("request_id=nope".to_owned(), 400),
        (format!("request_id={}", Uuid::new_v4()), 404),
    ] {
        match api.ws(&query).await {
            Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), code, "{query}"),
            other => panic!("{query}: expected {code}, got {:?}", other.map(|_| ())),
        }
    }
    let plain = api.get(&format!("/api/ws?request_id={held}")).await;
    assert_eq!(plain.status(), StatusCode::UPGRADE_REQUIRED);
    assert_eq!(
        api.get(&format!("/api/query/{}/events", Uuid::new_v4())).await.status(),
        404
    );
    assert_eq!(api.get("/api/query/nope/events").await.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_a_thousand_long_polls_are_held_while_their_requests_complete() {
    const N: usize = 1000;
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default()).await;
    let ids = insert_held(&c, &vec![Uuid::new_v4(); N]).await;
    let started = Instant::now();
    let polls: Vec<_> = ids
        .iter()
        .map(|id| {
            let rb = api.http.get(api.url(&format!("/api/query/{id}/status?wait=60s")));
            tokio::spawn(async move {
                let resp = rb.send().await.unwrap();
                assert_eq!(resp.status(), StatusCode::OK);
                resp.json::<Value>().await.unwrap()
            })
        })
        .collect();
    // Every poll is waiting before any request can finish.
    api.wait_metric("maas_http_waiting_long_polls", 1000.0).await;
    assert_eq!(
        count(&c, "SELECT count(*) FROM pipeline_runs WHERE status = 'NEW'").await,
        1000
    );
    release(&c).await;
    for (poll, id) in polls.into_iter().zip(&ids) {
        let state = poll.await.unwrap();
        assert_eq!(state["request_id"], id.to_string());
        assert_eq!(state["status"], "completed", "{state}");
        assert!(state["answer"].as_str().unwrap().starts_with("[offline]"));
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(55),
        "the polls returned on completion, not at their deadline: {took:?}"
    );
    api.wait_metric("maas_http_waiting_long_polls", 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_streams_and_long_polls_end_cleanly_on_shutdown() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let mut api = Api::start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let held = insert_held(&c, &[user]).await[0];
    let mut ws = api.ws(&format!("request_id={held}")).await.unwrap();
    let mut user_ws = api.ws(&format!("user_id={user}")).await.unwrap();
    assert_eq!(ws_next(&mut ws).await.unwrap()["stage"], "NEW");
    assert_eq!(ws_next(&mut user_ws).await.unwrap()["stage"], "NEW");
    let mut sse = Sse::new(api.get(&format!("/api/query/{held}/events")).await);
    assert_eq!(sse.next().await.unwrap()["stage"], "NEW");
    let poll = tokio::spawn(
        api.http
            .get(api.url(&format!("/api/query/{held}/status?wait=60s")))
            .send(),
    );
    api.wait_metric("maas_http_waiting_long_polls", 1.0).await;
    api.wait_metric("maas_http_open_streams{kind=\"websocket\"}", 2.0).await;
    let started = Instant::now();
    api.d.signal(Signal::SIGTERM);
    assert_eq!(ws_next(&mut ws).await, Err(Some(1001)), "going away");
    assert_eq!(ws_next(&mut user_ws).await, Err(Some(1001)), "going away");
    assert!(sse.next().await.is_none(), "the SSE stream ends");
    let polled: Value = poll.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(polled["status"], "processing");
    assert_eq!(
        api.d.wait_exit(Duration::from_secs(30)).await,
        Some(0),
        "{}",
        api.d.log_text()
    );
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    assert!(api.d.plain_log().contains("http: stopped"));
}

/// Checks Prometheus text format 0.0.4 line by line: comments are HELP or
/// TYPE with a valid name and type; samples are `name{labels} value` with a
/// valid name, well-formed labels and a float value; a family's TYPE comes
/// before its samples and only once.
fn check_prometheus_text(text: &str) -> Vec<String> {
    fn valid_name(n: &str) -> bool {
        let mut chars = n.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }
    let mut typed = HashSet::new();
    let mut names = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(valid_name(name), "{line}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert!(typed.insert(name.to_owned()), "TYPE twice: {line}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            assert!(valid_name(rest.split(' ').next().unwrap()), "{line}");
            continue;
        }
        assert!(!line.starts_with('#'), "unknown comment: {line}");
        let (series, value) = line.rsplit_once(' ').unwrap();
        assert!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "{line}"
        );
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, Some(l.strip_suffix('}').unwrap_or_else(|| panic!("{line}")))),
            None => (series, None),
        };
        assert!(valid_name(name), "{line}");
        for pair in labels
            .into_iter()
            .flat_map(|l| l.split("\","))
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').unwrap_or_else(|| panic!("{line}"));
            assert!(valid_name(k) && v.starts_with('"'), "{line}");
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains(*f)))
            .unwrap_or(name);
        assert!(typed.contains(family), "sample before its TYPE: {line}");
        names.push(series.to_owned());
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_readiness_metrics_and_openapi_match_the_server() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default().env("MAAS_HTTP__METRICS_REFRESH_SECS", 1)).await;
    let user = Uuid::new_v4();
    for i in 0..5 {
        let id = api.submit_ok(user, &format!("metrics {i}")).await;
        assert_eq!(api.status(id, "30s").await.1["status"], "completed");
    }
    insert_held(&c, &[user, user]).await;
    c.batch_execute(
        "INSERT INTO pipeline_runs (user_id, user_query, status) VALUES (gen_random_uuid(), 'x', 'FAILED')",
    )
    .await
    .unwrap();
    wait_until(GENEROUS, "the latency histograms show the five requests", || async {
        metric(
            &api.metrics().await,
            "maas_request_duration_seconds_count{outcome=\"completed\"}",
        ) == Some(5.0)
    })
    .await;
    api.wait_metric("maas_backlog_requests{status=\"NEW\"}", 2.0).await;
    the_metrics_page_has_every_series(&api).await;
    every_documented_operation_is_served(&api).await;
    readiness_names_what_is_wrong(&api, &c).await;
}

/// Every series is prefixed and present, with the figures of five
/// completed requests, one failed and two waiting.
async fn the_metrics_page_has_every_series(api: &Api) {
    let resp = api.get("/metrics").await;
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let text = resp.text().await.unwrap();
    let series = check_prometheus_text(&text);
    assert!(
        series.iter().all(|s| s.starts_with("maas_")),
        "every series is prefixed"
    );
    for want in [
        "maas_backlog_requests{status=\"ANALYZING\"}",
        "maas_failed_requests",
        "maas_requests_completed_total",
        "maas_requests_failed_total",
        "maas_stage_claims_total{stage=\"analyze\"}",
        "maas_sweep_recovered_total",
        "maas_listener_reconnects_total",
        "maas_listener_connected",
        "maas_llm_calls_total{provider=\"offline\",role=\"responder\",outcome=\"ok\"}",
        "maas_llm_tokens_total{provider=\"offline\",role=\"analyzer\",kind=\"prompt\"}",
        "maas_llm_rate_limited_total{provider=\"offline\",role=\"responder\"}",
        "maas_llm_timeouts_total{provider=\"offline\",role=\"responder\"}",
        "maas_stage_duration_seconds_bucket{stage=\"respond\",outcome=\"succeeded\",le=\"+Inf\"}",
        "maas_http_requests_total{route=\"/api/query\",code=\"202\"}",
    ] {
        assert!(series.iter().any(|s| s == want), "{want} missing from:\n{text}");
    }
    assert_eq!(metric(&text, "maas_requests_completed_total"), Some(5.0));
    // The LLM layer feeds its series: one responder call per completed request.
    assert!(
        metric(
            &text,
            "maas_llm_calls_total{provider=\"offline\",role=\"responder\",outcome=\"ok\"}"
        )
        .unwrap_or(0.0)
            >= 5.0,
        "{text}"
    );
    assert_eq!(metric(&text, "maas_failed_requests"), Some(1.0));
    assert_eq!(metric(&text, "maas_listener_connected"), Some(1.0));
}

/// Every documented operation is served (a param route may say its
/// request is unknown, but never that the route is), and nothing else.
async fn every_documented_operation_is_served(api: &Api) {
    let doc: Value = api.get("/openapi.json").await.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut ops = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            ops += 1;
            let url = api.url(&path.replace("{id}", &Uuid::new_v4().to_string()));
            let resp = match method.as_str() {
                "get" => api.http.get(url).send().await.unwrap(),
                "post" => api.http.post(url).json(&json!({})).send().await.unwrap(),
                "put" => api.http.put(url).json(&json!({})).send().await.unwrap(),
                "delete" => api.http.delete(url).send().await.unwrap(),
                other => panic!("undocumented method {other}"),
            };
            assert_ne!(resp.status(), StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            let body = resp.text().await.unwrap();
            assert!(!body.contains("no_route"), "{method} {path}: {body}");
        }
    }
    assert_eq!(ops, 22);
}

/// Readiness names what is wrong.
async fn readiness_names_what_is_wrong(api: &Api, c: &tokio_postgres::Client) {
    c.batch_execute("DROP TRIGGER pipeline_runs_log_user_query ON pipeline_runs")
        .await
        .unwrap();
    let resp = api.get("/readyz").await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "unavailable");
    let reason = body["reason"].as_str().unwrap();
    assert!(
        reason.contains("missing triggers: pipeline_runs_log_user_query"),
        "{body}"
    );
    assert_eq!(body["checks"]["database"], "ok");
    assert_eq!(body["checks"]["listener"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_subscribers_reread_the_table_after_the_listener_reconnects() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let held = insert_held(&c, &[user]).await[0];
    let mut ws = api.ws(&format!("request_id={held}")).await.unwrap();
    assert_eq!(ws_next(&mut ws).await.unwrap()["stage"], "NEW");
    let poll = tokio::spawn(
        api.http
            .get(api.url(&format!("/api/query/{held}/status?wait=60s")))
            .send(),
    );
    api.wait_metric("maas_http_waiting_long_polls", 1.0).await;
    // A change no notification reports: only re-reading the table shows it.
    c.batch_execute("DROP TRIGGER pipeline_runs_notify_update ON pipeline_runs")
        .await
        .unwrap();
    c.execute(
        "UPDATE pipeline_runs SET status = 'CANCELLED', error = 'by an operator' WHERE id = $1",
        &[&held],
    )
    .await
    .unwrap();
    c.batch_execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = 'maasd-listener'",
    )
    .await
    .unwrap();
    let state = ws_next(&mut ws).await.unwrap();
    assert_eq!(
        state,
        json!({"request_id": held, "status": "failed", "stage": "CANCELLED", "error": "cancelled: by an operator"})
    );
    assert_eq!(ws_next(&mut ws).await, Err(Some(1000)));
    let polled: Value = poll.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(polled, state);
    assert!(api.d.plain_log().contains("listener reconnected"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_continue_steps_a_debug_run_through_its_stages() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default()).await;
    let id: Uuid = value(&c, "INSERT INTO pipeline_runs (user_id, user_query, debug) VALUES (gen_random_uuid(), 'step by step', true) RETURNING id", &[]).await;
    let status = |want: &'static str| {
        let c = &c;
        async move {
            let st: String = value(c, "SELECT status FROM pipeline_runs WHERE id = $1", &[&id]).await;
            st == want
        }
    };
    wait_until(GENEROUS, "the debug request rests in ANALYZED", || status("ANALYZED")).await;
    let resp = api
        .authed(api.http.post(api.url(&format!("/api/query/{id}/continue"))))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        (body["status"].as_str(), body["next_stage"].as_str()),
        (Some("ANALYZED"), Some("assemble"))
    );
    wait_until(GENEROUS, "then in READY", || status("READY")).await;
    // Not resting twice in a row: the second call before it rests again is a conflict.
    let resp = api
        .authed(api.http.post(api.url(&format!("/api/query/{id}/continue"))))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "released from READY");
    wait_until(GENEROUS, "completed", || status("COMPLETED")).await;
    let resp = api
        .authed(api.http.post(api.url(&format!("/api/query/{id}/continue"))))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let resp = api
        .authed(
            api.http
                .post(api.url(&format!("/api/query/{}/continue", Uuid::new_v4()))),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let resp = api
        .authed(api.http.post(api.url("/api/query/nope/continue")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_memory_version_follows_new_lsm_records() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let version = |v: Value| v["memory_version"].as_i64();
    let got: Value = api
        .get(&format!("/api/users/{user}/memory"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(version(got), Some(0));
    c.execute(
        "INSERT INTO pipeline_runs (user_id, user_query) VALUES ($1, 'remember this')",
        &[&user],
    )
    .await
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_maasctl"))
        .args(["archivist", "run", "--user", &user.to_string()])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Value = api
        .get(&format!("/api/users/{user}/memory"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(version(got), Some(1));
    assert_eq!(
        api.get("/api/users/nope/memory").await.status(),
        StatusCode::BAD_REQUEST
    );
}

/// A WebSocket to `/api/ws?{query}` with bearer `token`.
async fn ws_as(api: &Api, token: &str, query: &str) -> Ws {
    let mut req = format!("ws://{}/api/ws?{query}", api.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

/// `GET /api/query/{id}/events` with bearer `token`.
async fn events_as(api: &Api, token: &str, id: Uuid) -> reqwest::Response {
    let url = api.url(&format!("/api/query/{id}/events"));
    api.http.get(url).bearer_auth(token).send().await.unwrap()
}

/// Reads SSE `resp` until it ends: the name of every event (`message`
/// when unnamed), keep-alives left out.
async fn sse_events_until_end(mut resp: reqwest::Response, within: Duration) -> Vec<String> {
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + within;
    while let Some(chunk) = tokio::time::timeout_at(deadline, resp.chunk())
        .await
        .expect("the SSE stream ended within the deadline")
        .unwrap_or(None)
    {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    text.split("\n\n")
        .filter(|e| e.lines().any(|l| l.starts_with("data:")))
        .map(|e| {
            e.lines()
                .find_map(|l| l.strip_prefix("event:"))
                .map_or("message".to_owned(), |n| n.trim().to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_streams_end_once_their_token_is_revoked() {
    use crate::support::tenants;
    let db = TestDb::new().await;
    let c = db.client().await;
    // Slow answers keep the request open while its streams are watched.
    let api = tenants::start(&db, Opts::default().env("MAAS_LLM__OFFLINE__LATENCY_MS", 120_000)).await;
    let tok = tenants::token(&c, "shop", "app", "operate").await;
    let (user, thread) = (Uuid::new_v4(), Uuid::new_v4());
    let id = tenants::submit_ok(&api, &tok, user, thread, "follow me").await;

    let mut by_request = ws_as(&api, &tok, &format!("request_id={id}")).await;
    let mut by_user = ws_as(&api, &tok, &format!("user_id={user}")).await;
    let mut admins = ws_as(&api, tenants::ADMIN, &format!("user_id={}", Uuid::new_v4())).await;
    let sse = events_as(&api, &tok, id).await;
    assert_eq!(sse.status(), StatusCode::OK);
    assert!(ws_next(&mut by_request).await.is_ok());

    c.execute(
        "UPDATE api_tokens SET revoked_at = now() WHERE name = 'app' AND tenant_id = (SELECT id FROM tenants WHERE name = 'shop')",
        &[],
    )
    .await
    .unwrap();
    let revoked = Instant::now();
    // Two token-cache periods (5 s each), and some slack.
    let within = Duration::from_secs(20);
    assert_eq!(
        sse_events_until_end(sse, within).await.last().map(String::as_str),
        Some("revoked")
    );
    for ws in [&mut by_request, &mut by_user] {
        let closed = loop {
            match tokio::time::timeout(within, ws_next(ws)).await.expect("closed in time") {
                Ok(_) => continue,
                Err(code) => break code,
            }
        };
        assert_eq!(closed, Some(1008), "policy violation: token revoked");
    }
    assert!(revoked.elapsed() < within, "{:?}", revoked.elapsed());
    // A configured token's stream stays open.
    let still = tokio::time::timeout(Duration::from_secs(1), admins.next()).await;
    assert!(still.is_err(), "the admin's stream ended: {still:?}");
    let refused = events_as(&api, &tok, id).await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
}
