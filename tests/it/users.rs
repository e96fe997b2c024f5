//! A user's data: see it, correct it, forget it — over HTTP
//! and `maasctl users`, against real daemons and real PostgreSQL.

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::cli::{NO_ENV, maasctl_async, tokio_command};
use crate::support::daemon::Opts;
use crate::support::db::{TestDb, by_name, rows};
use crate::support::{GENEROUS, count, wait_until};

const TOKEN: &str = "users-token";

/// A daemon with the offline provider, the archivist schedule off, and a
/// bearer token; `latency_ms` slows every model call.
async fn start(db: &TestDb, latency_ms: u64) -> Api {
    let mut api = Api::start(
        db,
        Opts::default()
            .env("MAAS_ARCHIVIST__ENABLED", "false")
            .env("MAAS_API_TOKENS", TOKEN)
            .env("MAAS_MEMORY__RECORDS", 3)
            .env("MAAS_LLM__OFFLINE__LATENCY_MS", latency_ms),
    )
    .await;
    api.token = Some(TOKEN.to_owned());
    api
}

impl Api {
    async fn send(&self, rb: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let resp = self.authed(rb).send().await.unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.http.get(self.url(path))).await
    }

    async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.http.delete(self.url(path))).await
    }

    /// Submits a query: the answer's status and body.
    async fn submit_json(&self, user: Uuid, query: &str) -> (StatusCode, Value) {
        self.send(
            self.http
                .post(self.url("/api/query"))
                .json(&json!({ "user_id": user, "query": query })),
        )
        .await
    }

    /// Submits a query; returns the request id.
    async fn submit_for(&self, user: Uuid, query: &str) -> Uuid {
        let (status, body) = self.submit_json(user, query).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        body["request_id"].as_str().unwrap().parse().unwrap()
    }

    /// Submits and follows the request to its end; returns its context.
    async fn ask_context(&self, user: Uuid, query: &str) -> (String, Vec<Value>) {
        let id = self.submit_for(user, query).await;
        let (_, state) = self
            .get_json(&format!("/api/query/{id}/status?wait=60s&include=context"))
            .await;
        assert_eq!(state["status"], "completed", "{state}");
        (
            state["context"].as_str().unwrap_or_default().to_owned(),
            state["context_sources"].as_array().cloned().unwrap_or_default(),
        )
    }
}

async fn add_record(c: &Client, user: Uuid, days_ago: i32, tags: &[&str], summary: &str, turns: &[i64]) -> i64 {
    let tags: Vec<String> = tags.iter().map(|t| (*t).to_owned()).collect();
    c.query_one(
        "INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, tags, summary, raw_log_ids)
         VALUES ($1, now() - make_interval(days => $2 + 1), now() - make_interval(days => $2), $3, $4, $5)
         RETURNING id",
        &[&user, &days_ago, &tags, &summary, &turns],
    )
    .await
    .unwrap()
    .get(0)
}

async fn add_turn(c: &Client, user: Uuid, content: &str) -> i64 {
    c.query_one(
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content) VALUES ($1, gen_random_uuid(), 'user_query', $2) RETURNING id",
        &[&user, &content],
    )
    .await
    .unwrap()
    .get(0)
}

/// Rows of any table but the tombstones that mention `user` anywhere.
async fn traces_of(c: &Client, user: Uuid) -> Vec<(String, i64)> {
    let tables: Vec<String> = c
        .query(
            "SELECT table_name::text FROM information_schema.tables
             WHERE table_schema = 'public' AND table_type = 'BASE TABLE' AND table_name <> 'forgotten_users'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut found = Vec::new();
    for t in tables {
        let n: i64 = c
            .query_one(
                &format!("SELECT count(*) FROM {t} x WHERE x::text LIKE '%' || $1 || '%'"),
                &[&user.to_string()],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            found.push((t, n));
        }
    }
    found
}

/// One user's memory as the listing tests find it: three records (the
/// oldest covering two archived turns) and one pending turn; another user
/// has a turn and a record that must never show.
struct Remembered {
    user: Uuid,
    t1: i64,
    pending: i64,
    r1: i64,
    r2: i64,
    r3: i64,
}

/// Writes [`Remembered`]'s rows, and the other user's.
async fn remembered(c: &Client) -> Remembered {
    let (user, other) = (Uuid::new_v4(), Uuid::new_v4());
    let t1 = add_turn(c, user, "I adopted a greyhound called Comet").await;
    let t2 = add_turn(c, user, "Comet loves the beach").await;
    let pending = add_turn(c, user, "Tomorrow I start learning the cello").await;
    // The first two turns are archived into the oldest record.
    c.execute("UPDATE archive_marks SET archived_seq = 2 WHERE user_id = $1", &[&user])
        .await
        .unwrap();
    let r1 = add_record(
        c,
        user,
        30,
        &["dog"],
        "The user adopted a greyhound named Comet",
        &[t1, t2],
    )
    .await;
    let r2 = add_record(c, user, 20, &["travel"], "The user planned a trip to Porto", &[]).await;
    let r3 = add_record(c, user, 10, &["work"], "The user changed jobs to a bakery", &[]).await;
    add_turn(c, other, "OTHER-USER greyhound secret").await;
    add_record(c, other, 5, &["dog"], "OTHER-USER has a greyhound too", &[]).await;
    Remembered {
        user,
        t1,
        pending,
        r1,
        r2,
        r3,
    }
}

/// Two keyset pages, newest first, with the pending turns; returns the
/// first page.
async fn assert_memory_pages(api: &Api, m: &Remembered) -> Value {
    let user = m.user;
    let (status, page) = api.get_json(&format!("/api/users/{user}/memory?limit=2")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let ids: Vec<i64> = page["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, vec![m.r3, m.r2], "newest first");
    assert_eq!(page["next_before"], json!(m.r2));
    assert_eq!(page["pending"], json!(1));
    assert_eq!(page["pending_turns"].as_array().unwrap().len(), 1);
    assert_eq!(page["pending_turns"][0]["id"], json!(m.pending));
    let (_, page2) = api
        .get_json(&format!(
            "/api/users/{user}/memory?limit=2&before={}",
            page["next_before"]
        ))
        .await;
    let last = &page2["records"][0];
    assert_eq!(last["id"], json!(m.r1));
    assert_eq!(last["turns"], json!(2));
    assert_eq!(last["tags"], json!(["dog"]));
    assert!(last["time_bucket_start"].is_string() && last["time_bucket_end"].is_string());
    assert_eq!(page2["next_before"], Value::Null);
    assert!(!page2.to_string().contains("OTHER-USER"));
    page
}

/// Search: the pipeline's retrieval, with scores, this user's only.
async fn assert_memory_search(api: &Api, m: &Remembered) {
    let (status, found) = api.get_json(&format!("/api/users/{}/memory?q=greyhound", m.user)).await;
    assert_eq!(status, StatusCode::OK, "{found}");
    let hits = found["hits"].as_array().unwrap();
    assert!(
        hits.iter().any(|h| h["kind"] == "record" && h["id"] == json!(m.r1)),
        "{found}"
    );
    assert!(
        hits.iter().any(|h| h["kind"] == "turn" && h["id"] == json!(m.t1)),
        "{found}"
    );
    assert!(hits.iter().all(|h| h["score"].as_f64().is_some()), "{found}");
    assert!(hits.iter().any(|h| h["score"].as_f64().unwrap_or(0.0) > 0.0), "{found}");
    assert!(!found.to_string().contains("OTHER-USER"), "{found}");
}

/// Unknown user, malformed id, no token.
async fn assert_memory_refusals(api: &Api, user: Uuid) {
    let (status, body) = api.get_json(&format!("/api/users/{}/memory", Uuid::new_v4())).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "unknown_user");
    assert_eq!(body["memory_version"], json!(0));
    assert_eq!(api.get_json("/api/users/nope/memory").await.0, StatusCode::BAD_REQUEST);
    let bare = api
        .http
        .get(api.url(&format!("/api/users/{user}/memory")))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), StatusCode::UNAUTHORIZED);
}

/// `maasctl users show` prints what the API's first `page` holds, searches
/// the same way and refuses an unknown user.
async fn assert_maasctl_shows_the_same(url: &str, m: &Remembered, page: &Value) {
    let user = m.user.to_string();
    let (code, out, err) = maasctl_async(url, &["users", "show", &user], NO_ENV).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("The user adopted a greyhound named Comet"), "{out}");
    assert!(out.contains("2 turns"), "{out}");
    assert!(out.contains("Tomorrow I start learning the cello"), "{out}");
    let (code, out, _) = maasctl_async(url, &["--json", "users", "show", &user, "--limit", "2"], NO_ENV).await;
    assert_eq!(code, 0);
    let cli: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(cli["records"], page["records"]);
    let (code, out, _) = maasctl_async(
        url,
        &["users", "show", &user, "--q", "greyhound"],
        &[("MAAS_MEMORY__RECORDS", "3")],
    )
    .await;
    assert_eq!(code, 0);
    assert!(out.contains("record") && out.contains(&m.r1.to_string()), "{out}");
    let (code, _, err) = maasctl_async(url, &["users", "show", &Uuid::new_v4().to_string()], NO_ENV).await;
    assert_eq!(code, 1);
    assert!(err.contains("nothing is held"), "{err}");
}

/// See: the records newest first in keyset pages with their period, tags,
/// summary and turn counts, the pending turns, a search with scores; the
/// same from `maasctl users show`; 404 for an unknown user, 401 without
/// the token, never another user's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_memory_lists_pages_and_searches_one_users_memory() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let m = remembered(&c).await;
    let api = start(&db, 0).await;
    let page = assert_memory_pages(&api, &m).await;
    assert_memory_search(&api, &m).await;
    assert_memory_refusals(&api, m.user).await;
    assert_maasctl_shows_the_same(&db.url, &m, &page).await;
}

/// The memory version of `user` as the API shows it.
async fn memory_version(api: &Api, user: Uuid) -> i64 {
    let (_, memory) = api.get_json(&format!("/api/users/{user}/memory")).await;
    memory["memory_version"].as_i64().unwrap()
}

/// Deleting record `cat` (which the first context names): another user
/// cannot reach it, the user deletes it once, and the next context no
/// longer holds it.
async fn assert_deleting_a_record_changes_the_context(api: &Api, user: Uuid, cat: i64, v0: i64) {
    let (status, _) = api.delete(&format!("/api/users/{}/memory/{cat}", Uuid::new_v4())).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = api
        .delete(&format!(
            "/api/users/{user}/memory/{cat}?reason=asked%20by%20the%20user&actor=support"
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["memory_version"], json!(v0 + 1));
    let (status, _) = api.delete(&format!("/api/users/{user}/memory/{cat}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "deleted once");

    let (context, sources) = api.ask_context(user, "What is my cat called?").await;
    assert!(!context.contains("The user's cat is named Zebrafish"), "{context}");
    assert!(
        !sources.iter().any(|s| s["kind"] == "record" && s["id"] == json!(cat)),
        "{sources:?}"
    );
}

/// Replacing the summary of record `keep`: the next context has the new text.
async fn assert_replacing_a_summary_changes_the_context(api: &Api, user: Uuid, keep: i64, v0: i64) {
    let (status, body) = api
        .send(
            api.http
                .put(api.url(&format!("/api/users/{user}/memory/{keep}")))
                .json(&json!({ "summary": "The user grows peppers on the balcony", "reason": "correction" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["memory_version"], json!(v0 + 2));
    let (context, _) = api.ask_context(user, "What do I grow on the balcony?").await;
    assert!(context.contains("The user grows peppers on the balcony"), "{context}");
    assert!(!context.contains("tomatoes"), "{context}");
}

/// Deleting `turn`: gone from the turns and from the record covering it
/// (added here); returns that record.
async fn assert_deleting_a_turn_leaves_no_trace(api: &Api, c: &Client, user: Uuid, turn: i64, v0: i64) -> i64 {
    let covering = add_record(c, user, 1, &["cat"], "cat again", &[turn]).await;
    let (status, body) = api.delete(&format!("/api/users/{user}/turns/{turn}?reason=typo")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["memory_version"], json!(v0 + 3));
    assert_eq!(
        count(c, &format!("SELECT count(*) FROM raw_logs WHERE id = {turn}")).await,
        0
    );
    assert_eq!(
        count(
            c,
            &format!("SELECT cardinality(raw_log_ids)::bigint FROM lsm_storage WHERE id = {covering}")
        )
        .await,
        0
    );
    covering
}

/// The audit trail of the three corrections: who, why, which rows — never
/// the removed text; and the mark's memory version moved three times.
async fn assert_corrections_audited(c: &Client, user: Uuid, cat: i64, covering: i64, v0: i64) {
    let actions: Vec<(String, String, Option<String>, Value)> = rows(
        c,
        "SELECT action, actor, reason, detail FROM operator_actions
         WHERE detail ->> 'user_id' = $1 ORDER BY id",
        &[&user.to_string()],
        |r| by_name!(r, "action", "actor", "reason", "detail"),
    )
    .await;
    let names: Vec<&str> = actions.iter().map(|a| a.0.as_str()).collect();
    assert_eq!(
        names,
        ["memory_delete_record", "memory_replace_summary", "memory_delete_turn"]
    );
    assert_eq!(actions[0].1, "http:support");
    assert_eq!(actions[0].2.as_deref(), Some("asked by the user"));
    assert_eq!(actions[0].3["record_id"], json!(cat));
    assert_eq!(actions[2].3["records"], json!([covering]));
    assert!(!format!("{actions:?}").contains("Zebrafish"));
    let mark_version = count(
        c,
        &format!("SELECT memory_version FROM archive_marks WHERE user_id = '{user}'"),
    )
    .await;
    assert_eq!(mark_version, v0 + 3);
}

/// Correct: deleting a record changes the next request's context (its
/// provenance no longer names it), replacing a summary shows the new text,
/// deleting a turn takes it out of the records; each bumps the memory
/// version and lands in the audit trail with who and why. Another user's
/// record is not found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn correcting_memory_changes_the_next_context_and_is_audited() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let turn = add_turn(&c, user, "my cat is called Zebrafish").await;
    let cat = add_record(&c, user, 3, &["cat"], "The user's cat is named Zebrafish", &[turn]).await;
    let keep = add_record(&c, user, 2, &["garden"], "The user grows tomatoes in the garden", &[]).await;
    let api = start(&db, 0).await;

    let (context, sources) = api.ask_context(user, "What is my cat called?").await;
    assert!(context.contains("The user's cat is named Zebrafish"), "{context}");
    assert!(
        sources.iter().any(|s| s["kind"] == "record" && s["id"] == json!(cat)),
        "{sources:?}"
    );
    let v0 = memory_version(&api, user).await;
    assert_deleting_a_record_changes_the_context(&api, user, cat, v0).await;
    assert_replacing_a_summary_changes_the_context(&api, user, keep, v0).await;
    let covering = assert_deleting_a_turn_leaves_no_trace(&api, &c, user, turn, v0).await;
    assert_corrections_audited(&c, user, cat, covering, v0).await;
}

/// `user` with 200 turns in one thread, and `other` with a turn and a record.
async fn a_user_and_a_bystander(c: &Client) -> (Uuid, Uuid) {
    let (user, other) = (Uuid::new_v4(), Uuid::new_v4());
    c.execute(
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content)
         SELECT $1, $2, 'user_query', 'turn number ' || g FROM generate_series(1, 200) g",
        &[&user, &Uuid::new_v4()],
    )
    .await
    .unwrap();
    add_turn(c, other, "the other user's turn").await;
    add_record(c, other, 1, &["other"], "the other user's record", &[]).await;
    (user, other)
}

/// A `maasctl archivist run` over `user` whose model calls take 0.8 s (it
/// commits a record per batch of 20 turns), waited for until it committed
/// its first record while the user's requests are in flight.
async fn archiving_while_in_flight(url: &str, c: &Client, user: Uuid) -> tokio::process::Child {
    let env = [
        ("MAAS_LLM__OFFLINE__LATENCY_MS", "800".to_owned()),
        ("MAAS_ARCHIVIST__BATCH_LOGS", "20".to_owned()),
    ];
    let archivist = tokio_command(url, &["archivist", "run", "--user", &user.to_string()], &env)
        .spawn()
        .unwrap();
    let leased = format!("SELECT count(*) FROM pipeline_runs WHERE user_id = '{user}' AND lease_owner IS NOT NULL");
    let recorded = format!("SELECT count(*) FROM lsm_storage WHERE user_id = '{user}'");
    wait_until(
        GENEROUS,
        "requests in flight and the archive run past its first record",
        || async { count(c, &leased).await > 0 && count(c, &recorded).await > 0 },
    )
    .await;
    archivist
}

/// A producer transaction that logged a turn of `user` and is still open.
async fn open_producer(db: &TestDb, user: Uuid) -> Client {
    let producer = db.client().await;
    producer
        .batch_execute(&format!(
            "BEGIN; INSERT INTO raw_logs (user_id, message_type, content) VALUES ('{user}', 'user_query', 'late producer')"
        ))
        .await
        .unwrap();
    producer
}

/// Starts the erase of `user` over HTTP; while it runs, a second forget and
/// the memory are 409 and a request submitted is refused, whatever the
/// order in which it and the `producer`'s commit reach the database (the
/// erase waits for that transaction, then deletes its turn).
async fn forget_while_a_producer_commits(api: &Api, user: Uuid, producer: Client) {
    let (status, body) = api.delete(&format!("/api/users/{user}?reason=erasure%20request")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (status, body) = api.delete(&format!("/api/users/{user}")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "erase_running");
    let (status, _) = api.get_json(&format!("/api/users/{user}/memory")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (raced, ()) = tokio::join!(api.submit_json(user, "racing the erase"), async {
        producer.batch_execute("COMMIT").await.unwrap()
    });
    assert_eq!(raced.0, StatusCode::GONE, "{}", raced.1);
}

/// The tombstone of `user`: by whom, why, finished, and what it erased.
async fn assert_tombstone(c: &Client, user: Uuid) {
    let tomb = c
        .query_one(
            "SELECT actor, reason, finished_at IS NOT NULL AS done, erased FROM forgotten_users WHERE user_id = $1",
            &[&user],
        )
        .await
        .unwrap();
    assert_eq!(tomb.get::<_, String>("actor"), "http");
    assert_eq!(
        tomb.get::<_, Option<String>>("reason").as_deref(),
        Some("erasure request")
    );
    assert!(tomb.get::<_, bool>("done"));
    let erased: Value = tomb.get("erased");
    assert_eq!(erased["requests"], json!(6), "{erased}");
    assert!(erased["turns"].as_i64().unwrap() >= 201, "{erased}");
    assert!(erased["records"].as_i64().unwrap() >= 1, "{erased}");
    println!("erased: {erased}");
}

/// Late writes for the forgotten `user`: a request is refused, a turn or
/// record is dropped (and counted).
async fn assert_late_writes_change_nothing(api: &Api, c: &Client, user: Uuid) {
    let (status, body) = api.submit_json(user, "hello again").await;
    assert_eq!(status, StatusCode::GONE, "{body}");
    let err = c
        .execute(
            "INSERT INTO pipeline_runs (user_id, user_query) VALUES ($1, 'psql')",
            &[&user],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|s| s.code()), Some("MA410"), "{err}");
    let inserted = c
        .execute(
            "INSERT INTO raw_logs (user_id, message_type, content) VALUES ($1, 'user_query', 'late turn')",
            &[&user],
        )
        .await
        .unwrap();
    assert_eq!(inserted, 0, "the late turn is dropped");
    assert!(traces_of(c, user).await.is_empty());
    assert!(
        count(
            c,
            &format!("SELECT dropped_writes FROM forgotten_users WHERE user_id = '{user}'")
        )
        .await
            >= 1
    );
}

/// Forget: while the user's requests are in flight and an archivist run
/// over the user is going, `DELETE /api/users/{id}` erases everything;
/// 409 while it runs; afterwards no table but the tombstone mentions the
/// user, late results and late writes change nothing, a new request for
/// the user is refused, and another user is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgetting_a_user_mid_flight_and_mid_archive_leaves_only_the_tombstone() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (user, other) = a_user_and_a_bystander(&c).await;
    // The daemon's model calls take 4 s: its requests stay in flight.
    let api = start(&db, 4000).await;
    for i in 0..6 {
        api.submit_for(user, &format!("question {i} about my turns")).await;
    }
    let mut archivist = archiving_while_in_flight(&db.url, &c, user).await;
    let producer = open_producer(&db, user).await;
    forget_while_a_producer_commits(&api, user, producer).await;

    wait_until(GENEROUS, "the erase finishes", || async {
        api.get_json(&format!("/api/users/{user}/memory")).await.1["code"] == "user_forgotten"
    })
    .await;
    let _ = archivist.wait().await;
    // A request of the other user, submitted now, takes two model calls:
    // by its end every stage of the forgotten user that was running when
    // the erase finished has ended too, and its result was discarded.
    let (_, _) = api.ask_context(other, "anything new?").await;

    let traces = traces_of(&c, user).await;
    assert!(traces.is_empty(), "left behind: {traces:?}");
    assert_tombstone(&c, user).await;
    assert_late_writes_change_nothing(&api, &c, user).await;

    // The other user is untouched.
    assert_eq!(
        count(
            &c,
            &format!("SELECT count(*) FROM lsm_storage WHERE user_id = '{other}'")
        )
        .await,
        1
    );
    assert!(count(&c, &format!("SELECT count(*) FROM raw_logs WHERE user_id = '{other}'")).await >= 3);
}

/// `maasctl users forget` erases in the foreground and says what it
/// deleted; a second forget is refused, as is an unknown user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maasctl_users_forget_erases_and_leaves_the_tombstone() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    for i in 0..3 {
        c.execute(
            "INSERT INTO pipeline_runs (user_id, user_query) VALUES ($1, $2)",
            &[&user, &format!("query {i}")],
        )
        .await
        .unwrap();
    }
    add_record(&c, user, 1, &["x"], "a record", &[]).await;
    let id = user.to_string();
    let (code, out, err) = maasctl_async(&db.url, &["users", "forget", &id, "--reason", "GDPR art. 17"], NO_ENV).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("3 requests") && out.contains("3 turns") && out.contains("1 records"),
        "{out}"
    );
    assert!(traces_of(&c, user).await.is_empty());
    let (actor, reason): (String, String) = {
        let r = c
            .query_one("SELECT actor, reason FROM forgotten_users WHERE user_id = $1", &[&user])
            .await
            .unwrap();
        by_name!(r, "actor", "reason")
    };
    assert_eq!((actor.as_str(), reason.as_str()), ("night-shift", "GDPR art. 17"));
    let (code, _, err) = maasctl_async(&db.url, &["users", "forget", &id, "--reason", "again"], NO_ENV).await;
    assert_eq!(code, 1);
    assert!(err.contains("was forgotten"), "{err}");
    let (code, _, err) = maasctl_async(&db.url, &["users", "show", &id], NO_ENV).await;
    assert_eq!(code, 1);
    assert!(err.contains("was forgotten"), "{err}");
    let (code, _, _) = maasctl_async(
        &db.url,
        &["users", "forget", &Uuid::new_v4().to_string(), "--reason", "x"],
        NO_ENV,
    )
    .await;
    assert_eq!(code, 1);
}

/// Resident and peak resident memory of a process, in KiB (from /proc).
fn rss_kib(pid: i32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A user with 10,000 turns and 40 records, served by a daemon that then
/// answered three of the user's requests.
async fn a_user_with_ten_thousand_turns(db: &TestDb, c: &Client) -> (Uuid, Api) {
    let user = Uuid::new_v4();
    c.execute(
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content)
         SELECT $1, NULL, 'user_query', 'turn ' || g || ' ' || repeat('lorem ipsum dolor sit amet ', 8)
         FROM generate_series(1, 10000) g",
        &[&user],
    )
    .await
    .unwrap();
    for i in 0..40 {
        add_record(c, user, 40 - i, &["t"], &format!("record {i}"), &[i64::from(i) + 1]).await;
    }
    let api = start(db, 0).await;
    for i in 0..3 {
        api.ask_context(user, &format!("question {i}")).await;
    }
    (user, api)
}

/// Streams the export of `user` over HTTP and parses it; logs the daemon's
/// memory while it streams.
async fn stream_export(api: &Api, user: Uuid) -> Value {
    let pid = api.d.pid().as_raw();
    let (rss_before, _) = rss_kib(pid);
    let mut resp = api
        .authed(api.http.get(api.url(&format!("/api/users/{user}/export"))))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let mut body = Vec::new();
    let (mut chunks, mut rss_max) = (0, 0);
    while let Some(chunk) = resp.chunk().await.unwrap() {
        body.extend_from_slice(&chunk);
        chunks += 1;
        rss_max = rss_max.max(rss_kib(pid).0);
    }
    let (rss_after, hwm) = rss_kib(pid);
    println!(
        "export: {} bytes in {chunks} chunks; maasd RSS before {rss_before} KiB, max while streaming {rss_max} KiB, after {rss_after} KiB, peak (VmHWM) {hwm} KiB",
        body.len()
    );
    serde_json::from_slice(&body).unwrap()
}

/// The exported `doc` of `user` counts what the tables hold: every turn
/// once in the user's order, the records, the requests with their steps.
async fn assert_export_matches_the_tables(c: &Client, user: Uuid, doc: &Value) {
    let turns = count(c, &format!("SELECT count(*) FROM raw_logs WHERE user_id = '{user}'")).await;
    let steps = count(
        c,
        &format!(
            "SELECT count(*) FROM pipeline_steps s JOIN pipeline_runs r ON r.id = s.run_id WHERE r.user_id = '{user}'"
        ),
    )
    .await;
    assert_eq!(turns, 10_006);
    assert_eq!(i64::try_from(doc["turns"].as_array().unwrap().len()).unwrap(), turns);
    assert_eq!(doc["records"].as_array().unwrap().len(), 40);
    let requests = doc["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 3);
    let exported_steps: usize = requests.iter().map(|r| r["steps"].as_array().unwrap().len()).sum();
    assert_eq!(i64::try_from(exported_steps).unwrap(), steps);
    assert!(steps >= 6, "{steps}");
    assert!(requests.iter().all(|r| r["final_answer"].is_string()));
    assert_eq!(doc["counts"]["turns"], json!(turns));
    assert_eq!(doc["archive_state"]["logged_seq"], json!(turns));
    // Turns in the user's order, each once.
    let seqs: Vec<i64> = doc["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["user_seq"].as_i64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
}

/// Export: a user with 10,000 turns streams as one JSON document whose
/// counts match the tables (HTTP and `maasctl users export`); the daemon's
/// memory is logged, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exporting_a_user_with_ten_thousand_turns_streams_one_document() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (user, api) = a_user_with_ten_thousand_turns(&db, &c).await;
    let doc = stream_export(&api, user).await;
    assert_export_matches_the_tables(&c, user, &doc).await;

    // maasctl writes the same document to stdout.
    let out = tokio_command(&db.url, &["users", "export", &user.to_string()], NO_ENV)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli["counts"], doc["counts"]);
    assert_eq!(cli["turns"], doc["turns"]);

    let (status, body) = api.get_json(&format!("/api/users/{}/export", Uuid::new_v4())).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

/// Memory retention (off by default): turns older than
/// `retention.logs_keep_days` and records whose period ended more than
/// `retention.memory_keep_days` ago are deleted in batches, the rest stay,
/// and the users' memory versions move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_retention_deletes_old_turns_and_records_in_batches() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    c.execute(
        "INSERT INTO raw_logs (user_id, message_type, content, created_at)
         SELECT $1, 'user_query', 'old turn ' || g, now() - interval '40 days' FROM generate_series(1, 25) g",
        &[&user],
    )
    .await
    .unwrap();
    for i in 0..3 {
        add_turn(&c, user, &format!("recent turn {i}")).await;
    }
    for i in 0..5 {
        add_record(&c, user, 100 + i, &["old"], "old record", &[]).await;
    }
    for i in 0..2 {
        add_record(&c, user, 10 + i, &["recent"], "recent record", &[]).await;
    }
    let q = |sql: &str| sql.replace("$U", &user.to_string());
    let _d = crate::support::daemon::Maasd::spawn(
        &db.url,
        Opts::default()
            .env("MAAS_ARCHIVIST__ENABLED", "false")
            .env("MAAS_RETENTION__LOGS_KEEP_DAYS", 30)
            .env("MAAS_RETENTION__MEMORY_KEEP_DAYS", 90)
            .env("MAAS_RETENTION__INTERVAL_SECS", 1)
            .env("MAAS_RETENTION__BATCH", 7),
    );
    let old_turns = q("SELECT count(*) FROM raw_logs WHERE user_id = '$U' AND content LIKE 'old turn%'");
    let old_records = q("SELECT count(*) FROM lsm_storage WHERE user_id = '$U' AND summary = 'old record'");
    wait_until(GENEROUS, "old turns and records are gone", || async {
        count(&c, &old_turns).await == 0 && count(&c, &old_records).await == 0
    })
    .await;
    assert_eq!(
        count(&c, &q("SELECT count(*) FROM raw_logs WHERE user_id = '$U'")).await,
        3
    );
    assert_eq!(
        count(&c, &q("SELECT count(*) FROM lsm_storage WHERE user_id = '$U'")).await,
        2
    );
    assert!(count(&c, &q("SELECT memory_version FROM archive_marks WHERE user_id = '$U'")).await >= 2);
}
