//! Harness: real PostgreSQL, real processes, waits with deadlines.

pub mod api;
pub mod browser;
pub mod cli;
pub mod console;
pub mod daemon;
pub mod db;
pub mod fake_llm;
pub mod metrics;
pub mod ops;
pub mod poll;
pub mod sse;
pub mod tenants;

use std::future::Future;
use std::time::Duration;

use crate::support::db::{column, value};
use tokio_postgres::Client;

pub use poll::{assert_no_overlapping_cron_runs, count};

/// How long a test waits for what daemons do: long enough for a loaded CI.
pub const GENEROUS: Duration = Duration::from_secs(60);

/// Whether a test must run rather than skip when something it needs is
/// missing: under CI (`CI=true`), or with the variable `require` set
/// (`bin/test` sets `MAAS_REQUIRE_…` for each tool it installed).
pub fn must_run(require: Option<&str>) -> bool {
    let set = |name: &str| {
        std::env::var(name).is_ok_and(|v| !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false"))
    };
    set("CI") || require.is_some_and(set)
}

/// A tool, model or data set the test needs is missing (`what` says which
/// and how to get it): panics where the test must run ([`must_run`]),
/// otherwise says SKIPPED, and the caller returns.
pub fn missing(require: Option<&str>, what: &str) {
    assert!(
        !must_run(require),
        "{what}: the test must run here (CI=true{}), so this is a failure, not a skip",
        require.map(|r| format!(" or {r} set")).unwrap_or_default()
    );
    eprintln!("SKIPPED: {what}");
}

/// Whether the test cluster's URL logs in as the user `postgres`, which
/// the tests that make login roles need (`maasctl dev-db start` makes such
/// a cluster); where it does not, the test is `missing` (a failure under
/// CI) and `what` says which.
pub fn superuser_postgres(url: &str, what: &str) -> bool {
    if url.contains("://postgres@") {
        return true;
    }
    missing(
        None,
        &format!(
            "{what}: the test cluster's URL does not name the user postgres \
             (`maasctl dev-db start` makes one that does): {url}"
        ),
    );
    false
}

/// Polls `cond` until it holds or `within` passes; panics with `what` then.
pub async fn wait_until<F, Fut>(within: Duration, what: &str, cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    if !poll::poll_until(within, Duration::from_millis(25), cond).await {
        panic!("timed out after {within:?} waiting for: {what}");
    }
}

/// Rewinds a freshly claimed request to what crash recovery leaves when
/// its claim's commit (which does not wait for the WAL flush) was lost: the
/// row exactly as before the claim.
pub async fn forget_claim(c: &Client, id: uuid::Uuid) {
    c.execute(
        "UPDATE pipeline_runs SET status = 'NEW', attempt = 0, lease_owner = NULL,
                lease_expires_at = NULL, lease_token = 0
         WHERE id = $1",
        &[&id],
    )
    .await
    .unwrap();
}

/// Inserts `n` requests with plain SQL (as another application would).
pub async fn insert_requests(c: &Client, n: i64, query: &str) -> Vec<uuid::Uuid> {
    column(
        c,
        "INSERT INTO pipeline_runs (user_id, user_query)
         SELECT gen_random_uuid(), $2 || ' #' || g FROM generate_series(1, $1::int8) g
         RETURNING id",
        &[&n, &query],
    )
    .await
}

/// Inserts one request for each of `users` (in order) that no stage will
/// claim until [`release`] (it is not due for an hour), so a test can
/// subscribe to it, or arrange its neighbours, first.
pub async fn insert_held(c: &Client, users: &[uuid::Uuid]) -> Vec<uuid::Uuid> {
    column(
        c,
        "INSERT INTO pipeline_runs (user_id, user_query, run_after)
         SELECT u, 'held #' || n, now() + interval '1 hour' FROM unnest($1::uuid[]) WITH ORDINALITY AS h(u, n)
         ORDER BY n RETURNING id",
        &[&users],
    )
    .await
}

/// `n` new user ids.
pub fn new_users(n: usize) -> Vec<uuid::Uuid> {
    (0..n).map(|_| uuid::Uuid::new_v4()).collect()
}

/// Makes held requests due and rings the doorbell.
pub async fn release(c: &Client) {
    c.batch_execute(
        "UPDATE pipeline_runs SET run_after = now() WHERE status = 'NEW';
         SELECT pg_notify('pipeline_events', json_build_object('id', gen_random_uuid(), 'status', 'NEW', 'operation', 'SWEEP')::text);",
    )
    .await
    .unwrap();
}

/// Waits until every request is terminal.
pub async fn wait_all_terminal(c: &Client, within: Duration) {
    wait_until(within, "every request terminal", || async {
        count(
            c,
            "SELECT count(*) FROM pipeline_runs WHERE status NOT IN ('COMPLETED','FAILED','CANCELLED')",
        )
        .await
            == 0
    })
    .await;
}

/// Asserts the effects of each stage were written exactly once per request.
pub async fn assert_each_stage_succeeded_once(c: &Client) {
    let dup = count(
        c,
        "SELECT count(*) FROM (SELECT run_id, stage FROM pipeline_steps WHERE outcome = 'succeeded'
                               GROUP BY run_id, stage HAVING count(*) > 1) d",
    )
    .await;
    assert_eq!(dup, 0, "a stage succeeded twice for some request");
    let completed = count(c, "SELECT count(*) FROM pipeline_runs WHERE status = 'COMPLETED'").await;
    let succeeded = count(c, "SELECT count(*) FROM pipeline_steps WHERE outcome = 'succeeded'").await;
    assert_eq!(
        succeeded,
        completed * 3,
        "three successful stages per completed request"
    );
    let answers = count(
        c,
        "SELECT count(*) FROM raw_logs WHERE message_type = 'assistant_response'",
    )
    .await;
    assert_eq!(answers, completed, "one logged answer per completed request");
    let missing = count(
        c,
        "SELECT count(*) FROM pipeline_runs WHERE status = 'COMPLETED'
           AND (final_answer IS NULL OR analysis_result IS NULL OR final_context_payload IS NULL)",
    )
    .await;
    assert_eq!(missing, 0, "completed requests carry analysis, context and answer");
}

/// Requests by status, with the errors of failed ones, for assertion messages.
pub async fn summary(c: &Client) -> String {
    let rows = c
        .query(
            "SELECT status, count(*) AS n, min(error) AS error FROM pipeline_runs GROUP BY status ORDER BY status",
            &[],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            format!(
                "{}={} {}",
                r.get::<_, String>("status"),
                r.get::<_, i64>("n"),
                r.get::<_, Option<String>>("error").unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Asserts how many requests completed, showing the others if not.
pub async fn assert_completed(c: &Client, n: i64) {
    let done = count(c, "SELECT count(*) FROM pipeline_runs WHERE status = 'COMPLETED'").await;
    assert_eq!(done, n, "completed requests; all: {}", summary(c).await);
}

/// Waits until every request is terminal, then asserts that `n` completed
/// and that each stage's effects were written exactly once per request.
pub async fn assert_all_completed_once(c: &Client, n: i64) {
    wait_all_terminal(c, GENEROUS).await;
    assert_completed(c, n).await;
    assert_each_stage_succeeded_once(c).await;
}

/// Asserts that no request holds a lease.
pub async fn assert_no_lease_held(c: &Client) {
    assert_eq!(
        count(c, "SELECT count(*) FROM pipeline_runs WHERE lease_owner IS NOT NULL").await,
        0,
        "a request still holds a lease"
    );
}

/// Asserts that request `id` logged exactly one answer.
pub async fn assert_one_answer_logged(c: &Client, id: uuid::Uuid) {
    let answers: i64 = value(
        c,
        "SELECT count(*) FROM raw_logs WHERE request_id = $1 AND message_type = 'assistant_response'",
        &[&id],
    )
    .await;
    assert_eq!(answers, 1, "answers logged for {id}");
}

/// Waits until `n` requests are ANALYZING (claimed, their stage running);
/// panics with `what` after [`GENEROUS`].
pub async fn wait_analyzing(c: &Client, n: i64, what: &str) {
    wait_until(GENEROUS, what, || async {
        count(c, "SELECT count(*) FROM pipeline_runs WHERE status = 'ANALYZING'").await == n
    })
    .await;
}

/// Runs a client of the tests, `program script` (`script` relative to the
/// crate), with `plan` on its standard input (a plan may be larger than an
/// argument may), and reads the one JSON document it prints: what a real
/// client SDK (MCP's, OpenAI's) saw.
pub async fn run_client(program: &str, script: &str, plan: &serde_json::Value) -> serde_json::Value {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(program)
        .arg(format!("{}/{script}", env!("CARGO_MANIFEST_DIR")))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(plan.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "{script}'s output is not JSON ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
