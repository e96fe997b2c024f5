//! Approving an answer before its user gets it: a request with review on
//! (its own `review`, or its tenant's `hitl_review`) rests in
//! AWAITING_REVIEW with its answer stored but not logged, not delivered and
//! not called back; an operator approves, edits or rejects it
//! (`app::review`, over HTTP here), once; the tenant's `review_timeout`
//! ends a review nobody gave.

use std::time::Duration;

use maas::app::Principal;
use maas::app::review::{self, Reviewer, Verdict};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::console::browser_logged_in;
use crate::support::db::{TestDb, column, value};
use crate::support::fake_llm::{Api as LlmApi, FakeLlm, Reply};
use crate::support::metrics::metric;
use crate::support::ops::{fast, status_of, wait_status};
use crate::support::tenants::{self, get, send, submit, token};

/// The turns of type `kind` logged for request `id`.
async fn logged(c: &Client, id: Uuid, kind: &str) -> Vec<String> {
    column(
        c,
        "SELECT content FROM raw_logs WHERE request_id = $1 AND message_type = $2 ORDER BY id",
        &[&id, &kind],
    )
    .await
}

/// POSTs a review `body` of request `id` with `tok`.
async fn post_review(api: &Api, tok: &str, id: Uuid, body: Value) -> (StatusCode, Value) {
    let (s, v, _) = send(
        tok,
        api.http.post(api.url(&format!("/api/query/{id}/review"))).json(&body),
    )
    .await;
    (s, v)
}

/// A tenant `name` with a `submit` token (the user's application) and an
/// `operate` token (its reviewer): (user's, reviewer's).
async fn tenant_tokens(c: &Client, name: &str) -> (String, String) {
    (
        token(c, name, "app", "submit").await,
        token(c, name, "reviewer", "operate").await,
    )
}

/// A daemon with the tenant acme and its two tokens.
struct Acme {
    db: TestDb,
    c: Client,
    api: Api,
    /// The user's application's token (submit).
    user: String,
    /// The reviewer's (operate).
    reviewer: String,
}

async fn acme() -> Acme {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = tenants::start(&db, fast()).await;
    let (user, reviewer) = tenant_tokens(&c, "acme").await;
    Acme {
        db,
        c,
        api,
        user,
        reviewer,
    }
}

/// Submits `query` with `review: true` and a callback URL (nothing listens
/// there; the outbox row is what is checked); waits for AWAITING_REVIEW.
async fn submit_for_review(api: &Api, c: &Client, tok: &str, query: &str) -> Uuid {
    let (s, body, _) = submit(
        api,
        tok,
        json!({"user_id": Uuid::new_v4(), "thread_id": Uuid::new_v4(), "query": query,
               "review": true, "callback_url": "http://127.0.0.1:9/hook"}),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");
    let id: Uuid = body["request_id"].as_str().unwrap().parse().unwrap();
    crate::support::wait_until(crate::support::GENEROUS, "the answer awaits review", || async {
        ["AWAITING_REVIEW", "FAILED", "COMPLETED"].contains(&status_of(c, id).await.as_str())
    })
    .await;
    let error: Option<String> = value(c, "SELECT error FROM pipeline_runs WHERE id = $1", &[&id]).await;
    assert_eq!(status_of(c, id).await, "AWAITING_REVIEW", "{error:?}");
    id
}

/// The callback outbox's events of request `id`.
async fn callbacks(c: &Client, id: Uuid) -> Vec<String> {
    column(
        c,
        "SELECT event FROM callback_outbox WHERE run_id = $1 ORDER BY id",
        &[&id],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_reaches_its_user_only_once_approved() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = tenants::start(&db, fast().env("MAAS_HTTP__METRICS_REFRESH_SECS", 1)).await;
    let (user, reviewer) = tenant_tokens(&c, "acme").await;
    let (_, stranger) = tenant_tokens(&c, "globex").await;
    let id = submit_for_review(&api, &c, &user, "Where did I travel in May?").await;
    let answer: String = value(&c, "SELECT final_answer FROM pipeline_runs WHERE id = $1", &[&id]).await;
    assert!(!answer.is_empty());

    // Resting: no lease, not logged, not called back, not shown to the user.
    let leased: bool = value(
        &c,
        "SELECT lease_owner IS NOT NULL FROM pipeline_runs WHERE id = $1",
        &[&id],
    )
    .await;
    assert!(!leased, "a review wait holds no lease");
    assert!(logged(&c, id, "assistant_response").await.is_empty());
    assert!(callbacks(&c, id).await.is_empty(), "no callback before approval");
    api.wait_metric("maas_requests_waiting{kind=\"review\"}", 1.0).await;
    let (s, body) = get(&api, &user, &format!("/api/query/{id}/status?wait=1s")).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "awaiting_review", "{body}");
    assert!(
        body.get("answer").is_none(),
        "the user sees no answer under review: {body}"
    );
    let (_, body) = get(&api, &reviewer, &format!("/api/query/{id}/status")).await;
    assert_eq!(
        (body["status"].as_str(), body["answer"].as_str()),
        (Some("awaiting_review"), Some(answer.as_str())),
        "the reviewer sees the answer under review"
    );

    // A long-poll waiting meanwhile gets the answer when it is approved.
    let poll = {
        let (http, url, tok) = (
            api.http.clone(),
            api.url(&format!("/api/query/{id}/status?wait=60s")),
            user.clone(),
        );
        tokio::spawn(async move { send(&tok, http.get(url)).await })
    };
    // Who may not review: the user's token (scope), another tenant's operator.
    let (s, body) = post_review(&api, &user, id, json!({"action": "approve"})).await;
    assert_eq!(
        (s, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("scope_required")),
        "{body}"
    );
    let (s, body) = post_review(&api, &stranger, id, json!({"action": "approve"})).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "another tenant's operator: {body}");
    assert_eq!(status_of(&c, id).await, "AWAITING_REVIEW");
    assert!(!poll.is_finished(), "the long-poll still waits");

    let (s, body) = post_review(&api, &reviewer, id, json!({"action": "approve"})).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "COMPLETED", "{body}");
    let (s, polled, _) = tokio::time::timeout(Duration::from_secs(30), poll)
        .await
        .expect("the long-poll ends with the approval")
        .unwrap();
    assert_eq!(s, StatusCode::OK, "{polled}");
    assert_eq!(
        (polled["status"].as_str(), polled["answer"].as_str()),
        (Some("completed"), Some(answer.as_str()))
    );
    assert_eq!(logged(&c, id, "assistant_response").await, vec![answer.clone()]);
    assert_eq!(callbacks(&c, id).await, vec!["request.completed".to_owned()]);
    api.wait_metric("maas_requests_waiting{kind=\"review\"}", 0.0).await;
    let page = api.metrics().await;
    assert_eq!(
        metric(&page, "maas_wait_seconds_count{kind=\"review\",outcome=\"approve\"}"),
        Some(1.0),
        "{page}"
    );
    let actions: Vec<String> = column(
        &c,
        "SELECT action || ' ' || actor FROM operator_actions WHERE run_id = $1",
        &[&id],
    )
    .await;
    assert_eq!(actions, vec!["review_approve http".to_owned()]);

    // Once only: a second verdict is refused, naming the status.
    let (s, body) = post_review(&api, &reviewer, id, json!({"action": "reject", "reason": "late"})).await;
    assert_eq!(
        (s, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("not_awaiting_review")),
        "{body}"
    );
    assert!(
        body["error"].to_string().contains("COMPLETED") || body.to_string().contains("COMPLETED"),
        "{body}"
    );
    // Refusals name the field.
    let (s, body) = post_review(&api, &reviewer, id, json!({"action": "edit"})).await;
    assert_eq!(
        (s, body["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("missing_field")),
        "{body}"
    );
    assert!(body.to_string().contains("text"), "{body}");
    let (s, body) = post_review(&api, &reviewer, id, json!({"action": "bless"})).await;
    assert_eq!(
        (s, body["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_field")),
        "{body}"
    );
}

/// An operate token bound to one user reviews that user's answers only:
/// another user's request under review reads as absent, its answer
/// unshown, and its verdict refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewer_bound_to_a_user_reviews_that_users_answers_only() {
    let Acme {
        db: _db, c, api, user, ..
    } = acme().await;
    let mine = submit_for_review(&api, &c, &user, "Where did I travel in May?").await;
    let theirs = submit_for_review(&api, &c, &user, "Where did I travel in June?").await;
    let owner: Uuid = value(
        &c,
        "SELECT coalesce(tenant_user_id, user_id) FROM pipeline_runs WHERE id = $1",
        &[&mine],
    )
    .await;
    let bound = token(&c, "acme", "desk", "operate").await;
    c.execute("UPDATE api_tokens SET user_id = $1 WHERE name = 'desk'", &[&owner])
        .await
        .unwrap();

    let (s, body) = get(&api, &bound, &format!("/api/query/{theirs}/status")).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "another user's request: {body}");
    assert!(body.get("answer").is_none(), "{body}");
    let (s, body) = post_review(&api, &bound, theirs, json!({"action": "approve"})).await;
    assert_eq!(
        (s, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found")),
        "{body}"
    );
    assert_eq!(status_of(&c, theirs).await, "AWAITING_REVIEW");

    let answer: String = value(&c, "SELECT final_answer FROM pipeline_runs WHERE id = $1", &[&mine]).await;
    let (s, body) = get(&api, &bound, &format!("/api/query/{mine}/status")).await;
    assert_eq!(
        (s, body["answer"].as_str()),
        (StatusCode::OK, Some(answer.as_str())),
        "{body}"
    );
    let (s, body) = post_review(&api, &bound, mine, json!({"action": "approve"})).await;
    assert_eq!(
        (s, body["status"].as_str()),
        (StatusCode::OK, Some("COMPLETED")),
        "{body}"
    );
    assert_eq!(status_of(&c, theirs).await, "AWAITING_REVIEW");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_is_what_the_user_gets_and_memory_keeps() {
    let Acme {
        db: _db,
        c,
        api,
        user,
        reviewer,
    } = acme().await;
    let id = submit_for_review(&api, &c, &user, "Where did I travel in May?").await;
    let original: String = value(&c, "SELECT final_answer FROM pipeline_runs WHERE id = $1", &[&id]).await;
    let edited = "You went to Lisbon in May, with your sister.";
    let (s, body) = post_review(&api, &reviewer, id, json!({"action": "edit", "text": edited})).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let (_, body) = get(&api, &user, &format!("/api/query/{id}/status?wait=10s")).await;
    assert_eq!(
        (body["status"].as_str(), body["answer"].as_str()),
        (Some("completed"), Some(edited)),
        "{body}"
    );
    assert_eq!(logged(&c, id, "assistant_response").await, vec![edited.to_owned()]);
    let audit = c
        .query_one(
            "SELECT action, detail ->> 'original' AS original, detail ->> 'edited' AS edited
             FROM operator_actions WHERE run_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(audit.get::<_, String>("action"), "review_edit");
    assert_eq!(audit.get::<_, Option<String>>("original"), Some(original));
    assert_eq!(audit.get::<_, Option<String>>("edited").as_deref(), Some(edited));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_fails_the_request_with_its_reason() {
    let Acme {
        db: _db,
        c,
        api,
        user,
        reviewer,
    } = acme().await;
    let id = submit_for_review(&api, &c, &user, "Where did I travel in May?").await;
    let (s, body) = post_review(
        &api,
        &reviewer,
        id,
        json!({"action": "reject", "reason": "it names the wrong city", "then": "fail"}),
    )
    .await;
    assert_eq!((s, body["status"].as_str()), (StatusCode::OK, Some("FAILED")), "{body}");
    let (_, body) = get(&api, &user, &format!("/api/query/{id}/status")).await;
    assert_eq!(body["status"], "failed", "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.contains("it names the wrong city"), "{body}");
    assert!(
        logged(&c, id, "assistant_response").await.is_empty(),
        "a rejected answer is not memory"
    );
    assert_eq!(callbacks(&c, id).await, vec!["request.failed".to_owned()]);
}

/// Rejected with `then: redo`, the request goes back to the responder with
/// the reviewer's note in its context (the model's second prompt holds
/// it), and its new answer awaits review again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_can_send_the_answer_back_with_the_note() {
    let fake = FakeLlm::start().await;
    let analysis = json!({"needs_context": false, "context_type": "none", "time_scope": "none",
                          "search_keywords": ["trip"], "context_found": null});
    fake.push(LlmApi::OpenAi, Reply::text(analysis.to_string()));
    fake.push(LlmApi::OpenAi, Reply::text("Paris."));
    fake.push(LlmApi::OpenAi, Reply::text("Lisbon."));
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = tenants::start(
        &db,
        fast()
            .env("MAAS_LLM_PROVIDER", "openai")
            .env("OPENAI_BASE_URL", fake.openai_base_url())
            .env("OPENAI_API_KEY", "sk-test"),
    )
    .await;
    let (user, reviewer) = tenant_tokens(&c, "acme").await;
    let id = submit_for_review(&api, &c, &user, "Where did I travel in May?").await;
    let (s, body) = post_review(
        &api,
        &reviewer,
        id,
        json!({"action": "reject", "reason": "check the <May> trip: it was Lisbon", "then": "redo"}),
    )
    .await;
    assert_eq!((s, body["status"].as_str()), (StatusCode::OK, Some("READY")), "{body}");
    crate::support::wait_until(crate::support::GENEROUS, "the second answer awaits review", || async {
        let again: Vec<Option<String>> = column(
            &c,
            "SELECT final_answer FROM pipeline_runs WHERE id = $1 AND status = 'AWAITING_REVIEW'",
            &[&id],
        )
        .await;
        again == [Some("Lisbon.".to_owned())]
    })
    .await;
    let prompts = fake.requests_for(LlmApi::OpenAi);
    assert_eq!(prompts.len(), 3, "analyzer, responder, responder again");
    let second = prompts[2].body.to_string();
    assert!(
        second.contains("<review_note>") && second.contains("check the &lt;May&gt; trip: it was Lisbon"),
        "the note, quoted, is in the responder's context: {second}"
    );
    assert!(!prompts[1].body.to_string().contains("<review_note>"));
    assert!(logged(&c, id, "assistant_response").await.is_empty());
}

/// Two reviewers at once: one verdict applies, the other is refused, and
/// the answer is logged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reviewers_at_once_apply_one_verdict() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let pool = db.pool();
    for round in 0..5 {
        let id: Uuid = value(
            &c,
            "INSERT INTO pipeline_runs (user_id, thread_id, user_query) VALUES (gen_random_uuid(), gen_random_uuid(), 'q')
             RETURNING id",
            &[],
        )
        .await;
        c.execute(
            "UPDATE pipeline_runs SET status = 'AWAITING_REVIEW', final_answer = 'the answer' WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
        let (a, b) = (pool.get().await.unwrap(), pool.get().await.unwrap());
        let who = Principal::default_admin("test");
        let approve = Verdict::Approve;
        let edit = Verdict::Edit("an edit".into());
        let (ra, rb) = tokio::join!(
            review::review(&a, Reviewer::Caller(&who), "alice", id, &approve),
            review::review(&b, Reviewer::Operator, "bob", id, &edit),
        );
        let refused = match (ra, rb) {
            (Ok(_), Err(e)) | (Err(e), Ok(_)) => e,
            other => panic!("round {round}: one verdict applies, the other is refused: {other:?}"),
        };
        assert_eq!(refused.code.as_str(), "not_awaiting_review", "{refused:?}");
        assert!(refused.message.contains("COMPLETED"), "{refused:?}");
        let logs = logged(&c, id, "assistant_response").await;
        assert_eq!(logs.len(), 1, "round {round}: {logs:?}");
        let actions: i64 = value(&c, "SELECT count(*) FROM operator_actions WHERE run_id = $1", &[&id]).await;
        assert_eq!(actions, 1);
    }
}

/// A review nobody gives ends with the tenant's `review_timeout`: failed
/// naming the limit, or delivered as it was (and logged), as the tenant
/// chose; the tenant's `hitl_review` turns review on for every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreviewed_answer_expires_as_its_tenant_chose() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = tenants::start(&db, fast().env("MAAS_HTTP__METRICS_REFRESH_SECS", 1)).await;
    let mut ids = Vec::new();
    for (name, policy) in [("strict", "fail"), ("lenient", "answer")] {
        let (user, _) = tenant_tokens(&c, name).await;
        c.execute(
            "UPDATE tenants SET hitl_review = true, review_timeout = interval '1 second', on_review_timeout = $2
             WHERE name = $1",
            &[&name, &policy],
        )
        .await
        .unwrap();
        let (s, body, _) = submit(
            &api,
            &user,
            json!({"user_id": Uuid::new_v4(), "query": "Where did I travel in May?"}),
        )
        .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{body}");
        ids.push(body["request_id"].as_str().unwrap().parse::<Uuid>().unwrap());
    }
    let (strict, lenient) = (ids[0], ids[1]);
    wait_status(&c, strict, "FAILED").await;
    wait_status(&c, lenient, "COMPLETED").await;
    for status in ["FAILED", "COMPLETED"] {
        api.wait_metric(
            &format!("maas_wait_expiries_total{{kind=\"review\",status=\"{status}\"}}"),
            1.0,
        )
        .await;
    }
    let error: String = value(&c, "SELECT error FROM pipeline_runs WHERE id = $1", &[&strict]).await;
    assert!(error.contains("review_timeout"), "{error}");
    assert!(logged(&c, strict, "assistant_response").await.is_empty());
    let answer: String = value(&c, "SELECT final_answer FROM pipeline_runs WHERE id = $1", &[&lenient]).await;
    assert_eq!(logged(&c, lenient, "assistant_response").await, vec![answer]);
    // The delivered answer waited out the limit after the responder
    // answered: it was not completed by the responder itself.
    let waited: bool = value(
        &c,
        "SELECT r.updated_at - (s.started_at + s.latency_ms * interval '1 millisecond') >= interval '900 milliseconds'
         FROM pipeline_runs r JOIN pipeline_steps s ON s.run_id = r.id AND s.stage = 'respond'
         WHERE r.id = $1",
        &[&lenient],
    )
    .await;
    assert!(waited, "the answer was held for review until its limit");
}

/// In headless Chromium: an operator approves the answer on the request's
/// page, and the user's long-poll, waiting meanwhile, gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approving_in_the_console_answers_the_users_long_poll() {
    let Acme {
        db: _db, c, api, user, ..
    } = acme().await;
    let id = submit_for_review(&api, &c, &user, "Where did I travel in May?").await;
    let answer: String = value(&c, "SELECT final_answer FROM pipeline_runs WHERE id = $1", &[&id]).await;
    let poll = {
        let (http, url, tok) = (
            api.http.clone(),
            api.url(&format!("/api/query/{id}/status?wait=90s")),
            user.clone(),
        );
        tokio::spawn(async move { send(&tok, http.get(url)).await })
    };
    let Some(b) = browser_logged_in(&api, tenants::ADMIN).await else {
        poll.abort();
        return;
    };
    // The list's filter finds it; its page shows the answer under review.
    b.goto_live(&api.url("/console/requests")).await;
    b.click("#f-awaiting-review").await;
    b.wait_js(
        "the list of answers awaiting review",
        "return location.search === '?status=AWAITING_REVIEW' && document.querySelector('#f-status').value === 'AWAITING_REVIEW';",
    )
    .await;
    assert!(
        b.text("#rows").await.contains(&id.to_string()),
        "{}",
        b.text("#rows").await
    );
    b.goto_live(&api.url(&format!("/console/requests/{id}"))).await;
    assert_eq!(b.text("#review-answer").await.trim(), answer.trim());
    assert!(!poll.is_finished(), "the user's long-poll waits for the review");
    b.click("#review-approve").await;
    b.wait_js(
        "the page shows COMPLETED",
        "return document.querySelector('#status').textContent.trim() === 'COMPLETED';",
    )
    .await;
    let (s, polled, _) = tokio::time::timeout(Duration::from_secs(30), poll)
        .await
        .expect("the long-poll ends with the approval")
        .unwrap();
    assert_eq!(s, StatusCode::OK, "{polled}");
    assert_eq!(
        (polled["status"].as_str(), polled["answer"].as_str()),
        (Some("completed"), Some(answer.as_str()))
    );
    let actor: String = value(
        &c,
        "SELECT actor FROM operator_actions WHERE run_id = $1 AND action = 'review_approve'",
        &[&id],
    )
    .await;
    assert_eq!(actor, "config", "recorded as the session's token");
    b.screenshot("review-approved").await;
    b.close().await;
}

/// A request that asks to stream and for review streams nothing: its
/// pieces would show the answer before the verdict. (A request that only
/// streams, beside it, shows that the daemon writes pieces.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_under_review_streams_no_pieces() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = crate::support::daemon::Maasd::spawn(&db.url, fast().env("MAAS_LLM__OFFLINE__STREAM_PACE_MS", 5));
    let insert = |review: bool| {
        let c = &c;
        async move {
            value::<Uuid>(
                c,
                "INSERT INTO pipeline_runs (user_id, user_query, stream, review)
                 VALUES (gen_random_uuid(), 'where did I travel in May with my sister and her dog?', true, $1)
                 RETURNING id",
                &[&review],
            )
            .await
        }
    };
    let (reviewed, streamed) = (insert(true).await, insert(false).await);
    wait_status(&c, reviewed, "AWAITING_REVIEW").await;
    wait_status(&c, streamed, "COMPLETED").await;
    let pieces = |id: Uuid| {
        let c = &c;
        async move { value::<i64>(c, "SELECT count(*) FROM answer_deltas WHERE request_id = $1", &[&id]).await }
    };
    assert!(pieces(streamed).await > 0, "the streamed answer was written in pieces");
    assert_eq!(pieces(reviewed).await, 0, "no piece of an answer under review");
}

/// `maasctl requests review`: the same verdict as the other doors, as an
/// operator of every tenant; a second one is refused (exit 1) naming the
/// status; a usage error names the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maasctl_reviews_as_the_other_doors_do() {
    use crate::support::cli::{NO_ENV, maasctl_async};
    let db = TestDb::new().await;
    let c = db.client().await;
    let tenant: Uuid = value(&c, "INSERT INTO tenants (name) VALUES ('acme') RETURNING id", &[]).await;
    let id: Uuid = value(
        &c,
        "INSERT INTO pipeline_runs (user_id, thread_id, user_query, tenant_id)
         VALUES (gen_random_uuid(), gen_random_uuid(), 'q', $1) RETURNING id",
        &[&tenant],
    )
    .await;
    c.execute(
        "UPDATE pipeline_runs SET status = 'AWAITING_REVIEW', final_answer = 'the answer' WHERE id = $1",
        &[&id],
    )
    .await
    .unwrap();
    let sid = id.to_string();
    let (code, out, err) = maasctl_async(
        &db.url,
        &["requests", "review", &sid, "--edit", "the edited answer"],
        NO_ENV,
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("COMPLETED"), "{out}");
    assert_eq!(
        logged(&c, id, "assistant_response").await,
        vec!["the edited answer".to_owned()]
    );
    // `requests show` (and the user's export, which reads requests alike)
    // holds the review with the original text.
    let (code, out, err) = maasctl_async(&db.url, &["--json", "requests", "show", &sid], NO_ENV).await;
    assert_eq!(code, 0, "{err}");
    let shown: Value = serde_json::from_str(out.trim()).unwrap();
    let reviews = &shown["request"]["reviews"];
    assert_eq!(
        (
            reviews[0]["action"].as_str(),
            reviews[0]["original"].as_str(),
            reviews[0]["edited"].as_str()
        ),
        (Some("review_edit"), Some("the answer"), Some("the edited answer")),
        "{shown}"
    );
    let (code, _, err) = maasctl_async(&db.url, &["requests", "review", &sid, "--approve"], NO_ENV).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("COMPLETED") && err.contains("AWAITING_REVIEW"), "{err}");
    let (code, _, err) = maasctl_async(&db.url, &["requests", "review", &sid, "--redo"], NO_ENV).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--reject"), "{err}");

    // A verdict the database refuses: the operator reads the server's own
    // words (message, SQLSTATE, constraint), and the request still waits.
    let refused: Uuid = value(
        &c,
        "INSERT INTO pipeline_runs (user_id, thread_id, user_query, tenant_id)
         VALUES (gen_random_uuid(), gen_random_uuid(), 'q2', $1) RETURNING id",
        &[&tenant],
    )
    .await;
    c.batch_execute(&format!(
        "UPDATE pipeline_runs SET status = 'AWAITING_REVIEW', final_answer = 'an answer' WHERE id = '{refused}';
         CREATE FUNCTION refuse_answers() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             RAISE EXCEPTION 'answers are frozen for the audit'
                 USING ERRCODE = '23514', CONSTRAINT = 'audit_freeze';
         END $$;
         CREATE TRIGGER refuse_answers BEFORE INSERT ON raw_logs FOR EACH ROW
             WHEN (NEW.message_type = 'assistant_response') EXECUTE FUNCTION refuse_answers();"
    ))
    .await
    .unwrap();
    let (code, _, err) = maasctl_async(
        &db.url,
        &["requests", "review", &refused.to_string(), "--approve"],
        NO_ENV,
    )
    .await;
    assert_eq!(code, 2, "{err}");
    for part in [
        "answers are frozen for the audit",
        "SQLSTATE 23514",
        "audit_freeze",
        &refused.to_string(),
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    let status: String = value(&c, "SELECT status FROM pipeline_runs WHERE id = $1", &[&refused]).await;
    assert_eq!(status, "AWAITING_REVIEW");
}

/// A receiver of callbacks on loopback: the JSON bodies it got.
async fn callback_receiver() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::extract::State;
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    async fn hook(State(got): State<std::sync::Arc<std::sync::Mutex<Vec<Value>>>>, body: String) -> StatusCode {
        got.lock()
            .unwrap()
            .push(serde_json::from_str(&body).unwrap_or(Value::Null));
        StatusCode::NO_CONTENT
    }
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(hook))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hook"), got)
}

/// The callback of an answer under review is delivered once it is
/// approved, with the approved answer, and not before: a request without
/// review, submitted after it, is called back while it still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_is_delivered_only_after_approval() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (hook, got) = callback_receiver().await;
    let _d = crate::support::daemon::Maasd::spawn(
        &db.url,
        fast()
            .env("MAAS_CALLBACKS__SECRET", "cb-secret-for-tests")
            .env("MAAS_CALLBACKS__POLL_SECS", 1)
            .env("MAAS_CALLBACKS__ALLOW_NETWORKS", "127.0.0.0/8, ::1"),
    );
    let insert = |review: bool| {
        let (c, hook) = (&c, hook.clone());
        async move {
            value::<Uuid>(
                c,
                "INSERT INTO pipeline_runs (user_id, user_query, callback_url, review)
                 VALUES (gen_random_uuid(), 'where did I travel in May?', $1, $2) RETURNING id",
                &[&hook, &review],
            )
            .await
        }
    };
    let reviewed = insert(true).await;
    wait_status(&c, reviewed, "AWAITING_REVIEW").await;
    let plain = insert(false).await;
    let called = |id: Uuid| {
        let got = got.clone();
        move || {
            let got = got.clone();
            async move { got.lock().unwrap().iter().any(|b| b["id"] == json!(id)) }
        }
    };
    crate::support::wait_until(crate::support::GENEROUS, "the plain request's callback", called(plain)).await;
    assert!(!called(reviewed)().await, "no callback while the answer awaits review");

    let pool = db.pool();
    let client = pool.get().await.unwrap();
    let edit = Verdict::Edit("You went to Lisbon.".into());
    review::review(&client, Reviewer::Operator, "oncall", reviewed, &edit)
        .await
        .unwrap();
    crate::support::wait_until(
        crate::support::GENEROUS,
        "the reviewed request's callback",
        called(reviewed),
    )
    .await;
    let bodies = got.lock().unwrap().clone();
    let body = bodies.iter().find(|b| b["id"] == json!(reviewed)).unwrap();
    assert_eq!(
        (body["status"].as_str(), body["answer"].as_str()),
        (Some("COMPLETED"), Some("You went to Lisbon."))
    );
}
