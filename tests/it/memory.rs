//! Memory in the context: the turns of a request's own thread at
//! once, the user's long-term memory found by search and never another
//! user's, and the provenance of a context (status API, `maasctl`).

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::cli::maasctl_async;
use crate::support::daemon::Opts;
use crate::support::db::{TestDb, apply_migration, by_name};
use crate::support::fake_llm::{FakeLlm, REFUSED_TEXT};
use crate::support::poll::{count, poll_until};

/// A daemon with the offline provider (no provider is configured) and the
/// archivist off.
async fn start(db: &TestDb) -> Api {
    Api::start(db, Opts::default().env("MAAS_ARCHIVIST__ENABLED", "false")).await
}

async fn log_turn(c: &Client, user: Uuid, thread: Uuid, kind: &str, content: &str) {
    c.execute(
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content) VALUES ($1, $2, $3, $4)",
        &[&user, &thread, &kind, &content],
    )
    .await
    .unwrap();
}

/// A follow-up in the same thread sees the previous turns at once, before
/// any archivist run; the status API and `maasctl requests show` name them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_in_the_same_thread_sees_the_previous_turns_with_their_provenance() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = start(&db).await;
    let (user, thread) = (Uuid::new_v4(), Uuid::new_v4());
    let first = api
        .ask(
            user,
            Some(thread),
            "My sister Olga moves to Lisbon in March; remember that.",
        )
        .await;
    let second = api.ask(user, Some(thread), "Where is my sister moving?").await;
    let records: i64 = c
        .query_one("SELECT count(*) FROM lsm_storage WHERE user_id = $1", &[&user])
        .await
        .unwrap()
        .get(0);
    assert_eq!(records, 0, "no archivist run");

    let state = api.status_with(second, "include=context").await;
    let context = state["context"].as_str().unwrap_or_default();
    assert!(
        context.contains("): My sister Olga moves to Lisbon in March; remember that."),
        "{context}"
    );
    assert!(
        !context.contains("): Where is my sister moving?"),
        "the request's own query is not memory: {context}"
    );
    let sources = state["context_sources"].as_array().cloned().unwrap_or_default();
    let first_turn: i64 = c
        .query_one(
            "SELECT id FROM raw_logs WHERE request_id = $1 AND message_type = 'user_query'",
            &[&first],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        sources
            .iter()
            .any(|s| s["kind"] == "turn" && s["id"] == json!(first_turn) && s["why"] == "thread"),
        "{sources:?}"
    );
    // Without include, the shape is unchanged.
    let plain = api.status_with(second, "").await;
    assert!(
        plain.get("context").is_none() && plain.get("context_sources").is_none(),
        "{plain}"
    );

    let (code, out, err) = maasctl_async::<&str>(&db.url, &["requests", "show", &second.to_string()], &[]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("memory "), "{out}");
    assert!(
        out.contains(&format!("{first_turn}")) && out.contains("thread"),
        "{out}"
    );
    let (code, out, err) =
        maasctl_async::<&str>(&db.url, &["--json", "requests", "show", &second.to_string()], &[]).await;
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["request"]["context_sources"], json!(sources));
}

/// Two users who use the same words: each finds only their own turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_users_sharing_words_never_see_each_others_memory() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (alice, bob) = (Uuid::new_v4(), Uuid::new_v4());
    log_turn(
        &c,
        alice,
        Uuid::new_v4(),
        "user_query",
        "Alice: my pottery class moved to Tuesday ALICE-ONLY",
    )
    .await;
    log_turn(
        &c,
        bob,
        Uuid::new_v4(),
        "user_query",
        "Bob: my pottery class moved to Friday BOB-ONLY",
    )
    .await;
    // A record each, so that the offline analyzer says the query needs context.
    for (user, text) in [(alice, "Alice talks about pottery"), (bob, "Bob talks about pottery")] {
        a_record(&c, user, "pottery", text).await;
    }
    let api = start(&db).await;
    for (user, mine, theirs) in [(bob, "BOB-ONLY", "ALICE-ONLY"), (alice, "ALICE-ONLY", "BOB-ONLY")] {
        let id = api.ask(user, None, "When is my pottery class?").await;
        let state = api.status_with(id, "include=context").await;
        let context = state["context"].as_str().unwrap_or_default();
        assert!(context.contains(mine), "their own turn is found: {context}");
        assert!(!context.contains(theirs), "another user's memory: {context}");
        assert!(!context.contains("Alice talks") || user == alice, "{context}");
        assert!(!context.contains("Bob talks") || user == bob, "{context}");
        let sources = state["context_sources"].as_array().cloned().unwrap_or_default();
        assert!(sources.iter().any(|s| s["why"] == "hit"), "{sources:?}");
    }
}

/// A record of `user` with one tag, so that the offline analyzer says a
/// query needs context.
async fn a_record(c: &Client, user: Uuid, tag: &str, summary: &str) {
    c.execute(
        "INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, tags, summary)
         VALUES ($1, now() - interval '2 days', now() - interval '1 day', ARRAY[$2], $3)",
        &[&user, &tag, &summary],
    )
    .await
    .unwrap();
}

/// The environment that turns on the offline provider's embeddings.
const OFFLINE_EMBEDDINGS: &[(&str, &str)] = &[("MAAS_LLM__EMBEDDING__PROVIDER", "offline")];

/// A daemon (archivist off) with the offline provider's embeddings.
async fn start_with_offline_embeddings(db: &TestDb) -> Api {
    Api::start(
        db,
        Opts::default()
            .env("MAAS_ARCHIVIST__ENABLED", "false")
            .env("MAAS_LLM__EMBEDDING__PROVIDER", "offline"),
    )
    .await
}

/// A daemon (archivist off) whose embeddings come from `fake`, as an
/// OpenAI-compatible provider with the key `embed-test-key`.
async fn start_with_provider_embeddings(db: &TestDb, fake: &FakeLlm) -> Api {
    Api::start(
        db,
        Opts::default()
            .env("MAAS_ARCHIVIST__ENABLED", "false")
            .env("MAAS_LLM__EMBEDDING__PROVIDER", "openai")
            .env("MAAS_LLM__OPENAI__BASE_URL", fake.openai_base_url())
            .env("OPENAI_API_KEY", "embed-test-key"),
    )
    .await
}

/// The id of the one turn whose content contains `text`.
async fn turn_with(c: &Client, text: &str) -> i64 {
    c.query_one("SELECT id FROM raw_logs WHERE strpos(content, $1) > 0", &[&text])
        .await
        .unwrap()
        .get(0)
}

/// How many embeddings turn `id` has (0 or 1).
async fn embeddings_of(c: &Client, id: i64) -> i64 {
    count(c, &format!("SELECT count(*) FROM turn_embeddings WHERE turn_id = {id}")).await
}

/// Waits until every turn of `user` has an embedding of `model`.
async fn every_turn_embedded(c: &Client, user: Uuid, model: &str) {
    every_turn_embedded_within(c, user, model, Duration::from_secs(60)).await;
}

/// [`every_turn_embedded`] with a deadline of its own.
async fn every_turn_embedded_within(c: &Client, user: Uuid, model: &str, deadline: Duration) {
    let sql = format!(
        "SELECT count(*) FROM raw_logs r WHERE r.user_id = '{user}' AND NOT EXISTS \
         (SELECT 1 FROM turn_embeddings e WHERE e.turn_id = r.id AND e.model = '{model}' AND e.user_id = r.user_id)"
    );
    let done = poll_until(deadline, Duration::from_millis(100), || async {
        count(c, &sql).await == 0
    })
    .await;
    assert!(
        done,
        "{} turns of {user} still without an embedding of {model}",
        count(c, &sql).await
    );
}

/// Twelve turns of `user` about the weather in one chat, one in another
/// that says where Ann's sister lives (in Lisboa), and a record; returns
/// the Lisboa turn.
async fn a_sister_in_lisboa(c: &Client, user: Uuid) -> i64 {
    let chat = Uuid::new_v4();
    for i in 0..12 {
        let kind = if i % 2 == 0 { "user_query" } else { "assistant_response" };
        log_turn(c, user, chat, kind, &format!("Ann: the weather was grey on day {i}")).await;
    }
    log_turn(
        c,
        user,
        Uuid::new_v4(),
        "user_query",
        "Ann: my sister now lives in Lisboa",
    )
    .await;
    let lisboa = turn_with(c, "lives in Lisboa").await;
    a_record(c, user, "family", "Ann talks about her family").await;
    lisboa
}

/// `maasctl doctor` with the offline embedder names the backlog while no
/// embedder has run (13 turns of one user); by default without a model it
/// warns that the search is full text alone; with embeddings off it says
/// so; a local model whose folder lacks its files fails.
async fn assert_doctor_names_the_backlog(url: &str) {
    let (code, out, err) = maasctl_async(url, &["doctor"], OFFLINE_EMBEDDINGS).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("warn  embeddings") && out.contains("offline (model offline-hash-384): 13 turn(s) of 1 user(s)"),
        "{out}"
    );
    // The default without a model: full text, said in plain words.
    let (code, out, _) = maasctl_async::<&str>(url, &["doctor"], &[]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("warn  embeddings")
            && out.contains("semantic memory search is off")
            && out.contains("full text alone"),
        "{out}"
    );
    let off = [("MAAS_LLM__EMBEDDING__PROVIDER", "off".to_owned())];
    let (code, out, _) = maasctl_async(url, &["doctor"], &off).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("ok    embeddings") && out.contains("off (the memory search is full text alone)"),
        "{out}"
    );
    let nowhere = std::env::temp_dir().join(format!("maas-no-model-{}", Uuid::new_v4()));
    let local = [
        ("MAAS_LLM__EMBEDDING__PROVIDER", "local".to_owned()),
        ("MAAS_LLM__EMBEDDING__MODEL_DIR", nowhere.display().to_string()),
    ];
    let (code, out, _) = maasctl_async(url, &["doctor"], &local).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  embeddings") && out.contains("config.json, tokenizer.json, model.safetensors missing"),
        "{out}"
    );
}

/// A request of `user` asking "Lisbon?" gets the `lisboa` turn in its
/// context, named as the best hit of its provenance.
async fn assert_lisboa_is_the_best_hit(api: &Api, user: Uuid, lisboa: i64) {
    let id = api.ask(user, None, "Lisbon?").await;
    let state = api.status_with(id, "include=context").await;
    let context = state["context"].as_str().unwrap_or_default();
    assert!(context.contains("my sister now lives in Lisboa"), "{context}");
    let sources = state["context_sources"].as_array().cloned().unwrap_or_default();
    let best = sources.iter().filter(|s| s["why"] == "hit").max_by(|a, b| {
        a["score"]
            .as_f64()
            .unwrap_or(0.0)
            .total_cmp(&b["score"].as_f64().unwrap_or(0.0))
    });
    assert_eq!(best.map(|s| s["id"].clone()), Some(json!(lisboa)), "{sources:?}");
}

/// With embeddings on (the offline provider's hashed ones), maasd's
/// embedder gives every turn its embedding, and the memory search finds a
/// turn that shares no word with the query (Lisboa for Lisbon), which full
/// text alone cannot; the provenance names it as the best hit, and the
/// API's search of the user's memory finds it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_semantic_part_finds_a_turn_that_shares_no_word_with_the_query() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let lisboa = a_sister_in_lisboa(&c, user).await;
    assert_doctor_names_the_backlog(&db.url).await;
    let api = start_with_offline_embeddings(&db).await;
    every_turn_embedded(&c, user, "offline-hash-384").await;
    assert_lisboa_is_the_best_hit(&api, user, lisboa).await;
    // The request's own turns are embedded too, as they are logged.
    every_turn_embedded(&c, user, "offline-hash-384").await;
    let (code, out, err) = maasctl_async(&db.url, &["doctor"], OFFLINE_EMBEDDINGS).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("ok    embeddings") && out.contains("offline (model offline-hash-384): every turn embedded"),
        "{out}"
    );
    // The user memory search of the API runs the same semantic part.
    let resp = api.get(&format!("/api/users/{user}/memory?q=Lisbon")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let found: Value = resp.json().await.unwrap();
    let hits = found["hits"].as_array().cloned().unwrap_or_default();
    assert!(hits.iter().any(|h| h["id"] == json!(lisboa)), "{found}");
    // A deleted turn takes its embedding with it.
    c.execute("DELETE FROM raw_logs WHERE id = $1", &[&lisboa])
        .await
        .unwrap();
    assert_eq!(embeddings_of(&c, lisboa).await, 0);
}

/// Embeddings from an OpenAI-compatible provider over HTTP. While the
/// provider fails, requests still complete (the search runs on full text
/// alone) and no turn is skipped: once it is back, every turn gets its
/// embedding, and a request's query is embedded with the configured key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_embeddings_over_http_and_a_failing_provider_harms_no_request() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let fake = FakeLlm::start().await;
    fake.set_embeddings_failing(true);
    let (user, chat) = (Uuid::new_v4(), Uuid::new_v4());
    log_turn(&c, user, chat, "user_query", "Bea: the pottery class moved to Tuesday").await;
    log_turn(&c, user, chat, "assistant_response", "Noted: pottery on Tuesday.").await;
    a_record(&c, user, "pottery", "Bea talks about pottery").await;
    let api = start_with_provider_embeddings(&db, &fake).await;
    fake.wait_for_requests(1, Duration::from_secs(30)).await;

    let id = api.ask(user, None, "When is my pottery class?").await;
    let state = api.status_with(id, "include=context").await;
    let context = state["context"].as_str().unwrap_or_default();
    assert!(context.contains("pottery class moved to Tuesday"), "{context}");
    let sql = format!("SELECT count(*) FROM turn_embeddings WHERE user_id = '{user}'");
    assert_eq!(count(&c, &sql).await, 0, "nothing stored while the provider fails");
    let mark: i64 = c
        .query_one("SELECT embedded_seq FROM archive_marks WHERE user_id = $1", &[&user])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mark, 0, "the mark waits for the embeddings");

    fake.set_embeddings_failing(false);
    every_turn_embedded(&c, user, "text-embedding-3-small").await;
    let before = fake.requests().len();
    api.ask(user, None, "Which day is pottery?").await;
    let asked = fake.requests()[before..]
        .iter()
        .find(|r| r.path == "/v1/embeddings" && r.body["input"] == json!(["Which day is pottery?"]))
        .cloned();
    let asked = asked.unwrap_or_else(|| panic!("the query was not embedded: {:?}", fake.requests()));
    assert_eq!(asked.header("authorization"), Some("Bearer embed-test-key"));
    assert_eq!(asked.body["model"], "text-embedding-3-small");
}

/// A text the provider refuses costs only that turn its embedding: the
/// user's other turns and another user's turns are embedded, the marks
/// reach the end, and the refused turn is still found by full text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_the_provider_refuses_holds_up_no_other_turn_or_user() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let fake = FakeLlm::start().await;
    let (ann, bob) = (Uuid::new_v4(), Uuid::new_v4());
    let (a_chat, b_chat) = (Uuid::new_v4(), Uuid::new_v4());
    log_turn(&c, ann, a_chat, "user_query", "Ann: the kiln fires at noon").await;
    log_turn(
        &c,
        ann,
        Uuid::new_v4(),
        "user_query",
        &format!("Ann: glaze notes {REFUSED_TEXT}"),
    )
    .await;
    log_turn(&c, ann, a_chat, "assistant_response", "Noted: the kiln at noon.").await;
    for i in 0..3 {
        log_turn(&c, bob, b_chat, "user_query", &format!("Bob: chess opening number {i}")).await;
    }
    let refused = turn_with(&c, "glaze notes").await;
    let api = start_with_provider_embeddings(&db, &fake).await;
    let marks_done = poll_until(Duration::from_secs(60), Duration::from_millis(100), || async {
        count(&c, "SELECT count(*) FROM archive_marks WHERE embedded_seq = logged_seq").await == 2
    })
    .await;
    assert!(marks_done, "both users' marks reach their last turn");
    let sql = |user: Uuid| format!("SELECT count(*) FROM turn_embeddings WHERE user_id = '{user}'");
    assert_eq!(count(&c, &sql(bob)).await, 3, "the other user is embedded");
    assert_eq!(count(&c, &sql(ann)).await, 2, "the user's other turns are embedded");
    assert_eq!(embeddings_of(&c, refused).await, 0, "the refused turn has none");
    let metrics = api.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("maas_embedder_refused_total 1\n"), "{metrics}");
    assert!(metrics.contains("maas_embedder_turns_total 5\n"), "{metrics}");
}

/// Migration 0018 turns the embeddings 0017 stored as `real[]` into their
/// parts, and the cosine the search computes from the parts is the dot
/// product of the original vectors, for any number of dimensions (a last
/// part shorter than 96 included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_0018_keeps_every_embedding_and_its_cosine() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let chat = Uuid::new_v4();
    for i in 0..3 {
        log_turn(&c, user, chat, "user_query", &format!("Ann: turn {i}")).await;
    }
    // The table as 0017 left it, holding unit vectors of 384 and 200
    // dimensions.
    c.batch_execute(
        "DROP TABLE turn_embeddings; DROP FUNCTION embedding_parts(real[]);
         CREATE TABLE turn_embeddings (
             turn_id bigint PRIMARY KEY REFERENCES raw_logs (id) ON DELETE CASCADE,
             user_id uuid NOT NULL, model text NOT NULL, embedding real[] NOT NULL);
         CREATE INDEX turn_embeddings_user_idx ON turn_embeddings (user_id);",
    )
    .await
    .unwrap();
    let unit = |dims: usize, seed: usize| -> Vec<f32> {
        let v: Vec<f32> = (0..dims).map(|i| (((i * 7 + seed * 13) % 17) as f32) - 8.0).collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / norm).collect()
    };
    let ids: Vec<i64> = c
        .query("SELECT id FROM raw_logs WHERE user_id = $1 ORDER BY id", &[&user])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let vectors = [unit(384, 1), unit(384, 2), unit(200, 3)];
    for (id, v) in ids.iter().zip(&vectors) {
        c.execute(
            "INSERT INTO turn_embeddings (turn_id, user_id, model, embedding) VALUES ($1, $2, 'm', $3)",
            &[id, &user, v],
        )
        .await
        .unwrap();
    }
    apply_migration(&c, 18).await;
    let rows = c
        .query(
            "SELECT e.dims, cardinality(e.parts) AS parts,
                    1 - (SELECT sum(cube_distance(x.a, x.b) ^ 2)
                         FROM unnest(e.parts, embedding_parts($2::real[])) AS x(a, b)) / 2 AS similarity
             FROM turn_embeddings e WHERE e.user_id = $1 ORDER BY e.turn_id",
            &[&user, &vectors[0]],
        )
        .await
        .unwrap();
    let got: Vec<(i32, i32, f64)> = rows
        .iter()
        .map(|r| by_name!(r, "dims", "parts", "similarity"))
        .collect();
    assert_eq!(got.len(), 3, "every embedding kept: {got:?}");
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum::<f64>();
    for ((dims, parts, cosine), v) in got.iter().zip(&vectors) {
        assert_eq!(usize::try_from(*dims).ok(), Some(v.len()));
        assert_eq!(usize::try_from(*parts).ok(), Some(v.len().div_ceil(96)));
        if v.len() == 384 {
            let want = dot(&vectors[0], v);
            assert!((cosine - want).abs() < 1e-5, "cosine {cosine}, dot product {want}");
        }
    }
    assert!((got[0].2 - 1.0).abs() < 1e-5, "a vector with itself: {}", got[0].2);
}

/// The embedder's scoped pass (`embed_pending_since.sql`) looks only at the
/// users of the turns logged after a turn id, while the full pass sees
/// every user with work; and a maasd that has gone idle (its passes
/// scoped) still embeds the turns logged afterwards, for every user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedder_looks_only_at_users_with_new_turns_between_full_passes() {
    use maas::repo::embeddings::{pending, pending_since, top};
    let db = TestDb::new().await;
    let c = db.client().await;
    let pool = db.pool();
    let client = pool.get().await.unwrap();
    let (old, new) = (Uuid::new_v4(), Uuid::new_v4());
    log_turn(&c, old, Uuid::new_v4(), "user_query", "Ann: an old turn").await;
    let seen = top(&client).await.unwrap();
    assert!(seen > 0);
    log_turn(&c, new, Uuid::new_v4(), "user_query", "Bob: a new turn").await;
    let users = |p: Vec<maas::repo::embeddings::Pending>| {
        let mut u: Vec<Uuid> = p.into_iter().map(|p| p.user_id).collect();
        u.sort();
        u
    };
    let mut both = vec![old, new];
    both.sort();
    assert_eq!(users(pending(&client, "m", 16).await.unwrap()), both);
    assert_eq!(users(pending_since(&client, "m", 16, seen).await.unwrap()), vec![new]);
    let newest = top(&client).await.unwrap();
    assert!(pending_since(&client, "m", 16, newest).await.unwrap().is_empty());

    // Turns logged while the embedder idles, by a user it has done and a
    // user it has never seen, are embedded by its scoped passes: well
    // before the next full pass is due.
    let _api = start_with_offline_embeddings(&db).await;
    every_turn_embedded(&c, old, "offline-hash-384").await;
    every_turn_embedded(&c, new, "offline-hash-384").await;
    let third = Uuid::new_v4();
    log_turn(&c, old, Uuid::new_v4(), "user_query", "Ann: later").await;
    log_turn(&c, third, Uuid::new_v4(), "user_query", "Cy: first words").await;
    let soon = maas::embedder::FULL_EVERY / 3;
    every_turn_embedded_within(&c, old, "offline-hash-384", soon).await;
    every_turn_embedded_within(&c, third, "offline-hash-384", soon).await;
}

/// Sessions of [`scattered_hits`], each with one turn about the kayak.
const KAYAK_SESSIONS: usize = 16;

/// The hits that bring their neighbours (`memory_search_items.sql`).
const STRONGEST: usize = 5;

/// `KAYAK_SESSIONS` chats of `user`, each a turn about the kayak between
/// two long turns about other things each side (about 55 tokens each,
/// sharing no word with the question), a day apart, and a record; returns
/// the chats.
async fn scattered_hits(c: &Client, user: Uuid) -> Vec<Uuid> {
    let mut chats = Vec::new();
    for s in 0..KAYAK_SESSIONS {
        let chat = Uuid::new_v4();
        let days = i32::try_from(KAYAK_SESSIONS - s).unwrap();
        for i in 0..5 {
            let content = if i == 2 {
                format!("Dana: we paddled the kayak across lake number {s}")
            } else {
                format!(
                    "Dana: the coastal weather report said fog all morning and bright sun by noon, the ferry \
                     schedule moved twice because of repairs on the pier, note {s}-{i}"
                )
            };
            c.execute(
                "INSERT INTO raw_logs (user_id, thread_id, message_type, content, created_at)
                 VALUES ($1, $2, 'user_query', $3, now() - make_interval(days => $4) + make_interval(mins => $5))",
                &[&user, &chat, &content, &days, &i],
            )
            .await
            .unwrap();
        }
        chats.push(chat);
    }
    a_record(c, user, "kayak", "Dana talks about the kayak").await;
    chats
}

/// Packing that prefers coverage: a question whose hits are many and
/// scattered over sessions gets every session's hit within the budget;
/// only the strongest few hits bring their neighbours. (With every hit
/// bringing two neighbours each side, the long turns around the first
/// hits spend the budget and half the sessions are left out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scattered_hits_come_as_single_turns_from_every_session() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let chats = scattered_hits(&c, user).await;
    let api = start(&db).await;
    let id = api.ask(user, None, "Where did Dana paddle the kayak?").await;
    let state = api.status_with(id, "include=context").await;
    let context = state["context"].as_str().unwrap_or_default();
    let sources = state["context_sources"].as_array().cloned().unwrap_or_default();
    let ids = |why: &str| -> Vec<i64> {
        sources
            .iter()
            .filter(|s| s["kind"] == "turn" && s["why"] == why)
            .filter_map(|s| s["id"].as_i64())
            .collect()
    };
    let (hits, neighbours) = (ids("hit"), ids("neighbour"));
    let sessions: i64 = c
        .query_one(
            "SELECT count(DISTINCT thread_id) FROM raw_logs WHERE id = ANY($1) AND content LIKE '%kayak%'",
            &[&hits],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        usize::try_from(sessions).unwrap(),
        chats.len(),
        "every session's kayak turn is in the context: {context}"
    );
    assert!(
        !neighbours.is_empty() && neighbours.len() <= STRONGEST * 4,
        "neighbours only around the {STRONGEST} strongest hits ({} of them): {context}",
        neighbours.len()
    );
}

/// A question that names a speaker prefers that speaker's own words: of two
/// turns that match it equally (the same words, the same length), the one
/// said by the person the question names is the hit, though the other is
/// newer (which breaks a tie otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_naming_a_speaker_prefers_that_speakers_turns() {
    let db = TestDb::new().await;
    let context = which_pet(&db, "2000", true).await;
    assert!(context.contains("we adopted a pet dog"), "{context}");
    assert!(!context.contains("Caroline adopted pet?"), "{context}");
}

/// A question in the first person asks about the user's own words: of two
/// turns that match it equally, the user's is the hit, though the
/// assistant's is newer; the same turns asked about without "I" give the
/// newer one, so the tie is the first person's to break.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_in_the_first_person_prefers_the_users_own_turns() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let users = [Uuid::new_v4(), Uuid::new_v4()];
    for user in users {
        let chat = Uuid::new_v4();
        log_turn(&c, user, chat, "user_query", "we adopted a pet dog").await;
        log_turn(&c, user, chat, "assistant_response", "you adopted a pet cat").await;
    }
    let api = Api::start(
        &db,
        Opts::default()
            .env("MAAS_ARCHIVIST__ENABLED", "false")
            .env("MAAS_MEMORY__HITS", "1")
            .env("MAAS_MEMORY__WINDOW", "0"),
    )
    .await;
    let mut contexts = Vec::new();
    for (user, question) in users
        .into_iter()
        .zip(["Which pet did I adopt?", "Which pet was adopted before?"])
    {
        let id = api.ask(user, None, question).await;
        let state = api.status_with(id, "include=context").await;
        contexts.push(state["context"].as_str().unwrap_or_default().to_owned());
    }
    assert!(contexts[0].contains("we adopted a pet dog"), "{}", contexts[0]);
    assert!(!contexts[0].contains("you adopted a pet cat"), "{}", contexts[0]);
    assert!(contexts[1].contains("you adopted a pet cat"), "{}", contexts[1]);
    assert!(!contexts[1].contains("we adopted a pet dog"), "{}", contexts[1]);
}

/// The search asks for more hits when the budget is larger
/// (`stage::memory::hits`): with `memory.hits` 1, a budget of 4,000 tokens
/// brings two matching turns where 2,000 brings one (the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_larger_budget_asks_for_more_hits() {
    let db = TestDb::new().await;
    let context = which_pet(&db, "4000", false).await;
    assert!(context.contains("we adopted a pet dog"), "{context}");
    assert!(context.contains("Caroline adopted pet?"), "{context}");
}

/// "Which pet did Caroline adopt?" asked of a user whose memory holds two
/// turns that match it equally, Caroline's and Melanie's (and a record
/// about pets when `record`), with `memory.hits` 1, no neighbours and a
/// long-term budget of `budget` tokens; returns the request's context.
async fn which_pet(db: &TestDb, budget: &str, record: bool) -> String {
    let c = db.client().await;
    let (user, chat) = (Uuid::new_v4(), Uuid::new_v4());
    log_turn(&c, user, chat, "user_query", "Caroline: we adopted a pet dog").await;
    log_turn(&c, user, chat, "assistant_response", "Melanie: Caroline adopted pet?").await;
    if record {
        a_record(&c, user, "pets", "Caroline and Melanie talk about pets").await;
    }
    let api = Api::start(
        db,
        Opts::default()
            .env("MAAS_ARCHIVIST__ENABLED", "false")
            .env("MAAS_MEMORY__HITS", "1")
            .env("MAAS_MEMORY__BUDGET_TOKENS", budget)
            .env("MAAS_MEMORY__WINDOW", "0"),
    )
    .await;
    let id = api.ask(user, None, "Which pet did Caroline adopt?").await;
    let state = api.status_with(id, "include=context").await;
    state["context"].as_str().unwrap_or_default().to_owned()
}
