//! Whether a caller may still read: a follower holding an [`Access`]
//! (an HTTP stream, an MCP wait or session) ends once its token is
//! revoked.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::{CancellationToken, DropGuard};

use crate::app::App;
use crate::app::caller::{Caller, TOKEN_TTL};

/// Whether a stream's caller may still read: fired once its token is
/// revoked. Configured tokens and the loopback mode are never revoked.
pub struct Access {
    revoked: CancellationToken,
    _stop: Option<DropGuard>,
}

impl Access {
    /// Checks `caller`'s token every [`TOKEN_TTL`] (through the token
    /// cache) while the returned value lives. A failed lookup keeps the
    /// stream (the next period tries again).
    pub fn watch(app: &App, caller: Caller) -> Access {
        let configured = app.is_configured(caller);
        if caller == Caller::ANONYMOUS || configured {
            return Access::watch_with(TOKEN_TTL, None::<fn() -> std::future::Ready<bool>>);
        }
        let app = app.clone();
        Access::watch_with(
            TOKEN_TTL,
            Some(move || {
                let app = app.clone();
                async move {
                    match app.db_tokens.lookup(&app.pool, caller.0).await {
                        Ok(found) => found.is_some(),
                        Err(e) => {
                            tracing::warn!(error = %e.message, "app: cannot check a stream's token; keeping it");
                            true
                        }
                    }
                }
            }),
        )
    }

    /// Calls `still` every `period` until it says no (never without one).
    pub fn watch_with<F, Fut>(period: Duration, still: Option<F>) -> Access
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = bool> + Send,
    {
        let revoked = CancellationToken::new();
        let Some(mut still) = still else {
            return Access { revoked, _stop: None };
        };
        let stop = CancellationToken::new();
        let (fire, done) = (revoked.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = done.cancelled() => return,
                    _ = tokio::time::sleep(period) => {}
                }
                if !still().await {
                    fire.cancel();
                    return;
                }
            }
        });
        Access {
            revoked,
            _stop: Some(stop.drop_guard()),
        }
    }

    /// Resolves once the token is revoked.
    pub fn revoked(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.revoked.cancelled()
    }

    /// A token fired when the access is revoked.
    pub fn token(&self) -> CancellationToken {
        self.revoked.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[tokio::test]
    async fn access_fires_once_the_check_says_no() {
        let period = Duration::from_millis(20);
        let calls = Arc::new(AtomicU64::new(0));
        let counted = calls.clone();
        let access = Access::watch_with(
            period,
            Some(move || {
                let n = counted.fetch_add(1, Ordering::Relaxed);
                async move { n < 2 }
            }),
        );
        let within = Duration::from_secs(5);
        assert!(
            tokio::time::timeout(within, access.revoked()).await.is_ok(),
            "not revoked"
        );
        assert_eq!(calls.load(Ordering::Relaxed), 3, "checked until it said no");
        let never = Access::watch_with(period, None::<fn() -> std::future::Ready<bool>>);
        assert!(tokio::time::timeout(period * 5, never.revoked()).await.is_err());
    }
}
