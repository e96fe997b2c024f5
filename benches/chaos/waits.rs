//! Requests that wait for a person, in the chaos run. A share of the load
//! asks for it: one request in [`SHARE`] is submitted with `clarify` on and
//! a query the fake provider's analysis asks about, another with `review`
//! on. A replier (the user) answers each request in `WAITING_USER_INPUT`,
//! by turns through the SQL door (`INSERT INTO pipeline_replies`) and
//! `POST /api/query/{id}/reply`; a reviewer (the operator) approves each in
//! `AWAITING_REVIEW` with `POST /api/query/{id}/review`. Both poll the
//! database, go on through every fault and the drain, and try again after
//! any error: a reply or a review whose acknowledgement was lost is sent
//! again, and must be refused (the request no longer waits), never applied
//! twice. No tenant sets a wait's time limit, so no wait may expire.
//!
//! [`checks`] are the invariants of the waits, counted with the run's others.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::Shared;
use crate::support::{count, try_connect};

/// One request in `SHARE` asks its user, and another one in `SHARE` needs
/// a review.
const SHARE: u64 = 10;
/// In the query of a request that asks: the fake provider's analysis of it
/// carries the question (with the analyzer's `"may_ask_user":true`).
pub const CLARIFY_MARK: &str = "chaos clarify";
/// The question the fake's analysis asks.
const QUESTION: &str = "Which of your two trips do you mean?";
/// How often the replier and the reviewer look for waiting requests.
const POLL: Duration = Duration::from_millis(250);

/// What a submission asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    None,
    Clarify,
    Review,
}

impl Wait {
    /// The wait of submission number `n`.
    pub fn of(n: u64) -> Wait {
        match n % SHARE {
            1 => Wait::Clarify,
            2 => Wait::Review,
            _ => Wait::None,
        }
    }

    /// The query's prefix, so that the fake asks about a clarify request.
    pub fn prefix(self) -> &'static str {
        match self {
            Wait::Clarify => "chaos clarify ",
            Wait::Review => "chaos review ",
            Wait::None => "chaos ",
        }
    }

    /// The request's `clarify` and `review` (NULL: the tenant's, off).
    pub fn flags(self) -> (Option<bool>, Option<bool>) {
        match self {
            Wait::Clarify => (Some(true), None),
            Wait::Review => (None, Some(true)),
            Wait::None => (None, None),
        }
    }
}

/// The needles of the fake's rule for a request that may ask: its mark, and
/// the analyzer's input saying it may (the compact JSON inside the message
/// text; the prompt's own mention has a space). A request analyzed again
/// after the reply says `clarification` instead and gets the default reply.
pub fn needles() -> [&'static str; 2] {
    [CLARIFY_MARK, r#"\"may_ask_user\":true"#]
}

/// The fake's analysis that asks: `analysis` (a valid analysis as JSON
/// text) with `clarify: {"question": …}`.
pub fn asking(analysis: &str) -> String {
    let mut v: Value = serde_json::from_str(analysis).unwrap();
    v["clarify"] = json!({"question": QUESTION});
    v.to_string()
}

/// What the replier and the reviewer did.
#[derive(Default)]
pub struct Tally {
    pub replies_sql: AtomicU64,
    pub replies_http: AtomicU64,
    pub reviews: AtomicU64,
    /// Sent again after a lost acknowledgement, and refused: the request
    /// had moved on.
    pub refused: AtomicU64,
    /// Connection errors, timeouts and answers from a daemon that was
    /// going down; tried again.
    pub errors: AtomicU64,
}

/// The ids of up to 50 requests in `status`, read on the task's own
/// connection (made again after an error, which is counted).
async fn waiting(url: &str, db: &mut Option<Client>, shared: &Shared, status: &str) -> Option<Vec<Uuid>> {
    let c = connected(url, db, shared).await?;
    match c
        .query("SELECT id FROM pipeline_runs WHERE status = $1 LIMIT 50", &[&status])
        .await
    {
        Ok(rows) => Some(rows.iter().map(|r| r.get(0)).collect()),
        Err(_) => {
            shared.waits.errors.fetch_add(1, Ordering::Relaxed);
            *db = None;
            None
        }
    }
}

/// The user: answers every request that waits for a reply, by turns over
/// SQL and HTTP, until `stop`.
pub async fn replier(url: String, shared: Arc<Shared>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let http = client();
    let mut db: Option<Client> = None;
    let mut turn = 0u64;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(POLL) => {}
        }
        let Some(ids) = waiting(&url, &mut db, &shared, "WAITING_USER_INPUT").await else {
            continue;
        };
        let Some(c) = db.as_ref() else {
            continue;
        };
        for id in ids {
            let text = format!("chaos reply to {id}");
            turn += 1;
            if turn % 2 == 0 {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&id, &text];
                let insert = c.execute("INSERT INTO pipeline_replies (run_id, text) VALUES ($1, $2)", &params);
                match tokio::time::timeout(Duration::from_secs(10), insert).await {
                    Ok(Ok(_)) => shared.waits.replies_sql.fetch_add(1, Ordering::Relaxed),
                    // Not waiting any more (object_not_in_prerequisite_state).
                    Ok(Err(e)) if e.code().is_some_and(|s| s.code() == "55000") => {
                        shared.waits.refused.fetch_add(1, Ordering::Relaxed)
                    }
                    _ => {
                        db = None;
                        shared.waits.errors.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                };
            } else {
                let body = json!({"text": text});
                post(
                    &http,
                    &shared,
                    &format!("/api/query/{id}/reply"),
                    &body,
                    &shared.waits.replies_http,
                )
                .await;
            }
        }
    }
}

/// The operator: approves every answer that awaits review, over HTTP,
/// until `stop`.
pub async fn reviewer(url: String, shared: Arc<Shared>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let http = client();
    let mut db: Option<Client> = None;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(POLL) => {}
        }
        let Some(ids) = waiting(&url, &mut db, &shared, "AWAITING_REVIEW").await else {
            continue;
        };
        for id in ids {
            let body = json!({"action": "approve"});
            post(
                &http,
                &shared,
                &format!("/api/query/{id}/review"),
                &body,
                &shared.waits.reviews,
            )
            .await;
        }
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// The poller's connection, reconnecting when it broke.
async fn connected<'a>(url: &str, db: &'a mut Option<Client>, shared: &Shared) -> Option<&'a Client> {
    if db.as_ref().is_none_or(Client::is_closed) {
        *db = tokio::time::timeout(Duration::from_secs(5), try_connect(url))
            .await
            .ok()
            .and_then(Result::ok);
        if db.is_none() {
            shared.waits.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
    db.as_ref()
}

/// POSTs `body` to `path` on a random daemon that is up: a 2xx counts in
/// `applied`, a 409 (the request moved on) as refused, anything else as an
/// error (the poller finds the request again if it still waits).
async fn post(http: &reqwest::Client, shared: &Shared, path: &str, body: &Value, applied: &AtomicU64) {
    let Some(addr) = shared.random_up() else { return };
    let tally = &shared.waits;
    match http.post(format!("http://{addr}{path}")).json(body).send().await {
        Ok(r) if r.status().is_success() => applied.fetch_add(1, Ordering::Relaxed),
        Ok(r) if r.status().as_u16() == 409 => tally.refused.fetch_add(1, Ordering::Relaxed),
        _ => tally.errors.fetch_add(1, Ordering::Relaxed),
    };
}

/// A request that waited: its question was logged, or a review applied.
const WAITED: &str =
    "(EXISTS (SELECT 1 FROM raw_logs l WHERE l.request_id = r.id AND l.message_type = 'assistant_question')
                      OR EXISTS (SELECT 1 FROM operator_actions a WHERE a.run_id = r.id AND a.action LIKE 'review_%'))";

/// The waits' invariants: (what, query counting the violations).
pub fn checks() -> Vec<(&'static str, String)> {
    let reviews = "(SELECT count(*) FROM operator_actions a WHERE a.run_id = r.id AND a.action LIKE 'review_%')";
    let replies = "(SELECT count(*) FROM raw_logs l WHERE l.request_id = r.id AND l.message_type = 'user_reply')";
    vec![
        (
            "request that asked without exactly one reply logged",
            format!(
                "SELECT count(*) FROM pipeline_runs r WHERE EXISTS (SELECT 1 FROM raw_logs l
                     WHERE l.request_id = r.id AND l.message_type = 'assistant_question') AND {replies} <> 1"
            ),
        ),
        (
            "reply logged for a request that asked nothing",
            "SELECT count(*) FROM raw_logs l WHERE l.message_type = 'user_reply' AND NOT EXISTS (
                 SELECT 1 FROM raw_logs q WHERE q.request_id = l.request_id AND q.message_type = 'assistant_question')"
                .to_owned(),
        ),
        (
            "request with clarify on that COMPLETED without asking",
            format!(
                "SELECT count(*) FROM pipeline_runs r WHERE r.clarify AND r.status = 'COMPLETED' AND r.user_query LIKE '{CLARIFY_MARK}%'
                   AND NOT EXISTS (SELECT 1 FROM raw_logs l WHERE l.request_id = r.id AND l.message_type = 'assistant_question')"
            ),
        ),
        (
            "request with review on that COMPLETED without exactly one review",
            format!("SELECT count(*) FROM pipeline_runs r WHERE r.review AND r.status = 'COMPLETED' AND {reviews} <> 1"),
        ),
        (
            "review applied to a request twice, or to one without review on",
            format!("SELECT count(*) FROM pipeline_runs r WHERE {reviews} > CASE WHEN r.review THEN 1 ELSE 0 END"),
        ),
        (
            "request that waited and did not end COMPLETED (or FAILED by a stage's error policy)",
            format!(
                "SELECT count(*) FROM pipeline_runs r WHERE {WAITED} AND r.status <> 'COMPLETED'
                   AND NOT (r.status = 'FAILED' AND r.error NOT LIKE 'no reply from the user%'
                            AND r.error NOT LIKE 'no review within%' AND r.error NOT LIKE 'rejected in review%'
                            AND NOT EXISTS (SELECT 1 FROM operator_actions a WHERE a.run_id = r.id))"
            ),
        ),
        (
            "wait expired",
            "SELECT count(*) FROM pipeline_runs r WHERE r.error LIKE 'no reply from the user%' OR r.error LIKE 'no review within%'"
                .to_owned(),
        ),
    ]
}

/// The waits' figures: requests that asked, replies logged, reviews
/// applied, requests that waited and how many of them COMPLETED.
pub async fn figures(c: &Client) -> [i64; 5] {
    [
        count(
            c,
            "SELECT count(*) FROM raw_logs WHERE message_type = 'assistant_question'",
        )
        .await,
        count(c, "SELECT count(*) FROM raw_logs WHERE message_type = 'user_reply'").await,
        count(c, "SELECT count(*) FROM operator_actions WHERE action LIKE 'review_%'").await,
        count(c, &format!("SELECT count(*) FROM pipeline_runs r WHERE {WAITED}")).await,
        count(
            c,
            &format!("SELECT count(*) FROM pipeline_runs r WHERE {WAITED} AND r.status = 'COMPLETED'"),
        )
        .await,
    ]
}
