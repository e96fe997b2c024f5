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
