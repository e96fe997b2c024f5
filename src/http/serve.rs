//! The accept loop: every connection served by hyper's HTTP/1 builder with
//! a timer, so a client is cut off when it does not finish a request's
//! headers within `http.header_read_timeout_secs` (slowloris), and a
//! kept-alive connection idle between requests for that long is closed.
//!
//! Guarantees: an accept error (out of file descriptors) never ends the
//! loop, it pauses briefly; on shutdown the loop stops accepting, every
//! connection is asked to finish its request in flight and close, and
//! [`serve`] returns when all have closed.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Pause after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, router: Router, header_read_timeout: Duration, shutdown: CancellationToken) {
    let conns = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "http: accept failed; pausing");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let shutdown = shutdown.clone();
        conns.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service).with_upgrades();
            tokio::pin!(conn);
            let done = tokio::select! {
                done = conn.as_mut() => done,
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = done {
                tracing::debug!(peer = %peer, error = %e, "http: connection ended with an error");
            }
        });
    }
    conns.close();
    conns.wait().await;
}
