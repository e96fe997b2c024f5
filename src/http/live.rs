//! The streams of the live push over HTTP: an SSE stream or a WebSocket
//! that sends what a [`Follower`] reads (`crate::app::follow`), and ends on
//! the terminal state (of a request), on shutdown, or when its token is
//! revoked ([`Access`]): a revoked WebSocket closes with 1008 (policy
//! violation) and reason `token revoked`; a revoked SSE stream sends a last
//! `revoked` event (`{"code":"token_revoked",…}`) and ends. Every write has
//! the send timeout of the connection (`serve`), a WebSocket message also
//! its own.
//!
//! [`Stream::chat_chunks`] shows the same frames in the shape of OpenAI's
//! `chat.completion.chunk` stream, for `POST /api/query` with
//! `"stream": true` and `Accept: text/event-stream`.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use uuid::Uuid;

use super::AppState;
use crate::app::Caller;
use crate::app::caps::Pass;
use crate::app::follow::{Access, Follower, Frame, Target};
use crate::metrics::StreamGauge;
use crate::model::Status;

/// Why a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
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
    app: AppState,
    follower: Follower,
    queued: VecDeque<Frame>,
    end: Option<End>,
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
            access: Access::watch(&app.app, caller),
            app: app.clone(),
            follower,
            queued: first.into(),
            end: None,
            _gauge: StreamGauge::stream(kind),
            _place: place,
        }
    }

    /// The next frame to send; `None` ends the stream (`end` says why).
    async fn next(&mut self) -> Option<Frame> {
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
    /// ([`sse`]); a last `revoked` event when the token was revoked.
    pub fn sse(self) -> Response {
        let keepalive = self.app.cfg.http.stream_keepalive();
        let events = futures_util::stream::unfold(Some(self), |st| async move {
            let mut st = st?;
            match st.next().await {
                Some(frame) => Some((Ok::<_, Infallible>(sse(&frame)), Some(st))),
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

/// A frame as an SSE event: a state is a plain `data:` line of its JSON; a
/// piece is `event: delta` with its position as `id`; a restart is
/// `event: restart`.
pub fn sse(frame: &Frame) -> SseEvent {
    let event = match frame {
        Frame::State(s) => SseEvent::default().json_data(s),
        Frame::Delta(d) => SseEvent::default().event("delta").json_data(d),
        Frame::Restart(r) => SseEvent::default().event("restart").json_data(r),
    };
    let event = event.unwrap_or_else(|_| SseEvent::default().comment("unserializable frame"));
    match frame.cursor() {
        Some(c) => event.id(c.to_string()),
        None => event,
    }
}

/// How a stream of chunks is shown: the model it names, and whether a
/// usage chunk (the request's tokens) comes before `[DONE]` (OpenAI's
/// `stream_options.include_usage`; the tokens are read for `tenant`).
pub struct Chunks {
    pub model: String,
    pub usage_for: Option<Uuid>,
}

/// The id of request `id`'s completion (`maasctl requests show` and the
/// console take it as the request's id).
pub fn completion_id(id: Uuid) -> String {
    format!("chatcmpl-{id}")
}

/// Request `id`'s answer as OpenAI's chunk stream ([`Stream::chat_chunks`])
/// for `caller` of `tenant`, holding `place`: the follower subscribes to
/// the answer's pieces, then reads the current state and what it missed.
/// The stream of `POST /api/query`'s `"stream": true` and of a streamed
/// chat completion.
pub async fn answer_chunks(
    app: &AppState,
    caller: Caller,
    tenant: Uuid,
    id: Uuid,
    place: Pass,
    opts: Chunks,
) -> Result<Response, crate::db::Error> {
    let sub = app.hub.subscribe_streaming(Target::Request(id), STREAM_QUEUE);
    let mut follower = Follower::new(app.pool.clone(), sub)
        .for_tenant(tenant)
        .with_deltas(None);
    let mut first: Vec<Frame> = follower.current().await?.into_iter().map(Frame::State).collect();
    first.extend(follower.catch_up().await);
    Ok(Stream::new(app, caller, follower, first, "sse", place).chat_chunks(id, opts))
}

/// Queue of a stream that follows one request's answer piece by piece.
pub(super) const STREAM_QUEUE: usize = 128;

/// One `chat.completion.chunk` of request `id`'s answer.
fn chunk(id: Uuid, head: &Head, delta: serde_json::Value, finish: Option<&str>) -> serde_json::Value {
    json!({
        "id": completion_id(id),
        "object": "chat.completion.chunk",
        "created": head.created,
        "model": head.model,
        "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
    })
}

/// What every chunk of one stream repeats.
struct Head {
    created: i64,
    model: String,
}

/// The usage chunk of request `id`: no choices, the tokens it used.
async fn usage_chunk(app: &AppState, id: Uuid, tenant: Uuid, head: &Head) -> SseEvent {
    let usage = async {
        let client = app.pool.get().await?;
        crate::repo::requests::usage_of(&client, id, tenant).await
    };
    let u = usage.await.unwrap_or_else(|e| {
        tracing::warn!(request.id = %id, error = %e, "http: cannot read a request's token usage");
        crate::repo::requests::Usage::default()
    });
    let body = json!({
        "id": completion_id(id),
        "object": "chat.completion.chunk",
        "created": head.created,
        "model": head.model,
        "choices": [],
        "usage": usage_json(u),
    });
    SseEvent::default().data(body.to_string())
}

/// OpenAI's `usage` object of a request's tokens.
pub fn usage_json(u: crate::repo::requests::Usage) -> serde_json::Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

/// The chunks a frame makes, given the text sent of the current attempt.
fn chunks_of(frame: Frame, id: Uuid, head: &Head, sent: &mut String) -> Vec<SseEvent> {
    let data = |v: serde_json::Value| SseEvent::default().data(v.to_string());
    match frame {
        Frame::Delta(d) => {
            sent.push_str(&d.text);
            vec![data(chunk(id, head, json!({ "content": d.text }), None))]
        }
        Frame::Restart(r) => {
            // Not part of OpenAI's shape: a client that knows it clears
            // what it has; the final chunk carries the rest of the answer.
            sent.clear();
            let mut c = chunk(id, head, json!({}), None);
            c["maas_restart"] = json!({ "attempt": r.attempt });
            vec![data(c)]
        }
        Frame::State(s) if s.stage == Status::Completed => {
            let answer = s.answer.unwrap_or_default();
            let rest = answer.strip_prefix(sent.as_str()).unwrap_or_default();
            let mut out = Vec::new();
            if !rest.is_empty() {
                out.push(data(chunk(id, head, json!({ "content": rest }), None)));
            }
            out.push(data(chunk(id, head, json!({}), Some("stop"))));
            out.push(SseEvent::default().data("[DONE]"));
            out
        }
        Frame::State(s) if s.is_terminal() => {
            let error = s.error.unwrap_or_default();
            vec![
                data(json!({ "error": { "message": error, "type": "request_failed", "code": s.stage } })),
                SseEvent::default().data("[DONE]"),
            ]
        }
        Frame::State(_) => Vec::new(),
    }
}

impl Stream {
    /// The stream as OpenAI's `chat.completion.chunk` events of request
    /// `id`: a first chunk with the role, a chunk per piece, the rest of
    /// the final answer and `finish_reason: "stop"` at the end, then
    /// `data: [DONE]` (after a usage chunk when `opts` asks for one); a
    /// failed request ends with `data: {"error": …}`.
    pub fn chat_chunks(self, id: Uuid, opts: Chunks) -> Response {
        let keepalive = self.app.cfg.http.stream_keepalive();
        let head = std::sync::Arc::new(Head {
            created: chrono::Utc::now().timestamp(),
            model: opts.model,
        });
        let first =
            SseEvent::default().data(chunk(id, &head, json!({ "role": "assistant", "content": "" }), None).to_string());
        let start = futures_util::stream::iter([Ok::<_, Infallible>(first)]);
        let usage_for = opts.usage_for;
        let rest = futures_util::stream::unfold(Some((self, String::new())), move |st| {
            let head = head.clone();
            async move {
                let (mut st, mut sent) = st?;
                let events = match st.next().await {
                    Some(frame) => {
                        let completed = matches!(&frame, Frame::State(s) if s.stage == Status::Completed);
                        let mut events = chunks_of(frame, id, &head, &mut sent);
                        if let (true, Some(tenant)) = (completed, usage_for) {
                            let usage = usage_chunk(&st.app, id, tenant, &head).await;
                            events.insert(events.len().saturating_sub(1), usage);
                        }
                        events
                    }
                    None if st.end == Some(End::Finished) => return None,
                    None => {
                        let why = if st.end == Some(End::Revoked) {
                            "the token of this stream was revoked"
                        } else {
                            "the stream ended before the answer"
                        };
                        let error = json!({ "error": { "message": why, "type": "stream_ended" } });
                        return Some((vec![SseEvent::default().data(error.to_string())], None));
                    }
                };
                Some((events, Some((st, sent))))
            }
        });
        let rest = futures_util::StreamExt::flat_map(rest, |events| {
            futures_util::stream::iter(events.into_iter().map(Ok::<_, Infallible>))
        });
        Sse::new(futures_util::StreamExt::chain(start, rest))
            .keep_alive(KeepAlive::new().interval(keepalive))
            .into_response()
    }
}
