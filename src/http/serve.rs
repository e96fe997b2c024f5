//! The accept loop: every connection served by hyper's HTTP/1 builder with
//! a timer, so a client is cut off when it does not finish a request's
//! headers within `http.header_read_timeout_secs` (slowloris), and a
//! kept-alive connection idle between requests for that long is closed.
//!
//! Guarantees:
//! - An accept error (out of file descriptors) never ends the loop, it
//!   pauses briefly; on shutdown the loop stops accepting, every
//!   connection is asked to finish its request in flight and close, and
//!   [`serve`] returns when all have closed.
//! - With `http.tls_cert` and `http.tls_key` every connection is HTTPS
//!   (rustls, HTTP/1.1 by ALPN); the handshake must end within the header
//!   read timeout. There is no plain-HTTP listener beside it.
//! - A connection whose client takes no byte for `http.stream_send_timeout_secs`
//!   while the server has something to send is closed (`StallGuard`):
//!   every response, SSE stream and WebSocket (the upgrade keeps the guard)
//!   has a send timeout, so a client that stops reading holds nothing.
//! - Each request carries its peer's address (axum's `ConnectInfo`), for
//!   the limits on failed authentication.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Pause after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// How every connection is served.
#[derive(Clone)]
pub struct Options {
    /// Headers (and the TLS handshake) must arrive within this.
    pub header_read_timeout: Duration,
    /// A client that takes nothing for this long while data waits is cut.
    pub send_timeout: Duration,
    /// HTTPS when set.
    pub tls: Option<TlsAcceptor>,
}

/// The TLS acceptor of a certificate chain and key, both PEM files; the
/// error names the file and what is wrong.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("http.tls_cert: cannot read {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("http.tls_cert: {} holds no certificate", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("http.tls_key: cannot read a private key from {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("http.tls_cert: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("http.tls_key: does not fit http.tls_cert: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `router` on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, router: Router, opts: Options, shutdown: CancellationToken) {
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
        let service = WithPeer {
            inner: TowerToHyperService::new(router.clone()),
            peer,
        };
        let (shutdown, opts) = (shutdown.clone(), opts.clone());
        conns.spawn(async move {
            let Some(tls) = opts.tls.clone() else {
                return connection(stream, service, &opts, peer, shutdown).await;
            };
            let handshake = tokio::time::timeout(opts.header_read_timeout, tls.accept(stream));
            let stream = tokio::select! {
                _ = shutdown.cancelled() => return,
                done = handshake => match done {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => return tracing::debug!(peer = %peer, error = %e, "http: TLS handshake failed"),
                    Err(_) => return tracing::debug!(peer = %peer, "http: TLS handshake timed out"),
                },
            };
            connection(stream, service, &opts, peer, shutdown).await;
        });
    }
    conns.close();
    conns.wait().await;
}

/// Serves one connection until it closes, or asks it to close on shutdown.
async fn connection<S>(stream: S, service: WithPeer, opts: &Options, peer: SocketAddr, shutdown: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(StallGuard::new(stream, opts.send_timeout));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_read_timeout);
    let conn = builder.serve_connection(io, service).with_upgrades();
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
}

/// The router, with the peer's address put into every request.
#[derive(Clone)]
struct WithPeer {
    inner: TowerToHyperService<Router>,
    peer: SocketAddr,
}

impl hyper::service::Service<hyper::Request<Incoming>> for WithPeer {
    type Response = <TowerToHyperService<Router> as hyper::service::Service<hyper::Request<Incoming>>>::Response;
    type Error = <TowerToHyperService<Router> as hyper::service::Service<hyper::Request<Incoming>>>::Error;
    type Future = <TowerToHyperService<Router> as hyper::service::Service<hyper::Request<Incoming>>>::Future;

    fn call(&self, mut req: hyper::Request<Incoming>) -> Self::Future {
        req.extensions_mut().insert(ConnectInfo(self.peer));
        self.inner.call(req)
    }
}

/// A connection that fails its write (and so closes) when the client has
/// taken no byte for the send timeout while the server waits to write.
struct StallGuard<S> {
    io: S,
    limit: Duration,
    /// Runs while a write waits; reset by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> StallGuard<S> {
    fn new(io: S, limit: Duration) -> StallGuard<S> {
        StallGuard {
            io,
            limit,
            stalled: None,
        }
    }

    /// Passes a write's outcome on; a wait past the limit becomes an error.
    fn watch<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let sleep = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took nothing within http.stream_send_timeout_secs",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StallGuard<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StallGuard<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_shutdown(cx);
        self.watch(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_write_nobody_takes_fails_after_the_limit() {
        // A duplex pipe of 8 bytes whose other end never reads.
        let (near, _far) = tokio::io::duplex(8);
        let mut guarded = StallGuard::new(near, Duration::from_millis(50));
        let started = std::time::Instant::now();
        let outcome = guarded.write_all(&[0u8; 64]).await;
        assert_eq!(outcome.err().map(|e| e.kind()), Some(io::ErrorKind::TimedOut));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
