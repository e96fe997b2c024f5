//! Requests that wait for a person, in the chaos run. A share of the load
//! asks for it: of every [`SHARE`] submissions, two are submitted with
//! `clarify` on and a query the fake provider's analysis asks about, two
//! with `review` on, and one of each kind more ends its wait otherwise:
//!
//! - answered: a replier (the user) answers each request in
//!   `WAITING_USER_INPUT`, by turns through the SQL door
//!   (`INSERT INTO pipeline_replies`) and `POST /api/query/{id}/reply`; a
//!   reviewer (the operator) approves each in `AWAITING_REVIEW` with
//!   `POST /api/query/{id}/review`;
//! - cancelled: the replier or the reviewer cancels the wait instead
//!   (`POST /api/query/{id}/cancel`), which must stop it for good;
//! - expired: inserted over SQL for the tenant [`EXPIRY_TENANT`], whose
//!   waits end after [`EXPIRY_SECS`] (a question unanswered is answered
//!   without the reply, a review missed fails); nobody answers them, and
//!   the daemons' sweeps must end each once, not before its time, through
//!   every kill and restart.
//!
//! The people poll the database, go on through every fault and the drain,
//! and try again after any error: a reply, a review or a cancel whose
//! acknowledgement was lost is sent again, and must be refused (the request
//! no longer waits), never applied twice. The default tenant sets no time
//! limit, so none of its waits may expire.
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

/// Of every `SHARE` submissions, two ask their user and two need a
/// review, answered; one of each is cancelled, and one of each expires.
const SHARE: u64 = 20;
/// In the query of a request that asks: the fake provider's analysis of it
/// carries the question (with the analyzer's `"may_ask_user":true`).
pub const CLARIFY_MARK: &str = "chaos clarify";
/// The question the fake's analysis asks.
const QUESTION: &str = "Which of your two trips do you mean?";
/// How often the replier and the reviewer look for waiting requests.
const POLL: Duration = Duration::from_millis(250);
/// The tenant whose waits expire, and after how long (both waits; a missed
/// reply is answered without it, a missed review fails).
pub const EXPIRY_TENANT: Uuid = Uuid::from_u128(0x000c_4a05_0000_4000_8000_0000_0000_0e01);
pub const EXPIRY_SECS: u32 = 4;

/// What a submission waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    None,
    Clarify,
    Review,
}

/// How its wait ends.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The replier or the reviewer answers.
    Answered,
    /// The replier or the reviewer cancels the request.
    Cancelled,
    /// Nobody answers; the tenant's limit ends the wait.
    Expires,
}

/// A submission's wait and the way it ends.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub wait: Wait,
    pub end: End,
}

impl Plan {
    /// The plan of submission number `n`.
    pub fn of(n: u64) -> Plan {
        let (wait, end) = match n % SHARE {
            1 | 11 => (Wait::Clarify, End::Answered),
            2 | 12 => (Wait::Review, End::Answered),
            3 => (Wait::Clarify, End::Cancelled),
            13 => (Wait::Review, End::Cancelled),
            5 => (Wait::Clarify, End::Expires),
            15 => (Wait::Review, End::Expires),
            _ => (Wait::None, End::Answered),
        };
        Plan { wait, end }
    }

    /// The plan over HTTP, whose submissions (without tokens) are the
    /// default tenant's: one that would expire waits for nothing.
    pub fn over_http(self) -> Plan {
        match self.end {
            End::Expires => Plan {
                wait: Wait::None,
                end: End::Answered,
            },
            _ => self,
        }
    }

    /// The query's prefix: the fake asks about every clarify request; the
    /// people tell the ones to cancel by theirs.
    pub fn prefix(self) -> &'static str {
        match (self.wait, self.end) {
            (Wait::Clarify, End::Answered) => "chaos clarify ",
            (Wait::Clarify, End::Cancelled) => "chaos clarify cancel ",
            (Wait::Clarify, End::Expires) => "chaos clarify expire ",
            (Wait::Review, End::Answered) => "chaos review ",
            (Wait::Review, End::Cancelled) => "chaos review cancel ",
            (Wait::Review, End::Expires) => "chaos review expire ",
            (Wait::None, _) => "chaos ",
        }
    }

    /// The request's `clarify` and `review` (NULL: the tenant's, off).
    pub fn flags(self) -> (Option<bool>, Option<bool>) {
        match self.wait {
            Wait::Clarify => (Some(true), None),
            Wait::Review => (None, Some(true)),
            Wait::None => (None, None),
        }
    }

    /// The tenant the request is inserted for (None: the default).
    pub fn tenant(self) -> Option<Uuid> {
        (self.end == End::Expires && self.wait != Wait::None).then_some(EXPIRY_TENANT)
    }
}

/// Makes the tenant whose waits expire.
pub async fn create_tenant(c: &Client) {
    let limit = format!("{EXPIRY_SECS} seconds");
    c.execute(
        "INSERT INTO tenants (id, name, user_reply_timeout, on_reply_timeout, review_timeout, on_review_timeout)
         VALUES ($1, 'chaos-expiry', $2::text::interval, 'answer', $2::text::interval, 'fail')",
        &[&EXPIRY_TENANT, &limit],
    )
    .await
    .unwrap();
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
    /// Waits cancelled instead of answered.
    pub cancels: AtomicU64,
    /// Sent again after a lost acknowledgement, and refused: the request
    /// had moved on.
    pub refused: AtomicU64,
    /// Connection errors, timeouts and answers from a daemon that was
    /// going down; tried again.
    pub errors: AtomicU64,
}

/// Up to 50 of the default tenant's requests in `status`: each id, and
/// whether its plan is to be cancelled. Read on the task's own connection
/// (made again after an error, which is counted).
async fn waiting(url: &str, db: &mut Option<Client>, shared: &Shared, status: &str) -> Option<Vec<(Uuid, bool)>> {
    let c = connected(url, db, shared).await?;
    match c
        .query(
            "SELECT id, user_query LIKE 'chaos % cancel %' FROM pipeline_runs
             WHERE status = $1 AND tenant_id = '00000000-0000-0000-0000-000000000000' LIMIT 50",
            &[&status],
        )
        .await
    {
        Ok(rows) => Some(rows.iter().map(|r| (r.get(0), r.get(1))).collect()),
        Err(_) => {
            shared.waits.errors.fetch_add(1, Ordering::Relaxed);
            *db = None;
            None
        }
    }
}

/// Cancels request `id` over HTTP (scope operate).
async fn cancel(http: &reqwest::Client, shared: &Shared, id: Uuid) {
    let body = json!({"reason": "chaos: the person went away"});
    post(
        http,
        shared,
        &format!("/api/query/{id}/cancel"),
        &body,
        &shared.waits.cancels,
    )
    .await;
}

/// The user: answers every request that waits for a reply, by turns over
/// SQL and HTTP, or cancels the ones planned so, until `stop`.
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
        for (id, to_cancel) in ids {
            if to_cancel {
                cancel(&http, &shared, id).await;
                continue;
            }
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

/// The operator: approves every answer that awaits review over HTTP, or
/// cancels the ones planned so, until `stop`.
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
        for (id, to_cancel) in ids {
            if to_cancel {
                cancel(&http, &shared, id).await;
                continue;
            }
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
/// Whether request `r` asked its user.
const ASKED: &str =
    "EXISTS (SELECT 1 FROM raw_logs q WHERE q.request_id = r.id AND q.message_type = 'assistant_question')";
/// Whether request `r`, with review on, had an answer to review.
const ANSWERED_FOR_REVIEW: &str = "(r.review AND EXISTS (SELECT 1 FROM pipeline_steps s
                                  WHERE s.run_id = r.id AND s.stage = 'respond' AND s.outcome = 'succeeded'))";
/// Request `r`'s plan is to be cancelled while it waits.
const CANCEL: &str = "r.user_query LIKE 'chaos % cancel %'";

/// Request `r`'s plan is to expire.
fn expires() -> String {
    format!("r.tenant_id = '{EXPIRY_TENANT}'")
}

/// Request `r`'s plan is to be answered.
fn answered() -> String {
    format!("(NOT {CANCEL} AND NOT {})", expires())
}

/// The waits' invariants: (what, query counting the violations).
#[allow(clippy::too_many_lines, reason = "a list of checks, one per invariant")]
pub fn checks() -> Vec<(&'static str, String)> {
    let reviews = "(SELECT count(*) FROM operator_actions a WHERE a.run_id = r.id AND a.action LIKE 'review_%')";
    let replies = "(SELECT count(*) FROM raw_logs l WHERE l.request_id = r.id AND l.message_type = 'user_reply')";
    let answered = answered();
    let expires = expires();
    let limit = format!("interval '{EXPIRY_SECS} seconds'");
    vec![
        (
            "request that asked without exactly one reply logged",
            format!("SELECT count(*) FROM pipeline_runs r WHERE {answered} AND {ASKED} AND {replies} <> 1"),
        ),
        (
            "reply logged for a request that asked nothing",
            "SELECT count(*) FROM raw_logs l WHERE l.message_type = 'user_reply' AND NOT EXISTS (
                 SELECT 1 FROM raw_logs q WHERE q.request_id = l.request_id AND q.message_type = 'assistant_question')"
                .to_owned(),
        ),
        (
            "reply or review applied to a request nobody answered (cancelled, or left to expire)",
            format!("SELECT count(*) FROM pipeline_runs r WHERE NOT {answered} AND {replies} + {reviews} > 0"),
        ),
        (
            "request with clarify on that COMPLETED without asking",
            format!(
                "SELECT count(*) FROM pipeline_runs r WHERE r.clarify AND r.status = 'COMPLETED' AND r.user_query LIKE '{CLARIFY_MARK}%'
                   AND NOT {ASKED}"
            ),
        ),
        (
            "request with review on that COMPLETED without exactly one review",
            format!(
                "SELECT count(*) FROM pipeline_runs r WHERE {answered} AND r.review AND r.status = 'COMPLETED' AND {reviews} <> 1"
            ),
        ),
        (
            "review applied to a request twice, or to one without review on",
            format!("SELECT count(*) FROM pipeline_runs r WHERE {reviews} > CASE WHEN r.review THEN 1 ELSE 0 END"),
        ),
        (
            "request that waited and did not end COMPLETED (or FAILED by a stage's error policy)",
            format!(
                "SELECT count(*) FROM pipeline_runs r WHERE {answered} AND {WAITED} AND r.status <> 'COMPLETED'
                   AND NOT (r.status = 'FAILED' AND r.error NOT LIKE 'no reply from the user%'
                            AND r.error NOT LIKE 'no review within%' AND r.error NOT LIKE 'rejected in review%'
                            AND NOT EXISTS (SELECT 1 FROM operator_actions a WHERE a.run_id = r.id))"
            ),
        ),
        (
            "wait of the default tenant (no limit) expired",
            format!(
                "SELECT count(*) FROM pipeline_runs r WHERE NOT {expires}
                   AND (r.error LIKE 'no reply from the user%' OR r.error LIKE 'no review within%')"
            ),
        ),
        (
            "wait to be cancelled that did not end CANCELLED",
            format!(
                "SELECT count(*) FROM pipeline_runs r WHERE {CANCEL} AND ({ASKED} OR {ANSWERED_FOR_REVIEW})
                   AND r.status <> 'CANCELLED'"
            ),
        ),
        (
            "cancelled wait that went on: a step started after the cancel, or its answer logged",
            "SELECT count(*) FROM pipeline_runs r JOIN operator_actions a ON a.run_id = r.id AND a.action = 'cancel'
             WHERE EXISTS (SELECT 1 FROM pipeline_steps s WHERE s.run_id = r.id AND s.started_at > a.at)
                OR EXISTS (SELECT 1 FROM raw_logs l WHERE l.request_id = r.id AND l.message_type = 'assistant_response')"
                .to_owned(),
        ),
        (
            "unanswered question of the expiring tenant that did not end COMPLETED (on_reply_timeout answer)",
            format!(
                "SELECT count(*) FROM pipeline_runs r WHERE {expires} AND {ASKED} AND r.status <> 'COMPLETED'
                   AND NOT (r.status = 'FAILED' AND r.error NOT LIKE 'no reply from the user%')"
            ),
        ),
        (
            "unreviewed answer of the expiring tenant that did not end FAILED by its limit (on_review_timeout fail)",
            format!(
                "SELECT count(*) FROM pipeline_runs r WHERE {expires} AND {ANSWERED_FOR_REVIEW}
                   AND NOT (r.status = 'FAILED' AND r.error LIKE 'no review within%')"
            ),
        ),
        (
            "question answered without the reply before its limit (the analyzer ran again early)",
            format!(
                "SELECT count(*) FROM pipeline_runs r WHERE {expires} AND EXISTS (
                     SELECT 1 FROM raw_logs q JOIN pipeline_steps s ON s.run_id = q.request_id
                     WHERE q.request_id = r.id AND q.message_type = 'assistant_question'
                       AND s.stage = 'analyze' AND s.started_at > q.created_at AND s.started_at < q.created_at + {limit})"
            ),
        ),
        (
            "review that expired before its limit",
            format!(
                "SELECT count(*) FROM pipeline_runs r WHERE r.error LIKE 'no review within%' AND r.updated_at < (
                     SELECT max(s.finished_at) FROM pipeline_steps s
                     WHERE s.run_id = r.id AND s.stage = 'respond' AND s.outcome = 'succeeded') + {limit}"
            ),
        ),
    ]
}

/// The waits' figures.
pub struct Figures {
    /// Requests that asked, replies logged, reviews applied, requests
    /// that waited (for an answer) and those of them COMPLETED.
    pub asked: i64,
    pub replied: i64,
    pub reviewed: i64,
    pub waited: i64,
    pub waited_completed: i64,
    /// Waits cancelled.
    pub cancelled: i64,
    /// Waits that expired: questions answered without the reply, reviews
    /// failed; and the longest time past its limit at which a wait ended
    /// (for a question, when the analyzer started again), in seconds.
    pub expired_questions: i64,
    pub expired_reviews: i64,
    pub expiry_late_max_s: f64,
}

/// The waits' figures, read at the end.
pub async fn figures(c: &Client) -> Figures {
    let waited = format!("SELECT count(*) FROM pipeline_runs r WHERE {} AND {WAITED}", answered());
    let expires = expires();
    Figures {
        asked: count(
            c,
            "SELECT count(*) FROM raw_logs WHERE message_type = 'assistant_question'",
        )
        .await,
        replied: count(c, "SELECT count(*) FROM raw_logs WHERE message_type = 'user_reply'").await,
        reviewed: count(c, "SELECT count(*) FROM operator_actions WHERE action LIKE 'review_%'").await,
        waited: count(c, &waited).await,
        waited_completed: count(c, &format!("{waited} AND r.status = 'COMPLETED'")).await,
        cancelled: count(
            c,
            &format!(
                "SELECT count(*) FROM pipeline_runs r WHERE {CANCEL} AND r.status = 'CANCELLED' AND ({ASKED} OR {ANSWERED_FOR_REVIEW})"
            ),
        )
        .await,
        expired_questions: count(
            c,
            &format!("SELECT count(*) FROM pipeline_runs r WHERE {expires} AND {ASKED} AND r.status = 'COMPLETED'"),
        )
        .await,
        expired_reviews: count(
            c,
            &format!("SELECT count(*) FROM pipeline_runs r WHERE {expires} AND r.error LIKE 'no review within%'"),
        )
        .await,
        expiry_late_max_s: c
            .query_one(
                &format!(
                    "SELECT coalesce(max(late), 0)::float8 FROM (
                         SELECT extract(epoch FROM (SELECT min(s.started_at) FROM pipeline_steps s
                                                    WHERE s.run_id = r.id AND s.stage = 'analyze' AND s.started_at > q.created_at)
                                                   - q.created_at) - {EXPIRY_SECS} AS late
                         FROM pipeline_runs r JOIN raw_logs q ON q.request_id = r.id AND q.message_type = 'assistant_question'
                         WHERE {expires}
                         UNION ALL
                         SELECT extract(epoch FROM r.updated_at - (SELECT max(s.finished_at) FROM pipeline_steps s
                                        WHERE s.run_id = r.id AND s.stage = 'respond' AND s.outcome = 'succeeded')) - {EXPIRY_SECS}
                         FROM pipeline_runs r WHERE {expires} AND r.error LIKE 'no review within%') x"
                ),
                &[],
            )
            .await
            .unwrap()
            .get(0),
    }
}
