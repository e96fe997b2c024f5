//! Background services of `maasd`: each runs until its shutdown token fires,
//! then returns. The daemon starts them from one list
//! (`daemon::run`) and waits for all of them before it exits.
//!
//! - A service owns what it needs (a pool, the configuration, a notifier);
//!   none reaches into the engine's internals except the sweep, which is
//!   the engine's own catch-up.
//! - A service that is switched off by configuration logs so and returns at
//!   once; a failing pass is logged and retried at its next tick, never fatal.
//! - A service that panics is logged by name and stops; the others and the
//!   engine go on.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A background job of the daemon.
pub trait Service: Send + Sync + 'static {
    /// A short name for logs.
    fn name(&self) -> &'static str;
    /// Runs until `shutdown` fires.
    fn run(self: Arc<Self>, shutdown: CancellationToken) -> BoxFuture<'static, ()>;
}

/// Starts every service on its own task; the returned tracker is closed, so
/// `wait()` returns once all of them have stopped.
pub fn start(services: Vec<Arc<dyn Service>>, shutdown: &CancellationToken) -> TaskTracker {
    let tasks = TaskTracker::new();
    for service in services {
        let name = service.name();
        let run = service.run(shutdown.clone());
        tasks.spawn(async move {
            tracing::debug!(service = name, "service started");
            if AssertUnwindSafe(run).catch_unwind().await.is_err() {
                tracing::error!(service = name, "service panicked; it stays stopped");
            } else {
                tracing::debug!(service = name, "service stopped");
            }
        });
    }
    tasks.close();
    tasks
}

/// Waits for the next tick of a periodic service; false once `shutdown`
/// fires (the service then returns).
pub async fn next_tick(tick: &mut tokio::time::Interval, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = tick.tick() => true,
    }
}

/// A pooled connection for one pass of the service `name`, or `None` when
/// the database is out of reach: the pass is skipped (logged at debug) and
/// the next tick tries again.
pub async fn connection(pool: &crate::db::Pool, name: &str) -> Option<deadpool_postgres::Object> {
    match pool.get().await {
        Ok(client) => Some(client),
        Err(e) => {
            tracing::debug!(service = name, error = %e, "no database connection; this pass is skipped");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    struct Waits(AtomicBool);

    impl Service for Waits {
        fn name(&self) -> &'static str {
            "waits"
        }

        fn run(self: Arc<Self>, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
            async move {
                shutdown.cancelled().await;
                self.0.store(true, Ordering::Relaxed);
            }
            .boxed()
        }
    }

    struct Panics;

    impl Service for Panics {
        fn name(&self) -> &'static str {
            "panics"
        }

        #[allow(clippy::panic, reason = "the test's point")]
        fn run(self: Arc<Self>, _shutdown: CancellationToken) -> BoxFuture<'static, ()> {
            async move { panic!("a service that panics") }.boxed()
        }
    }

    #[tokio::test]
    async fn a_panicking_service_stops_alone_and_the_rest_stop_on_shutdown() {
        let waits = Arc::new(Waits(AtomicBool::new(false)));
        let shutdown = CancellationToken::new();
        let tasks = start(vec![Arc::new(Panics), waits.clone()], &shutdown);
        tokio::task::yield_now().await;
        assert!(!waits.0.load(Ordering::Relaxed), "still running");
        shutdown.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), tasks.wait())
            .await
            .ok();
        assert!(tasks.is_empty());
        assert!(waits.0.load(Ordering::Relaxed), "stopped on shutdown");
    }
}
