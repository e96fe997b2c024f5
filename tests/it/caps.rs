//! What one client can hold of a real `maasd`: long-polls and streams are
//! capped per daemon and per token (429/503 with Retry-After, at once), a
//! slow or idle connection is cut, and HTTP traffic cannot starve the
//! engine of connections.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::daemon::Opts;
use crate::support::db::{TestDb, connect};
use crate::support::metrics::metric;
use crate::support::ops::wait_status;
use crate::support::{GENEROUS, count, insert_held, new_users, wait_until};

/// Asserts an immediate refusal with `status`, `Retry-After` and a JSON code.
async fn assert_refused(resp: reqwest::Response, status: StatusCode, took: Duration) {
    assert_eq!(resp.status(), status);
    let retry: u64 = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After in seconds");
    assert!(retry >= 1);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "too_many_streams", "{body}");
    assert!(took < Duration::from_secs(3), "refused after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_refuse_long_polls_and_streams_over_the_limit_at_once() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(
        &db,
        Opts::default()
            .env("MAAS_API_TOKENS", "tok-a,tok-b")
            .env("MAAS_HTTP__MAX_LONG_POLLS", 3)
            .env("MAAS_HTTP__MAX_LONG_POLLS_PER_TOKEN", 2)
            .env("MAAS_HTTP__MAX_STREAMS", 3)
            .env("MAAS_HTTP__MAX_STREAMS_PER_TOKEN", 2),
    )
    .await;
    let held = insert_held(&c, &new_users(1)).await[0];
    let polls = long_polls_over_the_caps_are_refused(&api, held).await;
    streams_over_the_caps_are_refused(&api, held).await;
    for p in polls {
        p.abort();
    }
}

/// GET `path` with bearer `token`.
async fn get(api: &Api, token: &str, path: String) -> reqwest::Response {
    api.http.get(api.url(&path)).bearer_auth(token).send().await.unwrap()
}

/// Long-polls: two of token a and one of token b are held; one more of a
/// is over its token's cap (429), one more of b over the daemon's (503).
/// Returns the held polls.
async fn long_polls_over_the_caps_are_refused(
    api: &Api,
    held: Uuid,
) -> Vec<tokio::task::JoinHandle<reqwest::Response>> {
    let poll = format!("/api/query/{held}/status?wait=60s");
    let mut polls = Vec::new();
    for token in ["tok-a", "tok-a", "tok-b"] {
        polls.push(tokio::spawn({
            let (http, url) = (api.http.clone(), api.url(&poll));
            async move { http.get(url).bearer_auth(token).send().await.unwrap() }
        }));
        let n = polls.len() as f64;
        wait_until(GENEROUS, "the long-poll is held", || async {
            metric(&api.metrics().await, "maas_http_waiting_long_polls") == Some(n)
        })
        .await;
    }
    let t = Instant::now();
    let resp = get(api, "tok-a", poll.clone()).await;
    assert_refused(resp, StatusCode::TOO_MANY_REQUESTS, t.elapsed()).await;
    let t = Instant::now();
    let resp = get(api, "tok-b", poll.clone()).await;
    assert_refused(resp, StatusCode::SERVICE_UNAVAILABLE, t.elapsed()).await;
    // A status without a wait holds nothing and is answered.
    assert_eq!(
        get(api, "tok-b", format!("/api/query/{held}/status")).await.status(),
        StatusCode::OK
    );
    polls
}

/// Streams: SSE and WebSocket share the caps; a closed stream gives its
/// place back.
async fn streams_over_the_caps_are_refused(api: &Api, held: Uuid) {
    let sse = format!("/api/query/{held}/events");
    let a1 = get(api, "tok-a", sse.clone()).await;
    let a2 = get(api, "tok-a", sse.clone()).await;
    assert_eq!((a1.status(), a2.status()), (StatusCode::OK, StatusCode::OK));
    let t = Instant::now();
    assert_refused(
        get(api, "tok-a", sse.clone()).await,
        StatusCode::TOO_MANY_REQUESTS,
        t.elapsed(),
    )
    .await;
    let b1 = get(api, "tok-b", sse.clone()).await;
    assert_eq!(b1.status(), StatusCode::OK);
    let t = Instant::now();
    assert_refused(
        get(api, "tok-b", sse.clone()).await,
        StatusCode::SERVICE_UNAVAILABLE,
        t.elapsed(),
    )
    .await;
    match ws_connect(format!("ws://{}/api/ws?request_id={held}", api.addr), "tok-b").await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), StatusCode::SERVICE_UNAVAILABLE.as_u16());
            assert!(resp.headers().get("retry-after").is_some());
        }
        other => panic!("a WebSocket over the cap was not refused: {other:?}"),
    }
    // A closed stream gives its place back.
    drop(a1);
    wait_until(GENEROUS, "a stream place is free again", || async {
        get(api, "tok-b", sse.clone()).await.status() == StatusCode::OK
    })
    .await;
}

/// Opens a WebSocket with a bearer token.
async fn ws_connect(url: String, token: &str) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    tokio_tungstenite::connect_async(req).await.map(|_| ())
}

/// Reads until the server closes the connection; returns when, or `None`
/// if it stays open past `within`. Sends `drip` one byte at a time, one
/// every 300 ms, meanwhile.
async fn closed_within(stream: &mut tokio::net::TcpStream, drip: &[u8], within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    let mut next = 0;
    loop {
        if started.elapsed() > within {
            return None;
        }
        if next < drip.len() && stream.write_all(&drip[next..=next]).await.is_err() {
            return Some(started.elapsed());
        }
        next += 1;
        match tokio::time::timeout(Duration::from_millis(300), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) | Err(_) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_a_slow_or_idle_connection_is_cut_after_the_header_timeout() {
    let db = TestDb::new().await;
    let api = Api::start(&db, Opts::default().env("MAAS_HTTP__HEADER_READ_TIMEOUT_SECS", 2)).await;

    // Slowloris: headers one byte every 300 ms, never finished.
    let mut slow = tokio::net::TcpStream::connect(api.addr).await.unwrap();
    let drip = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ".repeat(4);
    let took = closed_within(&mut slow, &drip, Duration::from_secs(20))
        .await
        .expect("a slowloris client is cut");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(8),
        "{took:?}"
    );

    // Idle keep-alive: one request answered, then silence.
    let mut idle = tokio::net::TcpStream::connect(api.addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let took = closed_within(&mut idle, b"", Duration::from_secs(20))
        .await
        .expect("an idle keep-alive connection is closed");
    assert!(took < Duration::from_secs(8), "{took:?}");

    // The server still answers others.
    assert_eq!(api.get("/healthz").await.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_the_engine_progresses_while_the_api_pool_is_exhausted() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(
        &db,
        Opts::default()
            .env("MAAS_DB__API_POOL_SIZE", 2)
            .env("MAAS_DB__LOCK_TIMEOUT_MS", 4000),
    )
    .await;
    // Every API connection is taken by submits waiting on a lock: a
    // producer holds one user's turns.
    let user = Uuid::new_v4();
    let mut producer = connect(&db.url).await;
    let tx = producer.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO raw_logs (user_id, message_type, content) VALUES ($1, 'user_query', 'held')",
        &[&user],
    )
    .await
    .unwrap();
    let started = Instant::now();
    let submits: Vec<_> = (0..8)
        .map(|i| {
            let rb = api
                .http
                .post(api.url("/api/query"))
                .json(&json!({"user_id": user, "query": format!("q{i}")}));
            tokio::spawn(async move { rb.send().await.map(|r| r.status()) })
        })
        .collect();
    // Meanwhile other users' requests, inserted by SQL, complete.
    crate::support::insert_requests(&c, 20, "engine").await;
    wait_until(GENEROUS, "the engine completed the other requests", || async {
        count(&c, "SELECT count(*) FROM pipeline_runs WHERE status = 'COMPLETED'").await == 20
    })
    .await;
    let engine_took = started.elapsed();
    let pending = submits.iter().filter(|s| !s.is_finished()).count();
    assert!(
        pending > 0,
        "the API pool was still exhausted when the engine finished ({engine_took:?})"
    );
    let mut statuses = Vec::new();
    for s in submits {
        statuses.push(s.await.unwrap().unwrap());
    }
    assert!(
        statuses.iter().all(|s| *s == StatusCode::SERVICE_UNAVAILABLE),
        "{statuses:?}"
    );
    tx.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_a_websocket_message_over_the_size_limit_closes_the_socket() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default().env("MAAS_HTTP__WS_MAX_MESSAGE_BYTES", 1024)).await;
    let held = insert_held(&c, &new_users(1)).await[0];
    let url = format!("ws://{}/api/ws?request_id={held}", api.addr);
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    // The current state first.
    let first = tokio::time::timeout(GENEROUS, ws.next()).await.unwrap();
    assert!(matches!(first, Some(Ok(Message::Text(_)))), "{first:?}");
    // A small message is ignored; the socket stays open.
    ws.send(Message::text("x".repeat(100))).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), ws.next())
            .await
            .is_err(),
        "a small message closed the socket"
    );
    // A message over the limit ends it.
    let _ = ws.send(Message::text("x".repeat(64 * 1024))).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(_)) => continue,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the socket stayed open after an oversize message");
    // The daemon serves on.
    assert_eq!(api.get("/healthz").await.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_the_console_stream_counts_under_the_stream_caps() {
    let db = TestDb::new().await;
    let api = Api::start(
        &db,
        Opts::default()
            .env("MAAS_API_TOKENS", "tok-a")
            .env("MAAS_HTTP__MAX_STREAMS_PER_TOKEN", 1),
    )
    .await;
    let session = crate::support::console::login(&api, "tok-a")
        .await
        .cookie
        .expect("a session");
    let open = |session: String| {
        let url = api.url("/console/events");
        async move {
            crate::support::console::plain_client()
                .get(url)
                .header("cookie", session)
                .send()
                .await
                .unwrap()
        }
    };
    let first = open(session.clone()).await;
    assert_eq!(first.status(), StatusCode::OK);
    let t = Instant::now();
    let second = open(session.clone()).await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(t.elapsed() < Duration::from_secs(3));
    // The token's API streams share the same cap, and a closed stream gives
    // its place back.
    let held = insert_held(&db.client().await, &new_users(1)).await[0];
    let api_stream = get(&api, "tok-a", format!("/api/query/{held}/events")).await;
    assert_eq!(api_stream.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(first);
    wait_until(GENEROUS, "the console stream's place comes back", || async {
        open(session.clone()).await.status() == StatusCode::OK
    })
    .await;
}

/// Counts UPDATE statements on `api_tokens` (a statement trigger fires even
/// when no row changes).
async fn count_token_updates(c: &tokio_postgres::Client) {
    c.batch_execute(
        "CREATE TABLE token_updates (at timestamptz DEFAULT now());
         CREATE FUNCTION count_token_update() RETURNS trigger LANGUAGE plpgsql AS
           $$BEGIN INSERT INTO token_updates DEFAULT VALUES; RETURN NULL; END$$;
         CREATE TRIGGER count_token_update AFTER UPDATE ON api_tokens
           FOR EACH STATEMENT EXECUTE FUNCTION count_token_update();",
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_wrong_tokens_cost_no_write_and_are_rate_limited_per_address() {
    use crate::support::tenants;
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = tenants::start(&db, Opts::default().env("MAAS_HTTP__MAX_AUTH_FAILURES_PER_MINUTE", 3)).await;
    count_token_updates(&c).await;
    let held = insert_held(&c, &new_users(1)).await[0];
    let status = format!("/api/query/{held}/status");
    // The first failures are 401 and write nothing.
    for n in 0..3 {
        let resp = get(&api, &format!("wrong-{n}"), status.clone()).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(count(&c, "SELECT count(*) FROM token_updates").await, 0);
    // Past the budget the address is refused before any lookup.
    let mut codes = Vec::new();
    for n in 3..6 {
        codes.push(get(&api, &format!("wrong-{n}"), status.clone()).await);
    }
    let last = codes.pop().unwrap();
    assert_eq!(last.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(last.headers().contains_key("retry-after"));
    assert_eq!(
        last.json::<serde_json::Value>().await.unwrap()["code"],
        "too_many_auth_failures"
    );
    // A configured token still passes from that address.
    assert_eq!(get(&api, tenants::ADMIN, status.clone()).await.status(), StatusCode::OK);
    assert_eq!(count(&c, "SELECT count(*) FROM token_updates").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_memory_searches_and_exports_are_capped_per_token() {
    let db = TestDb::new().await;
    let api = Api::start(
        &db,
        Opts::default()
            .env("MAAS_API_TOKENS", "tok-a,tok-b")
            .env("MAAS_ARCHIVIST__ENABLED", "false")
            .env("MAAS_DB__LOCK_TIMEOUT_MS", 30_000)
            .env("MAAS_HTTP__MAX_SEARCHES_PER_TOKEN", 1)
            .env("MAAS_HTTP__MAX_EXPORTS_PER_TOKEN", 1),
    )
    .await;
    let user = Uuid::new_v4();
    let submitted: serde_json::Value = api
        .http
        .post(api.url("/api/query"))
        .bearer_auth("tok-a")
        .json(&json!({ "user_id": user, "query": "remember the tulips" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // The engine is done with it before the tables are locked below: a
    // request still in flight holds one of them and waits for another,
    // and the lock would end in a deadlock.
    let c = connect(&db.url).await;
    let id: Uuid = submitted["request_id"].as_str().unwrap().parse().unwrap();
    wait_status(&c, id, "COMPLETED").await;
    let long = "x".repeat(2001);
    let resp = get(&api, "tok-a", format!("/api/users/{user}/memory?q={long}")).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().starts_with("q is longer"), "{body}");

    // Hold one search and one export of token a behind a lock.
    let mut locker = connect(&db.url).await;
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE raw_logs, lsm_storage, pipeline_runs IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let search = format!("/api/users/{user}/memory?q=tulips");
    let export = format!("/api/users/{user}/export");
    let held: Vec<_> = [search.clone(), export.clone()]
        .into_iter()
        .map(|path| {
            let (http, url) = (api.http.clone(), api.url(&path));
            tokio::spawn(async move { http.get(url).bearer_auth("tok-a").send().await.unwrap().status() })
        })
        .collect();
    api_waiting_on_a_lock(&c, 2).await;
    for (path, code) in [(&search, "too_many_searches"), (&export, "too_many_exports")] {
        // Refused at once: a request let through would wait on the lock
        // for `lock_timeout` (30 s) and then fail with a 5xx.
        let t = Instant::now();
        let resp = get(&api, "tok-a", path.clone()).await;
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
        assert!(resp.headers().contains_key("retry-after"));
        assert_eq!(resp.json::<serde_json::Value>().await.unwrap()["code"], code);
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    }
    // Another token is not held back by token a's: its search reaches the lock.
    let other = tokio::spawn({
        let (http, url) = (api.http.clone(), api.url(&search));
        async move { http.get(url).bearer_auth("tok-b").send().await.unwrap().status() }
    });
    api_waiting_on_a_lock(&c, 3).await;
    tx.rollback().await.unwrap();
    assert_ne!(other.await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
    for h in held {
        let status = h.await.unwrap();
        assert!(status.is_success() || status == StatusCode::NOT_FOUND, "{status}");
    }
}

/// Waits until `n` of the API's connections wait on a lock in this database.
async fn api_waiting_on_a_lock(c: &tokio_postgres::Client, n: i64) {
    wait_until(GENEROUS, &format!("{n} API connections waiting on a lock"), || async {
        count(
            c,
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'maasd-api'
               AND wait_event_type = 'Lock'",
        )
        .await
            >= n
    })
    .await;
}
