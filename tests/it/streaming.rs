//! Answers that stream: the pieces of an answer reach a client on any
//! daemon in order (SSE `delta` events, WebSocket frames, the OpenAI chunk
//! shape of `POST /api/query`), a client that reconnects gets what it
//! missed, and a responder killed mid-answer shows as an explicit restart,
//! never as two answers interleaved.
//!
//! The transport tests publish pieces from this process (as the daemon
//! that runs the respond stage does) and read them on a daemon; the
//! end-to-end tests let the offline provider write its answer word by word
//! (`[llm.offline] stream_pace_ms`).

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{TestDb, value};
use crate::support::{GENEROUS, count, wait_until};
use maas::llm::Delta;

/// One SSE event: its name (`message` when none), id and data.
#[derive(Debug, Clone)]
struct Event {
    name: String,
    id: Option<String>,
    data: String,
}

impl Event {
    fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }
}

/// Reads an SSE response event by event.
struct Sse {
    resp: reqwest::Response,
    buf: String,
}

impl Sse {
    async fn open(api: &Api, path: &str, last_event_id: Option<&str>) -> Sse {
        let mut rb = api.authed(api.http.get(api.url(path)));
        if let Some(id) = last_event_id {
            rb = rb.header("Last-Event-ID", id);
        }
        let resp = rb.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        Sse {
            resp,
            buf: String::new(),
        }
    }

    /// The next event; `None` when the stream ended.
    async fn next(&mut self) -> Option<Event> {
        let deadline = tokio::time::Instant::now() + GENEROUS;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let raw: String = self.buf.drain(..end + 2).collect();
                let mut event = Event {
                    name: "message".into(),
                    id: None,
                    data: String::new(),
                };
                let mut data = Vec::new();
                for line in raw.lines() {
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match field {
                        "event" => event.name = value.to_owned(),
                        "id" => event.id = Some(value.to_owned()),
                        "data" => data.push(value),
                        _ => {}
                    }
                }
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                event.data = data.join("\n");
                return Some(event);
            }
            let chunk = tokio::time::timeout_at(deadline, self.resp.chunk())
                .await
                .expect("an SSE chunk within the deadline")
                .ok()??;
            self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

/// What a client made of a request's stream: the answer it holds (text
/// since the last restart), the restarts it saw, every piece's id, and the
/// terminal state.
#[derive(Debug, Default)]
struct Seen {
    text: String,
    restarts: Vec<i64>,
    ids: Vec<String>,
    terminal: Option<Value>,
}

impl Seen {
    /// Takes one event; checks that what the client holds is always a
    /// prefix of nothing it was not sent (pieces only of the attempt it was
    /// last told about).
    fn take(&mut self, e: &Event) {
        let v = e.json();
        match e.name.as_str() {
            "delta" => {
                self.text.push_str(v["text"].as_str().unwrap());
                self.ids.push(e.id.clone().unwrap());
                if let Some(&attempt) = self.restarts.last() {
                    assert_eq!(v["attempt"].as_i64(), Some(attempt), "a piece of the attempt announced");
                }
            }
            "restart" => {
                self.text.clear();
                self.restarts.push(v["attempt"].as_i64().unwrap());
            }
            _ if v["status"] != "processing" => self.terminal = Some(v),
            _ => {}
        }
    }

    /// Reads `sse` to its end.
    async fn read_to_end(&mut self, sse: &mut Sse) {
        while let Some(e) = sse.next().await {
            self.take(&e);
        }
    }

    /// Reads `sse` until the text it holds is `text`.
    async fn read_until_text(&mut self, sse: &mut Sse, text: &str) {
        while self.text != text {
            let e = sse.next().await.expect("the stream goes on");
            self.take(&e);
        }
    }
}

/// A held request (not due for an hour) that asks to stream, inserted with
/// plain SQL as another application would.
async fn insert_streaming_held(c: &tokio_postgres::Client, user: Uuid) -> Uuid {
    value(
        c,
        "INSERT INTO pipeline_runs (user_id, user_query, run_after, stream)
         VALUES ($1, 'stream me', now() + interval '1 hour', true) RETURNING id",
        &[&user],
    )
    .await
}

/// A publisher of attempt `attempt` of `id`, as the daemon that runs the
/// respond stage starts it.
fn publisher(db: &TestDb, id: Uuid, attempt: i32) -> mpsc::UnboundedSender<Delta> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(maas::dispatcher::publish::publish(
        db.pool(),
        id,
        attempt,
        rx,
        maas::dispatcher::publish::BATCH_EVERY,
        None,
    ));
    tx
}

async fn rows_of(c: &tokio_postgres::Client, id: Uuid) -> i64 {
    value(c, "SELECT count(*) FROM answer_deltas WHERE request_id = $1", &[&id]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_pieces_reach_another_daemons_client_in_order_and_resume_after_a_reconnect() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default()).await;
    let user = Uuid::new_v4();
    let id = insert_streaming_held(&c, user).await;
    let path = format!("/api/query/{id}/events");

    // Pieces written by "another daemon" reach this daemon's clients, in
    // order: on the request's SSE stream and on its user's WebSocket.
    let mut sse = Sse::open(&api, &path, None).await;
    assert_eq!(sse.next().await.unwrap().json()["stage"], "NEW");
    let mut by_user = ws_open(&api, &format!("user_id={user}")).await;
    assert_eq!(ws_next(&mut by_user).await["stage"], "NEW");
    let one = publisher(&db, id, 1);
    let mut seen = Seen::default();
    for piece in ["Hello", ",", " wor", "ld"] {
        one.send(Delta::Text(piece.into())).unwrap();
    }
    seen.read_until_text(&mut sse, "Hello, world").await;
    assert_eq!(
        seen.ids.first().map(String::as_str),
        Some("1.1"),
        "the first piece goes at once"
    );
    let mut users_text = String::new();
    while users_text != "Hello, world" {
        let frame = ws_next(&mut by_user).await;
        assert_eq!(frame["event"], "delta", "{frame}");
        assert_eq!(frame["request_id"], id.to_string());
        users_text.push_str(frame["text"].as_str().unwrap());
    }
    let last_id = seen.ids.last().unwrap().clone();

    // A piece longer than a notification is read from the table.
    let long = "x".repeat(20_000);
    one.send(Delta::Text(long.clone())).unwrap();
    seen.read_until_text(&mut sse, &format!("Hello, world{long}")).await;
    let before_drop = seen.ids.last().unwrap().clone();
    drop(sse);

    // Missed while disconnected: read from the table on reconnect.
    one.send(Delta::Text(" again".into())).unwrap();
    wait_until(GENEROUS, "the piece is stored", || async {
        rows_of(&c, id).await == i64::try_from(seen.ids.len() + 1).unwrap()
    })
    .await;
    let mut again = Sse::open(&api, &path, Some(&before_drop)).await;
    assert_eq!(again.next().await.unwrap().json()["stage"], "NEW");
    let missed = again.next().await.unwrap();
    assert_eq!(
        (missed.name.as_str(), missed.json()["text"].as_str()),
        ("delta", Some(" again"))
    );

    // The WebSocket resumes the same way (`?after=`), with the same frames.
    let mut ws = ws_open(&api, &format!("request_id={id}&after={last_id}")).await;
    assert_eq!(ws_next(&mut ws).await["stage"], "NEW");
    let frame = ws_next(&mut ws).await;
    assert_eq!(
        (frame["event"].as_str(), frame["text"].as_str()),
        (Some("delta"), Some(long.as_str()))
    );
    assert_eq!(frame["request_id"], id.to_string());

    // A new attempt: an explicit restart, then only its pieces; a late
    // piece of the old attempt is never shown.
    let two = publisher(&db, id, 2);
    two.send(Delta::Text("Bye".into())).unwrap();
    let restart = again.next().await.unwrap();
    assert_eq!(
        (restart.name.as_str(), restart.json()["attempt"].as_i64()),
        ("restart", Some(2))
    );
    let bye = again.next().await.unwrap();
    assert_eq!(
        (bye.id.as_deref(), bye.json()["text"].as_str()),
        (Some("2.1"), Some("Bye"))
    );
    one.send(Delta::Text(" stale".into())).unwrap();
    two.send(Delta::Restart).unwrap();
    two.send(Delta::Text("Goodbye".into())).unwrap();
    let mut after_restart = Seen::default();
    after_restart.read_until_text(&mut again, "Goodbye").await;
    assert_eq!(after_restart.restarts, vec![2], "a restart inside the attempt");
    assert!(
        !after_restart.ids.iter().any(|i| i.starts_with("1.")),
        "{:?}",
        after_restart.ids
    );

    // The terminal state carries the whole answer and ends the stream.
    c.execute(
        "UPDATE pipeline_runs SET status = 'COMPLETED', final_answer = 'Goodbye' WHERE id = $1",
        &[&id],
    )
    .await
    .unwrap();
    after_restart.read_to_end(&mut again).await;
    assert_eq!(after_restart.terminal.unwrap()["answer"], "Goodbye");

    // The publishers delete their rows shortly after their attempt ended.
    drop((one, two));
    wait_until(GENEROUS, "the pieces are deleted", || async {
        rows_of(&c, id).await == 0
    })
    .await;
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws_open(api: &Api, query: &str) -> Ws {
    let req = format!("ws://{}/api/ws?{query}", api.addr)
        .into_client_request()
        .unwrap();
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

async fn ws_next(ws: &mut Ws) -> Value {
    use futures_util::StreamExt;
    loop {
        let msg = tokio::time::timeout(GENEROUS, ws.next()).await.expect("a message");
        match msg {
            Some(Ok(Message::Text(t))) => return serde_json::from_str(t.as_str()).unwrap(),
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => panic!("the socket closed"),
            Some(Ok(_)) => continue,
        }
    }
}

/// A query long enough that the offline answer, written word by word at
/// `PACE_MS`, takes seconds.
fn long_query() -> String {
    (1..=60).map(|n| format!("word{n}")).collect::<Vec<_>>().join(" ")
}

const PACE_MS: u64 = 100;

fn streaming_daemon(lease_secs: u64) -> Opts {
    Opts {
        lease_secs,
        sweep_secs: 1,
        ..Opts::default()
    }
    .env("MAAS_LLM__OFFLINE__STREAM_PACE_MS", PACE_MS)
}

/// Inserts a request that asks to stream and waits until a daemon writes
/// its answer (RESPONDING, with a first piece stored).
async fn streaming_request_underway(c: &tokio_postgres::Client) -> Uuid {
    let id: Uuid = value(
        c,
        "INSERT INTO pipeline_runs (user_id, user_query, stream) VALUES (gen_random_uuid(), $1, true) RETURNING id",
        &[&long_query()],
    )
    .await;
    wait_until(GENEROUS, "the answer is being written", || async {
        rows_of(c, id).await > 0
    })
    .await;
    id
}

/// A responder daemon writing a streamed answer, and a client's SSE stream
/// of it on a daemon started meanwhile (it joins mid-answer and is shown
/// the pieces written before it joined too); leases of `lease_secs`.
async fn answer_underway_on_another_daemon(
    db: &TestDb,
    c: &tokio_postgres::Client,
    lease_secs: u64,
) -> (Maasd, Uuid, Api, Sse) {
    let mut responder = Maasd::spawn(&db.url, streaming_daemon(lease_secs));
    responder.http_addr(GENEROUS).await;
    let id = streaming_request_underway(c).await;
    let api = Api::start(db, streaming_daemon(lease_secs)).await;
    let sse = Sse::open(&api, &format!("/api/query/{id}/events"), None).await;
    (responder, id, api, sse)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_an_answer_written_on_one_daemon_streams_to_a_client_of_another() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (responder, id, _api, mut sse) = answer_underway_on_another_daemon(&db, &c, 30).await;
    let mut seen = Seen::default();
    seen.read_to_end(&mut sse).await;
    let terminal = seen.terminal.clone().expect("a terminal state");
    assert_eq!(terminal["status"], "completed", "{terminal}");
    assert!(seen.ids.len() > 1, "the answer came in pieces: {seen:?}");
    assert_eq!(
        seen.text,
        terminal["answer"].as_str().unwrap(),
        "the pieces make the answer"
    );
    let worker: String = value(
        &c,
        "SELECT worker FROM pipeline_steps WHERE run_id = $1 AND stage = 'respond' AND outcome = 'succeeded'",
        &[&id],
    )
    .await;
    assert_eq!(
        worker.split(':').nth(1),
        Some(responder.pid().to_string().as_str()),
        "the other daemon wrote the answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_a_responder_killed_mid_answer_shows_a_restart_and_one_answer() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (mut responder, id, _api, mut sse) = answer_underway_on_another_daemon(&db, &c, 3).await;
    let mut seen = Seen::default();
    while seen.ids.is_empty() {
        let e = sse.next().await.expect("the stream goes on");
        seen.take(&e);
    }
    responder.kill();
    // The lease runs out; the client's daemon answers in a new attempt.
    seen.read_to_end(&mut sse).await;
    let terminal = seen.terminal.clone().expect("a terminal state");
    assert_eq!(terminal["status"], "completed", "{terminal}");
    assert_eq!(seen.restarts.len(), 1, "one explicit restart: {seen:?}");
    assert!(seen.restarts[0] >= 2, "the restart names the new attempt: {seen:?}");
    assert_eq!(
        seen.text,
        terminal["answer"].as_str().unwrap(),
        "the new attempt's pieces make the answer"
    );
    let answers = count(
        &c,
        &format!("SELECT count(*) FROM raw_logs WHERE request_id = '{id}' AND message_type = 'assistant_response'"),
    )
    .await;
    assert_eq!(answers, 1, "one assistant turn, from the attempt that won");
    let stored: String = value(&c, "SELECT final_answer FROM pipeline_runs WHERE id = $1", &[&id]).await;
    assert_eq!(stored, seen.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_submit_with_stream_true_answers_in_openai_chunks() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, streaming_daemon(30)).await;
    let user = Uuid::new_v4();
    let resp = api
        .authed(api.http.post(api.url("/api/query")))
        .header("Accept", "text/event-stream")
        .json(&json!({ "user_id": user, "query": long_query(), "stream": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let location = resp.headers()["location"].to_str().unwrap().to_owned();
    let mut sse = Sse {
        resp,
        buf: String::new(),
    };
    let (mut text, mut chunks, mut finish, mut done) = (String::new(), 0, None, false);
    while let Some(e) = sse.next().await {
        if e.data == "[DONE]" {
            done = true;
            continue;
        }
        let v = e.json();
        assert_eq!(v["object"], "chat.completion.chunk", "{v}");
        let choice = &v["choices"][0];
        if chunks == 0 {
            assert_eq!(choice["delta"]["role"], "assistant");
        }
        chunks += 1;
        text.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
    }
    assert!(done, "the stream ends with data: [DONE]");
    assert_eq!(finish.as_deref(), Some("stop"));
    let status: Value = api.get(&location).await.json().await.unwrap();
    assert_eq!(status["status"], "completed");
    assert_eq!(text, status["answer"].as_str().unwrap(), "the chunks make the answer");
    assert!(chunks > 3, "the answer came in pieces ({chunks} chunks)");

    // Without Accept: text/event-stream the submit answers 202 as ever; a
    // request that does not ask to stream stores nothing for it.
    let id = api
        .submit_accepted(&json!({ "user_id": user, "query": "q", "stream": true }))
        .await;
    let plain = api.submit_accepted(&json!({ "user_id": user, "query": "q" })).await;
    let streams: Vec<bool> = crate::support::db::column(
        &c,
        "SELECT stream FROM pipeline_runs WHERE id = ANY($1) ORDER BY id = $2 DESC",
        &[&vec![id, plain], &id],
    )
    .await;
    assert_eq!(streams, vec![true, false]);
    let refused = api
        .submit(&json!({ "user_id": user, "query": "q", "stream": "yes" }))
        .await;
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    crate::support::wait_all_terminal(&c, GENEROUS).await;
    assert_eq!(
        count(
            &c,
            &format!("SELECT count(*) FROM answer_deltas WHERE request_id = '{plain}'")
        )
        .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_the_console_shows_a_running_answer_as_it_grows() {
    let Some(b) = crate::support::browser::Browser::start().await else {
        return;
    };
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, streaming_daemon(30)).await;
    let id = streaming_request_underway(&c).await;
    b.goto_live(&api.url(&format!("/console/requests/{id}"))).await;
    b.mark().await;
    b.wait_js(
        "the page shows the answer being written",
        "return document.querySelector('#answer-live').textContent.length > 0;",
    )
    .await;
    let early = b.js("return document.querySelector('#answer-live').textContent;").await;
    let early = early.as_str().unwrap().to_owned();
    b.wait_js(
        "the answer grows without a reload",
        &format!(
            "return document.querySelector('#answer-live').textContent.length > {} || !!document.querySelector('#answer');",
            early.len()
        ),
    )
    .await;
    b.screenshot("request-streaming").await;
    b.wait_js(
        "the page shows the stored answer once finished",
        "return !!document.querySelector('#answer') && document.querySelector('#live-answer').hidden;",
    )
    .await;
    assert!(b.same_page().await, "no reload");
    let stored: String = value(&c, "SELECT final_answer FROM pipeline_runs WHERE id = $1", &[&id]).await;
    assert!(
        stored.starts_with(&early),
        "what the page showed is a prefix of the answer"
    );
    assert_eq!(b.text("#answer").await.trim(), stored.trim());
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_follows_only_the_tenants_own_requests() {
    use crate::support::tenants;
    let db = TestDb::new().await;
    let (api, toks) = tenants::with_tenants(&db, Opts::default(), &["north", "south"]).await;
    let (north, south) = (&toks[0], &toks[1]);
    let (status, body, _) = tenants::submit(
        &api,
        north,
        json!({ "user_id": Uuid::new_v4(), "query": "mine", "stream": true }),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["request_id"].as_str().unwrap();
    let events = format!("/api/query/{id}/events");
    let resumed = |tok: &str| {
        api.http
            .get(api.url(&events))
            .bearer_auth(tok)
            .header("Last-Event-ID", "1.0")
    };
    let theirs = resumed(south).send().await.unwrap();
    assert_eq!(
        theirs.status(),
        StatusCode::NOT_FOUND,
        "another tenant's request reads as absent"
    );
    let mine = resumed(north).send().await.unwrap();
    assert_eq!(mine.status(), StatusCode::OK);
    let bad = api
        .http
        .get(api.url(&events))
        .bearer_auth(north)
        .header("Last-Event-ID", "soon")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let streamed = api
        .http
        .post(api.url("/api/query"))
        .bearer_auth(south)
        .header("Accept", "text/event-stream")
        .json(&json!({ "user_id": Uuid::new_v4(), "query": "theirs", "stream": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), StatusCode::OK);
    assert_eq!(streamed.headers()["content-type"], "text/event-stream");
}
