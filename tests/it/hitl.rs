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
