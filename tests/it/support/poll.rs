//! Polling with a deadline, shared by the integration tests and the
//! benchmarks (which include this file by path).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::Client;

/// Polls `cond` every `every` until it holds (true) or `within` has
/// passed (false); `cond` is asked at least once, and once more after the
/// deadline.
pub async fn poll_until<F, Fut>(within: Duration, every: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}

/// The single `bigint` that `sql` returns (a `count(*)`, mostly).
pub async fn count(c: &Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.unwrap().get(0)
}

/// Asserts that no two scheduled (cron) archive runs overlapped in time,
/// whichever daemons ran them.
pub async fn assert_no_overlapping_cron_runs(c: &Client) {
    let overlapping = count(
        c,
        "SELECT count(*) FROM archive_runs a JOIN archive_runs b ON a.id < b.id
         WHERE a.trigger = 'cron' AND b.trigger = 'cron'
           AND tstzrange(a.started_at, coalesce(a.finished_at, 'infinity')) && tstzrange(b.started_at, coalesce(b.finished_at, 'infinity'))",
    )
    .await;
    assert_eq!(overlapping, 0, "two scheduled runs overlapped");
}
