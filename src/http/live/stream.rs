//! The streams of the live push (see the module above): an SSE stream or
//! a WebSocket that sends what a [`Follower`] reads, and the [`Access`]
//! check that ends it when its token is revoked.

#[allow(clippy::wildcard_imports, reason = "the parent's imports and items, as a part of it")]
use super::*;

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
    pub fn watch(app: &AppState, caller: Caller) -> Access {
        let configured = app.tokens.contains(&caller.0);
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
                            tracing::warn!(error = %e.message, "live: cannot check a stream's token; keeping it");
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

/// Why a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// The request reached its terminal state.
    Finished,
    Shutdown,
    Revoked,
    /// The hub stopped or the state could not be read.
    Lost,
}

/// The last SSE event of a stream whose token was revoked.
pub fn revoked_event() -> SseEvent {
    SseEvent::default()
        .event("revoked")
        .data(r#"{"code":"token_revoked","error":"the token of this stream was revoked; the stream ends"}"#)
}

/// One stream's progress: states to send, then changes until terminal (for
/// a request), shutdown or revocation.
pub struct Stream {
    pub(super) app: AppState,
    follower: Follower,
    queued: VecDeque<Frame>,
    pub(super) end: Option<End>,
    access: Access,
    _gauge: StreamGauge,
    /// Its place under the stream caps, given back when it ends.
    _place: Pass,
}

impl Stream {
    /// A stream of `kind` (`sse`, `websocket`) that sends `first`, then
    /// what `follower` reads, holding `place`; `caller`'s token is checked
    /// again while it runs.
    pub fn new(
        app: &AppState,
        caller: Caller,
        follower: Follower,
        first: Vec<Frame>,
        kind: &'static str,
        place: Pass,
    ) -> Stream {
        Stream {
            access: Access::watch(app, caller),
            app: app.clone(),
            follower,
            queued: first.into(),
            end: None,
            _gauge: StreamGauge::stream(kind),
            _place: place,
        }
    }

    /// The next frame to send; `None` ends the stream (`end` says why).
    pub(super) async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(s) = self.queued.pop_front() {
                if matches!(self.follower.target(), Target::Request(_)) && s.is_terminal() {
                    self.end = Some(End::Finished);
                    self.queued.clear();
                }
                return Some(s);
            }
            if self.end.is_some() {
                return None;
            }
            let end = tokio::select! {
                _ = self.app.shutdown.cancelled() => End::Shutdown,
                _ = self.access.revoked() => End::Revoked,
                next = self.follower.next() => match next {
                    None => End::Lost,
                    Some(Ok(frames)) => {
                        self.queued.extend(frames);
                        continue;
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "live: stream could not re-read its state; ending it");
                        End::Lost
                    }
                },
            };
            self.end = Some(end);
            return None;
        }
    }

    /// Server-Sent Events, one `data:` JSON per state, `delta` and
    /// `restart` events for the pieces of a streamed answer
    /// ([`Frame::sse`]); a last `revoked` event when the token was revoked.
    pub fn sse(self) -> Response {
        let keepalive = self.app.cfg.http.stream_keepalive();
        let events = futures_util::stream::unfold(Some(self), |st| async move {
            let mut st = st?;
            match st.next().await {
                Some(frame) => Some((Ok::<_, Infallible>(frame.sse()), Some(st))),
                None if st.end == Some(End::Revoked) => Some((Ok(revoked_event()), None)),
                None => None,
            }
        });
        Sse::new(events)
            .keep_alive(KeepAlive::new().interval(keepalive))
            .into_response()
    }

    /// Runs a WebSocket: the states as JSON text messages, pings every
    /// keep-alive, and a close frame saying why it ended.
    pub async fn websocket(mut self, mut socket: WebSocket) {
        let send_timeout = self.app.cfg.http.stream_send_timeout();
        let mut ping = tokio::time::interval(self.app.cfg.http.stream_keepalive());
        ping.tick().await;
        let close = loop {
            let msg = tokio::select! {
                next = self.next() => match next {
                    Some(frame) => match frame.json() {
                        Some(text) => Message::Text(text.into()),
                        None => continue,
                    },
                    None => break Some(match self.end {
                        Some(End::Finished) => (close_code::NORMAL, "request finished"),
                        Some(End::Revoked) => (close_code::POLICY, "token revoked"),
                        Some(End::Shutdown) => (close_code::AWAY, "server shutting down"),
                        _ => (close_code::AWAY, "subscription ended"),
                    }),
                },
                incoming = socket.recv() => match incoming {
                    // Pings are answered by the protocol layer; text is ignored.
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break None,
                    Some(Ok(_)) => continue,
                },
                _ = ping.tick() => Message::Ping(Bytes::new()),
            };
            match tokio::time::timeout(send_timeout, socket.send(msg)).await {
                Ok(Ok(())) => {}
                // A client that does not take its messages is dropped; the
                // daemon never waits for it beyond the send timeout.
                _ => break None,
            }
        };
        if let Some((code, reason)) = close {
            let frame = CloseFrame {
                code,
                reason: reason.into(),
            };
            let _ = tokio::time::timeout(send_timeout, socket.send(Message::Close(Some(frame)))).await;
        }
    }
}
