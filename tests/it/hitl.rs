//! A person in the loop: requests that wait for their user's reply
//! (WAITING_USER_INPUT) or an operator's review (AWAITING_REVIEW). A wait
//! is the row alone (invariant 14): no lease, never claimed, ended once by
//! a reply, a review, a cancel or the sweep.

use std::time::Duration;

use maas::control::{self, CancelOutcome};
use maas::dispatcher::sweep::{expire_all_waits, reclaim_all};
use maas::model::{StageKind, Status};
use maas::repo;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::db::{TestDb, value};

/// Inserts a request of tenant `tenant` and moves it, as the daemon would,
/// into the wait `status` (WAITING_USER_INPUT with a question, or
/// AWAITING_REVIEW with an answer), its wait ending `expires_in` seconds
/// from now (negative: already past). Returns its id.
async fn waiting(c: &Client, tenant: Uuid, status: Status, expires_in: f64) -> Uuid {
    let id: Uuid = value(
        c,
        "INSERT INTO pipeline_runs (user_id, thread_id, user_query, tenant_id)
         VALUES (gen_random_uuid(), gen_random_uuid(), 'where did we go?', $1) RETURNING id",
        &[&tenant],
    )
    .await;
    let (question, answer) = match status {
        Status::WaitingUserInput => (Some("Which of your two trips do you mean?"), None),
        _ => (None, Some("You went to Lisbon.")),
    };
    c.execute(
        "UPDATE pipeline_runs
         SET status = $2, question = $3, final_answer = $4,
             wait_expires_at = now() + make_interval(secs => $5)
         WHERE id = $1",
        &[&id, &status.as_str(), &question, &answer, &expires_in],
    )
    .await
    .unwrap();
    id
}

/// A tenant named `name` whose expired waits end by `on_reply` and
/// `on_review` ('answer' or 'fail').
async fn tenant(c: &Client, name: &str, on_reply: &str, on_review: &str) -> Uuid {
    value(
        c,
        "INSERT INTO tenants (name, user_reply_timeout, review_timeout, on_reply_timeout, on_review_timeout)
         VALUES ($1, interval '1 second', interval '2 seconds', $2, $3) RETURNING id",
        &[&name, &on_reply, &on_review],
    )
    .await
}

/// (status, question, wait_expires_at is set, error, attempt) of request `id`.
async fn state(c: &Client, id: Uuid) -> (String, Option<String>, bool, Option<String>, i32) {
    let r = c
        .query_one(
            "SELECT status, question, wait_expires_at IS NOT NULL AS waits, error, attempt
             FROM pipeline_runs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    (
        r.get("status"),
        r.get("question"),
        r.get("waits"),
        r.get("error"),
        r.get("attempt"),
    )
}

/// The turns of type `kind` logged for request `id`.
async fn logged(c: &Client, id: Uuid, kind: &str) -> Vec<String> {
    crate::support::db::column(
        c,
        "SELECT content FROM raw_logs WHERE request_id = $1 AND message_type = $2 ORDER BY id",
        &[&id, &kind],
    )
    .await
}

/// A waiting row holds no lease, cannot be given one, and no claim of any
/// stage nor the lease sweep takes it, even when it is long past due.
#[tokio::test]
async fn a_waiting_request_holds_no_lease_and_is_never_claimed() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let pool = db.pool();
    let client = pool.get().await.unwrap();
    let nil = Uuid::nil();
    let asked = waiting(&c, nil, Status::WaitingUserInput, 3600.0).await;
    let reviewed = waiting(&c, nil, Status::AwaitingReview, 3600.0).await;
    c.execute("UPDATE pipeline_runs SET run_after = now() - interval '1 hour'", &[])
        .await
        .unwrap();
    for stage in StageKind::ALL {
        let got = repo::claim_next(&client, stage, 10, "w1", Duration::from_secs(30), 20)
            .await
            .unwrap();
        assert!(
            got.is_empty(),
            "{stage} claimed a waiting row: {:?}",
            got.iter().map(|g| g.id).collect::<Vec<_>>()
        );
    }
    assert_eq!(reclaim_all(&client, 3, |_| {}).await.unwrap(), 0);

    let leased = c
        .execute(
            "UPDATE pipeline_runs SET lease_owner = 'w1', lease_expires_at = now() + interval '1 minute' WHERE id = $1",
            &[&asked],
        )
        .await
        .unwrap_err();
    assert!(
        format!("{leased:?}").contains("pipeline_runs_lease_matches_status"),
        "{leased:?}"
    );
    let no_question = c
        .execute("UPDATE pipeline_runs SET question = NULL WHERE id = $1", &[&asked])
        .await
        .unwrap_err();
    assert!(
        format!("{no_question:?}").contains("pipeline_runs_question_while_waiting"),
        "{no_question:?}"
    );
    let expiry_elsewhere = c
        .execute(
            "INSERT INTO pipeline_runs (user_id, user_query, wait_expires_at) VALUES (gen_random_uuid(), 'q', now())",
            &[],
        )
        .await
        .unwrap_err();
    assert!(
        format!("{expiry_elsewhere:?}").contains("pipeline_runs_wait_expires_while_waiting"),
        "{expiry_elsewhere:?}"
    );
    for id in [asked, reviewed] {
        let (status, _, waits, _, _) = state(&c, id).await;
        assert!(
            status == "WAITING_USER_INPUT" || status == "AWAITING_REVIEW",
            "{status}"
        );
        assert!(waits);
    }
}

/// Expired waits end as their tenant chose, each exactly once though two
/// sweeps run at the same time; a wait not yet expired is left alone.
#[tokio::test]
async fn the_sweep_ends_each_expired_wait_once_as_its_tenant_chose() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let lenient = tenant(&c, "lenient", "answer", "answer").await;
    let strict = tenant(&c, "strict", "fail", "fail").await;
    let asked_lenient = waiting(&c, lenient, Status::WaitingUserInput, -1.0).await;
    let asked_strict = waiting(&c, strict, Status::WaitingUserInput, -1.0).await;
    let review_lenient = waiting(&c, lenient, Status::AwaitingReview, -1.0).await;
    let review_strict = waiting(&c, strict, Status::AwaitingReview, -1.0).await;
    let not_yet = waiting(&c, strict, Status::WaitingUserInput, 3600.0).await;

    let pool = db.pool();
    let (a, b) = (pool.get().await.unwrap(), pool.get().await.unwrap());
    let (ended_a, ended_b) = tokio::join!(expire_all_waits(&a, |_| {}), expire_all_waits(&b, |_| {}));
    assert_eq!(ended_a.unwrap() + ended_b.unwrap(), 4, "each expired wait ends once");
    assert_eq!(expire_all_waits(&a, |_| {}).await.unwrap(), 0, "nothing left to end");

    // Asked, no reply, 'answer': back to the analyzer, due now, without a reply.
    let (status, question, waits, error, _) = state(&c, asked_lenient).await;
    assert_eq!((status.as_str(), question, waits, error), ("NEW", None, false, None));
    assert!(logged(&c, asked_lenient, "user_reply").await.is_empty());
    let due: bool = value(
        &c,
        "SELECT run_after <= now() FROM pipeline_runs WHERE id = $1",
        &[&asked_lenient],
    )
    .await;
    assert!(due);

    // 'fail': FAILED, naming the limit that ran out.
    let (status, _, waits, error, _) = state(&c, asked_strict).await;
    assert_eq!((status.as_str(), waits), ("FAILED", false));
    let error = error.unwrap_or_default();
    assert!(
        error.contains("user_reply_timeout of tenant strict") && error.contains("00:00:01"),
        "{error}"
    );
    let (status, _, _, error, _) = state(&c, review_strict).await;
    assert_eq!(status, "FAILED");
    let error = error.unwrap_or_default();
    assert!(
        error.contains("review_timeout of tenant strict") && error.contains("00:00:02"),
        "{error}"
    );
    assert!(
        logged(&c, review_strict, "assistant_response").await.is_empty(),
        "a failed review delivers nothing"
    );

    // Under review, 'answer': COMPLETED with the answer as it was, logged once.
    let (status, _, waits, error, _) = state(&c, review_lenient).await;
    assert_eq!((status.as_str(), waits, error), ("COMPLETED", false, None));
    assert_eq!(
        logged(&c, review_lenient, "assistant_response").await,
        vec!["You went to Lisbon."]
    );

    let (status, question, waits, _, _) = state(&c, not_yet).await;
    assert_eq!(
        (status.as_str(), question.is_some(), waits),
        ("WAITING_USER_INPUT", true, true)
    );
}

/// A cancel ends a wait: the request is CANCELLED, its question and expiry
/// cleared, and the sweep no longer touches it.
#[tokio::test]
async fn a_cancelled_request_stops_waiting() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let pool = db.pool();
    let client = pool.get().await.unwrap();
    for status in [Status::WaitingUserInput, Status::AwaitingReview] {
        let id = waiting(&c, Uuid::nil(), status, 1.0).await;
        let out = control::cancel(&client, id, "test", Some("no longer needed"))
            .await
            .unwrap();
        assert!(
            matches!(out, CancelOutcome::Cancelled { was } if was == status),
            "{out:?}"
        );
        let (st, question, waits, error, _) = state(&c, id).await;
        assert_eq!((st.as_str(), question, waits), ("CANCELLED", None, false));
        assert!(error.unwrap_or_default().contains("no longer needed"));
    }
    c.execute("UPDATE pipeline_runs SET updated_at = now() - interval '1 hour'", &[])
        .await
        .unwrap();
    assert_eq!(expire_all_waits(&client, |_| {}).await.unwrap(), 0);
}

// ---- asking the user, over HTTP --------------------------------------------

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::api::Api;
use crate::support::daemon::Opts;
use crate::support::sse::Sse;
use crate::support::{GENEROUS, tenants};

/// A query with no content word: the offline analyzer asks about it
/// (`llm::offline::analyzer::vague`).
const VAGUE: &str = "And that one?";
/// The user's reply to the question about [`VAGUE`].
const REPLY: &str = "the Lisbon trip in May";

/// The SSE stream of request `id`, as `tok` opens it.
async fn open_events(api: &Api, tok: &str, id: Uuid) -> Sse {
    let resp = api
        .http
        .get(api.url(&format!("/api/query/{id}/events")))
        .bearer_auth(tok)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    Sse::new(resp)
}

/// Reads `sse` until a state whose `status` is not `processing`.
async fn until_not_processing(sse: &mut Sse) -> Value {
    loop {
        let s = sse.next().await.expect("the stream ended early");
        if s["status"] != "processing" {
            return s;
        }
    }
}

/// Submits `body` (a user, a thread and [`VAGUE`] unless it says) with `tok`.
async fn submit(api: &Api, tok: &str, body: Value) -> Uuid {
    let mut full = json!({ "user_id": Uuid::new_v4(), "thread_id": Uuid::new_v4(), "query": VAGUE });
    if let (Some(f), Some(b)) = (full.as_object_mut(), body.as_object()) {
        f.extend(b.clone());
    }
    let (s, v, _) = tenants::submit(api, tok, full).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    v["request_id"].as_str().unwrap().parse().unwrap()
}

/// `POST /api/query/{id}/reply {"text"}` with `tok`: (status, body).
async fn reply(api: &Api, tok: &str, id: Uuid, text: &str) -> (StatusCode, Value) {
    let rb = api
        .http
        .post(api.url(&format!("/api/query/{id}/reply")))
        .json(&json!({ "text": text }));
    let (s, v, _) = tenants::send(tok, rb).await;
    (s, v)
}

/// The state of request `id` once `done` holds of it, read with
/// long-polls (which return at once while it waits for a reply); panics
/// past [`GENEROUS`].
async fn state_when(api: &Api, tok: &str, id: Uuid, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + GENEROUS;
    loop {
        let (s, v) = tenants::get(api, tok, &format!("/api/query/{id}/status?wait=5s")).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        if done(&v) {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The state of request `id` once it is terminal or waits for a reply.
async fn settled(api: &Api, tok: &str, id: Uuid) -> Value {
    state_when(api, tok, id, "the request to settle", |v| v["status"] != "processing").await
}

/// A tenant `name` with a submit token, its `hitl_clarify` as given.
async fn tenant_token(c: &Client, name: &str, clarify: bool) -> String {
    let tok = tenants::token(c, name, "app", "submit").await;
    c.execute(
        "UPDATE tenants SET hitl_clarify = $2 WHERE name = $1",
        &[&name, &clarify],
    )
    .await
    .unwrap();
    tok
}

/// A vague question with `clarify` on: the stream shows the question, the
/// reply sends the request back to the analyzer, the answer's context holds
/// the reply, and the exchange is logged once each. A second reply is
/// refused naming the status; another tenant cannot reply at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_the_question_is_streamed_and_the_reply_reaches_the_answer() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = tenants::start(&db, Opts::default()).await;
    let tok = tenant_token(&c, "shop", false).await;
    let other = tenant_token(&c, "rival", false).await;
    let id = submit(&api, &tok, json!({ "clarify": true })).await;
    let mut sse = open_events(&api, &tok, id).await;
    let asked = until_not_processing(&mut sse).await;
    assert_eq!(asked["status"], "waiting_user_input", "{asked}");
    assert_eq!(asked["stage"], "WAITING_USER_INPUT", "{asked}");
    let question = asked["question"].as_str().unwrap_or_default().to_owned();
    assert!(question.contains(VAGUE), "{asked}");
    assert_eq!(logged(&c, id, "assistant_question").await, vec![question.clone()]);
    let (s, st) = tenants::get(&api, &tok, &format!("/api/query/{id}/status")).await;
    assert_eq!((s, &st["question"]), (StatusCode::OK, &json!(question)), "{st}");

    let (s, v) = reply(&api, &other, id, REPLY).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found")),
        "{v}"
    );
    // A token of the same tenant bound to another user cannot reply either,
    // nor one whose scope does not submit.
    let bound = tenants::token(&c, "shop", "bound", "submit").await;
    c.execute(
        "UPDATE api_tokens SET user_id = $1 WHERE name = 'bound'",
        &[&Uuid::new_v4()],
    )
    .await
    .unwrap();
    let (s, v) = reply(&api, &bound, id, REPLY).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found")),
        "{v}"
    );
    let reader = tenants::token(&c, "shop", "reader", "read").await;
    let (s, v) = reply(&api, &reader, id, REPLY).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("scope_required")),
        "{v}"
    );
    let (s, v) = reply(&api, &tok, id, "  ").await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("empty_field")),
        "{v}"
    );

    let (s, v) = reply(&api, &tok, id, REPLY).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let done = until_not_processing(&mut sse).await;
    assert_eq!(done["status"], "completed", "{done}");
    let (s, ctx) = tenants::get(&api, &reader, &format!("/api/query/{id}/status?include=context")).await;
    assert_eq!(s, StatusCode::OK, "{ctx}");
    let context = ctx["context"].as_str().unwrap_or_default();
    // (the query block escapes quotes: the question's opening words suffice)
    assert!(
        context.contains(REPLY) && context.contains("What do you mean by"),
        "{context}"
    );
    assert_eq!(logged(&c, id, "user_reply").await, vec![REPLY.to_owned()]);
    assert_eq!(logged(&c, id, "assistant_question").await.len(), 1, "asked once");

    let (s, v) = reply(&api, &tok, id, "again").await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::CONFLICT, Some("not_waiting")),
        "{v}"
    );
    assert!(v["error"].as_str().unwrap_or_default().contains("COMPLETED"), "{v}");
    assert_eq!(
        logged(&c, id, "user_reply").await.len(),
        1,
        "the refused reply is not logged"
    );
}

/// Asking is opt-in: off by default, on for a tenant that turns it on, and
/// a request's own `clarify` overrides its tenant's either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_only_where_its_tenant_or_itself_turned_asking_on() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = tenants::start(&db, Opts::default()).await;
    let off = tenant_token(&c, "plain", false).await;
    let on = tenant_token(&c, "curious", true).await;
    let cases = [
        (&off, json!({}), "completed"),
        (&off, json!({ "clarify": false }), "completed"),
        (&off, json!({ "clarify": true }), "waiting_user_input"),
        (&on, json!({}), "waiting_user_input"),
        (&on, json!({ "clarify": null }), "waiting_user_input"),
        (&on, json!({ "clarify": false }), "completed"),
        (&on, json!({ "query": "Where did we travel in May?" }), "completed"),
    ];
    for (tok, body, want) in cases {
        let id = submit(&api, tok, body.clone()).await;
        let got = settled(&api, tok, id).await;
        assert_eq!(got["status"], want, "{body}: {got}");
    }
    let (s, v, _) = tenants::submit(
        &api,
        &on,
        json!({ "user_id": Uuid::new_v4(), "query": VAGUE, "clarify": "yes" }),
    )
    .await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_field")),
        "{v}"
    );
}

/// Two replies at once: one applies, the other is refused naming the
/// status the first left; the reply is logged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replies_at_once_apply_once() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = tenants::start(&db, Opts::default()).await;
    let tok = tenant_token(&c, "shop", true).await;
    for _ in 0..3 {
        let id = submit(&api, &tok, json!({})).await;
        assert_eq!(settled(&api, &tok, id).await["status"], "waiting_user_input");
        let (a, b) = tokio::join!(reply(&api, &tok, id, "first"), reply(&api, &tok, id, "second"));
        let mut codes = [a.0, b.0];
        codes.sort();
        assert_eq!(codes, [StatusCode::OK, StatusCode::CONFLICT], "{a:?} {b:?}");
        let refused = if a.0 == StatusCode::CONFLICT { a.1 } else { b.1 };
        assert_eq!(refused["code"], "not_waiting", "{refused}");
        assert_eq!(logged(&c, id, "user_reply").await.len(), 1);
        assert_eq!(settled(&api, &tok, id).await["status"], "completed");
    }
}

/// A wait past the tenant's user_reply_timeout ends on time through the
/// daemon's sweep: 'answer' goes on without the reply (the context says
/// so), 'fail' fails naming the limit. A cancelled request stops waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemons_sweep_ends_an_unanswered_question_as_the_tenant_chose() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = tenants::start(
        &db,
        Opts {
            sweep_secs: 1,
            ..Opts::default()
        },
    )
    .await;
    let patient = tenant_token(&c, "patient", true).await;
    let strict = tenant_token(&c, "strict", true).await;
    c.batch_execute(
        "UPDATE tenants SET user_reply_timeout = interval '1 second', on_reply_timeout = 'answer' WHERE name = 'patient';
         UPDATE tenants SET user_reply_timeout = interval '1 second', on_reply_timeout = 'fail' WHERE name = 'strict';",
    )
    .await
    .unwrap();
    let answered = submit(&api, &patient, json!({})).await;
    let failed = submit(&api, &strict, json!({})).await;
    for (tok, id) in [(&patient, answered), (&strict, failed)] {
        let last = state_when(&api, tok, id, "the wait to expire", |v| {
            v["status"] == "completed" || v["status"] == "failed"
        })
        .await;
        assert!(last["question"].is_null(), "{last}");
    }
    let reader = tenants::token(&c, "patient", "reader", "read").await;
    let (_, ctx) = tenants::get(&api, &reader, &format!("/api/query/{answered}/status?include=context")).await;
    assert_eq!(ctx["status"], "completed", "{ctx}");
    assert!(
        ctx["context"].as_str().unwrap_or_default().contains("did not reply"),
        "{ctx}"
    );
    assert!(logged(&c, answered, "user_reply").await.is_empty());
    let (_, v) = tenants::get(&api, &strict, &format!("/api/query/{failed}/status")).await;
    assert_eq!(v["status"], "failed", "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .contains("user_reply_timeout of tenant strict"),
        "{v}"
    );

    // Cancelled while waiting: it stops waiting, and a reply is refused.
    c.execute(
        "UPDATE tenants SET user_reply_timeout = NULL WHERE name = 'patient'",
        &[],
    )
    .await
    .unwrap();
    let id = submit(&api, &patient, json!({})).await;
    assert_eq!(settled(&api, &patient, id).await["status"], "waiting_user_input");
    let operator = tenants::token(&c, "patient", "operator", "operate").await;
    let (s, v, _) = tenants::send(
        &operator,
        api.http
            .post(api.url(&format!("/api/query/{id}/cancel")))
            .json(&json!({ "reason": "the user left" })),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["was"], "WAITING_USER_INPUT", "{v}");
    let (s, v) = reply(&api, &patient, id, REPLY).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (StatusCode::CONFLICT, Some("not_waiting")),
        "{v}"
    );
    assert!(v["error"].as_str().unwrap_or_default().contains("CANCELLED"), "{v}");
}

// ---- asking the user, over SQL ---------------------------------------------

/// A login role of its own (roles are shared by the cluster's databases)
/// with the producer grants of docs/deploying.md, mapped to `tenant`;
/// logged in.
async fn producer(db: &TestDb, admin: &Client, tenant: &str) -> Client {
    let role = format!("maas_replier_{}", &Uuid::new_v4().simple().to_string()[..10]);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             GRANT CONNECT ON DATABASE {db} TO {role};
             GRANT USAGE ON SCHEMA public TO {role};
             GRANT INSERT ON pipeline_runs, raw_logs, pipeline_replies TO {role};
             GRANT SELECT ON maas_my_requests TO {role};
             INSERT INTO tenant_roles (role, tenant_id) SELECT '{role}', id FROM tenants WHERE name = '{tenant}';",
            db = db.name
        ))
        .await
        .unwrap();
    crate::support::db::connect(&db.url.replacen("://postgres@", &format!("://{role}@"), 1)).await
}

/// (status, question) of request `id` as producer `c` reads it, once
/// `done` holds of the status; panics past [`GENEROUS`].
async fn producer_state(c: &Client, id: Uuid, done: impl Fn(&str) -> bool) -> (String, Option<String>) {
    let deadline = tokio::time::Instant::now() + GENEROUS;
    loop {
        let r = c
            .query_one("SELECT status, question FROM maas_my_requests WHERE id = $1", &[&id])
            .await
            .unwrap();
        let status: String = r.get("status");
        if done(&status) {
            return (status, r.get("question"));
        }
        assert!(tokio::time::Instant::now() < deadline, "request {id} stayed {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A producer inserts a vague question with `clarify`, reads the question
/// from its view, and answers with an INSERT into pipeline_replies: the
/// request completes with the reply in its context. A second reply, and
/// another tenant's producer, are refused saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_sql_a_producer_reads_the_question_and_inserts_the_reply() {
    use tokio_postgres::error::SqlState;
    let db = TestDb::new().await;
    if !crate::support::superuser_postgres(&db.url, "the SQL reply door's test") {
        return;
    }
    let admin = db.client().await;
    let _api = tenants::start(&db, Opts::default()).await;
    for name in ["shop", "rival"] {
        admin
            .execute("INSERT INTO tenants (name) VALUES ($1)", &[&name])
            .await
            .unwrap();
    }
    let shop = producer(&db, &admin, "shop").await;
    let rival = producer(&db, &admin, "rival").await;
    // (a producer holds no SELECT on the table: it names the id itself)
    let id = Uuid::new_v4();
    shop.execute(
        "INSERT INTO pipeline_runs (id, user_id, thread_id, user_query, clarify)
         VALUES ($1, gen_random_uuid(), gen_random_uuid(), $2, true)",
        &[&id, &VAGUE],
    )
    .await
    .unwrap();
    let (status, question) = producer_state(&shop, id, |s| s != "NEW" && !s.ends_with("ING")).await;
    assert_eq!(status, "WAITING_USER_INPUT");
    assert!(question.unwrap_or_default().contains(VAGUE));

    let reply_sql = "INSERT INTO pipeline_replies (run_id, text) VALUES ($1, $2)";
    let e = rival.execute(reply_sql, &[&id, &REPLY]).await.unwrap_err();
    let db_err = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!(db_err.code(), &SqlState::NO_DATA_FOUND, "{db_err:?}");
    assert!(
        db_err.message().contains("not a request of this role's tenant"),
        "{db_err:?}"
    );

    assert_eq!(shop.execute(reply_sql, &[&id, &REPLY]).await.unwrap(), 1);
    let (status, question) = producer_state(&shop, id, |s| s == "COMPLETED" || s == "FAILED").await;
    assert_eq!((status.as_str(), question), ("COMPLETED", None));
    let context: String = value(
        &admin,
        "SELECT final_context_payload FROM pipeline_runs WHERE id = $1",
        &[&id],
    )
    .await;
    assert!(context.contains(REPLY), "{context}");
    assert_eq!(logged(&admin, id, "user_reply").await, vec![REPLY.to_owned()]);
    let kept: i64 = value(&admin, "SELECT count(*) FROM pipeline_replies", &[]).await;
    assert_eq!(kept, 0, "the table keeps nothing: the reply is a turn");

    let e = shop.execute(reply_sql, &[&id, &"again"]).await.unwrap_err();
    let db_err = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!(db_err.code(), &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE, "{db_err:?}");
    assert!(
        db_err.message().contains("is COMPLETED, not WAITING_USER_INPUT"),
        "{db_err:?}"
    );
}

/// The console's request page shows the question a request waits on, and
/// how to reply; once replied, the question is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_question_a_request_waits_on() {
    let db = TestDb::new().await;
    let console = crate::support::console::Console::open(&db, Opts::default()).await;
    let api = &console.api;
    let id = api
        .submit_accepted(&json!({ "user_id": Uuid::new_v4(), "query": VAGUE, "clarify": true }))
        .await;
    let deadline = tokio::time::Instant::now() + GENEROUS;
    loop {
        let v: Value = api
            .get(&format!("/api/query/{id}/status?wait=5s"))
            .await
            .json()
            .await
            .unwrap();
        if v["status"] == "waiting_user_input" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{v}");
    }
    let page = console.page(&format!("/console/requests/{id}")).await;
    assert!(page.contains("id=\"question\""), "{page}");
    assert!(page.contains("What do you mean by"), "{page}");
    assert!(page.contains(&format!("maasctl requests reply {id}")), "{page}");
    assert!(page.contains("st-WAITING_USER_INPUT"), "{page}");

    let (code, out, err) = crate::support::cli::maasctl_async(
        &db.url,
        &["requests", "reply", &id.to_string(), REPLY],
        crate::support::cli::NO_ENV,
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("replied to"), "{out}");
    let (code, _, err) = crate::support::cli::maasctl_async(
        &db.url,
        &["requests", "reply", &id.to_string(), "again"],
        crate::support::cli::NO_ENV,
    )
    .await;
    assert_ne!(code, 0);
    assert!(err.contains("not WAITING_USER_INPUT"), "{err}");
    let page = console.page(&format!("/console/requests/{id}")).await;
    assert!(!page.contains("id=\"question\""), "{page}");
}
