//! The MCP sessions of the protocol revisions that have them
//! (`Mcp-Session-Id`): bound to the token that opened them, capped, ended
//! when that token is revoked, and resumable after a broken stream.
//!
//! - Binding: [`guard`] records the caller (the token's SHA-256,
//!   `limits::Caller`) of the `initialize` that opened a session; a request
//!   naming the session with any other token — a `POST`, the `GET` stream,
//!   a `DELETE` — is 404 `session_not_found`, as for a session that does
//!   not exist, and reaches no session.
//! - Caps: a session holds a place of `http.max_mcp_sessions_per_token`
//!   and `http.max_mcp_sessions` ([`Gate`]) until it ends; the
//!   `initialize` over one is 429 / 503 `too_many_sessions` with
//!   `Retry-After`, and the session it made is closed at once.
//! - Revocation: a session of a database token checks it again every token
//!   cache period ([`Access`], as an HTTP stream does) and is closed once
//!   the token is revoked: its streams end, its calls stop.
//! - Ends: `DELETE` (answered 200), the client's idle timeout (rmcp's, 5
//!   minutes), revocation and shutdown all go through
//!   [`Manager::close_session`], which gives the place back.
//! - Resumption: each call's event stream is kept by [`Replay`] while the
//!   call runs, and after it until its last event was handed to a client
//!   (at most [`REPLAY_TTL`]): a client whose stream broke mid-call gets the
//!   rest, the result included, with `GET` and `Last-Event-ID`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, LocalSessionManagerError};
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionId, SessionManager};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::app::caps::{Gate, Pass};
use crate::app::follow::Access;
use crate::app::{App, AppError, Caller, Code, Kind};

/// The header naming a session.
const SESSION_HEADER: &str = "mcp-session-id";
/// How long a finished call's events wait for a client that did not get
/// its result.
pub const REPLAY_TTL: Duration = Duration::from_secs(60);
/// Finished calls kept per session for their clients (the oldest go first).
const REPLAYS_PER_SESSION: usize = 32;
/// Events queued to one reader of a call's stream.
const READER_QUEUE: usize = 16;

/// rmcp's in-memory sessions, with their owners, places and replays.
pub struct Manager {
    local: LocalSessionManager,
    gate: Arc<Gate>,
    owners: Mutex<HashMap<SessionId, Owner>>,
    replays: Mutex<HashMap<SessionId, Kept>>,
}

/// The calls of a session kept for resumption, by rmcp's call number.
type Kept = Vec<(u64, Arc<Replay>)>;

/// Who opened a session, and what it holds until it ends.
struct Owner {
    caller: Caller,
    _place: Pass,
    _access: Access,
    _ended: DropGuard,
}

impl Manager {
    /// Sessions capped at `total` for the daemon and `per_token` per caller.
    pub fn new(total: usize, per_token: usize) -> Manager {
        Manager {
            local: LocalSessionManager::default(),
            gate: Gate::coded("MCP sessions", Code::TooManySessions, total.max(1), per_token.max(1)),
            owners: Mutex::new(HashMap::new()),
            replays: Mutex::new(HashMap::new()),
        }
    }

    /// Whether session `id` was opened by `caller` (an unknown one was not).
    fn owned_by(&self, id: &SessionId, caller: Caller) -> bool {
        self.owners
            .lock()
            .is_ok_and(|o| o.get(id).is_some_and(|owner| owner.caller == caller))
    }

    /// Records `caller` as the owner of the new session `id`, in a place
    /// of the caps, watching its token; the refusal when over a cap.
    fn admit(self: &Arc<Self>, app: &App, id: SessionId, caller: Caller) -> Result<(), AppError> {
        let place = self.gate.enter(caller)?;
        let access = Access::watch(app, caller);
        let (revoked, ended) = (access.token(), CancellationToken::new());
        let owner = Owner {
            caller,
            _place: place,
            _access: access,
            _ended: ended.clone().drop_guard(),
        };
        self.owners
            .lock()
            .map_err(|_| AppError::unavailable(Code::Internal, "MCP sessions unavailable"))?
            .insert(id.clone(), owner);
        let manager = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::select! {
                _ = ended.cancelled() => {}
                _ = revoked.cancelled() => {
                    tracing::info!(session = %id, "mcp: the session's token was revoked; closing it");
                    if let Some(m) = manager.upgrade()
                        && let Err(e) = m.close_session(&id).await
                    {
                        tracing::warn!(session = %id, error = %e, "mcp: cannot close a revoked session");
                    }
                }
            }
        });
        Ok(())
    }

    /// Keeps the stream of call `request` of session `id` for resumption;
    /// drops the finished calls whose clients got everything or waited too
    /// long.
    fn keep(&self, id: &SessionId, request: u64, replay: Arc<Replay>) {
        let Ok(mut replays) = self.replays.lock() else { return };
        let kept = replays.entry(id.clone()).or_default();
        kept.retain(|(_, r)| r.wanted());
        while kept.len() >= REPLAYS_PER_SESSION {
            match kept.iter().position(|(_, r)| r.finished()) {
                Some(i) => kept.remove(i),
                None => break,
            };
        }
        kept.push((request, replay));
    }

    /// The kept stream of call `request` of session `id`.
    fn replay(&self, id: &SessionId, request: u64) -> Option<Arc<Replay>> {
        let replays = self.replays.lock().ok()?;
        let kept = replays.get(id)?;
        kept.iter().find(|(r, _)| *r == request).map(|(_, r)| r.clone())
    }

    async fn handle(
        &self,
        id: &SessionId,
    ) -> Result<rmcp::transport::streamable_http_server::session::local::LocalSessionHandle, LocalSessionManagerError>
    {
        let sessions = self.local.sessions.read().await;
        sessions
            .get(id)
            .cloned()
            .ok_or_else(|| LocalSessionManagerError::SessionNotFound(id.clone()))
    }
}

impl SessionManager for Manager {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.local.create_session().await
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.local.initialize_session(id, message).await
    }

    /// Ends session `id` however it ends, giving its place back.
    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let done = self.local.close_session(id).await;
        if let Ok(mut owners) = self.owners.lock() {
            owners.remove(id);
        }
        if let Ok(mut replays) = self.replays.lock() {
            replays.remove(id);
        }
        done
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.local.has_session(id).await
    }

    /// A call's stream, as rmcp's, kept for resumption ([`Replay`]).
    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let handle = self.handle(id).await?;
        let receiver = handle.establish_request_wise_channel().await?;
        let request = receiver.http_request_id;
        handle.push_message(message, request).await?;
        let replay = Replay::start(Events(receiver.inner));
        if let Some(request) = request {
            self.keep(id, request, replay.clone());
        }
        Ok(replay.follow(None))
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        self.local.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.local.create_standalone_stream(id).await
    }

    /// The rest of a call's stream after event `INDEX/CALL` (from the kept
    /// [`Replay`]); the session's own stream as rmcp resumes it.
    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        if let Some((index, request)) = call_event(&last_event_id)
            && let Some(replay) = self.replay(id, request)
        {
            return Ok(replay.follow(Some(index)).left_stream());
        }
        Ok(self.local.resume(id, last_event_id).await?.right_stream())
    }
}

/// The index and call of a call's event id (`INDEX/CALL`, rmcp's form).
fn call_event(id: &str) -> Option<(usize, u64)> {
    let (index, request) = id.split_once('/')?;
    Some((index.parse().ok()?, request.parse().ok()?))
}

/// The index of an event of a call's stream (`None`: not one).
fn event_index(event: &ServerSseMessage) -> Option<usize> {
    call_event(event.event_id.as_deref()?).map(|(index, _)| index)
}

/// One call's event stream, read to its end whoever listens (so a result
/// sent after the client's stream broke is kept), and followed by any
/// number of readers.
pub struct Replay {
    log: Mutex<Log>,
    changed: watch::Sender<()>,
}

#[derive(Default)]
struct Log {
    events: Vec<ServerSseMessage>,
    /// When the call's stream ended.
    ended: Option<Instant>,
    /// A reader was handed every event of the ended stream.
    delivered: bool,
}

impl Replay {
    /// Reads `events` to their end in a task of its own.
    fn start(mut events: impl futures_util::Stream<Item = ServerSseMessage> + Send + Unpin + 'static) -> Arc<Replay> {
        let replay = Arc::new(Replay {
            log: Mutex::new(Log::default()),
            changed: watch::Sender::new(()),
        });
        let writer = replay.clone();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                writer.update(|log| log.events.push(event));
            }
            writer.update(|log| log.ended = Some(Instant::now()));
        });
        replay
    }

    fn update(&self, change: impl FnOnce(&mut Log)) {
        if let Ok(mut log) = self.log.lock() {
            change(&mut log);
        }
        self.changed.send_replace(());
    }

    /// The call is over.
    fn finished(&self) -> bool {
        self.log.lock().map_or(true, |log| log.ended.is_some())
    }

    /// Worth keeping: running, or over with its end not handed to anyone
    /// for less than [`REPLAY_TTL`].
    fn wanted(&self) -> bool {
        self.log.lock().is_ok_and(|log| match log.ended {
            None => true,
            Some(at) => !log.delivered && at.elapsed() < REPLAY_TTL,
        })
    }

    /// The events after index `after` (all without), then the new ones
    /// until the call's stream ends or the reader goes away.
    fn follow(self: &Arc<Self>, after: Option<usize>) -> Events {
        let (tx, rx) = mpsc::channel(READER_QUEUE);
        let replay = self.clone();
        tokio::spawn(async move {
            let mut changed = replay.changed.subscribe();
            let mut next = 0;
            loop {
                changed.borrow_and_update();
                let (batch, ended) = match replay.log.lock() {
                    Ok(log) => (log.events.get(next..).unwrap_or_default().to_vec(), log.ended.is_some()),
                    Err(_) => return,
                };
                next += batch.len();
                for event in batch {
                    if after.is_some_and(|a| event_index(&event).is_some_and(|i| i <= a)) {
                        continue;
                    }
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
                if ended {
                    replay.update(|log| log.delivered = true);
                    return;
                }
                tokio::select! {
                    _ = changed.changed() => {}
                    _ = tx.closed() => return,
                }
            }
        });
        Events(rx)
    }
}

/// The events of a channel, as a stream.
pub struct Events(mpsc::Receiver<ServerSseMessage>);

impl futures_util::Stream for Events {
    type Item = ServerSseMessage;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<ServerSseMessage>> {
        self.0.poll_recv(cx)
    }
}

/// What [`guard`] needs: the sessions and the server's state.
#[derive(Clone)]
pub struct Door {
    pub manager: Arc<Manager>,
    pub app: App,
}

/// The middleware of `/mcp` (after authentication and the server's
/// `Origin` check): a named session must be the caller's; a new
/// session is recorded in the caps or closed; a `DELETE` that ended a
/// session answers 200.
pub async fn guard(State(door): State<Door>, req: Request, next: Next) -> Response {
    let caller = req.extensions().get::<Caller>().copied().unwrap_or(Caller::ANONYMOUS);
    if let Some(id) = session_of(req.headers().get(SESSION_HEADER)) {
        if !door.manager.owned_by(&id, caller) {
            return AppError::new(
                Kind::NotFound,
                Code::SessionNotFound,
                format!(
                    "no MCP session {id} for this token (Mcp-Session-Id): it ended or was never this token's; \
                     start one with initialize"
                ),
            )
            .into_response();
        }
        let delete = req.method() == Method::DELETE;
        let mut resp = next.run(req).await;
        if delete && resp.status() == StatusCode::ACCEPTED {
            *resp.status_mut() = StatusCode::OK;
        }
        return resp;
    }
    let resp = next.run(req).await;
    let Some(id) = session_of(resp.headers().get(SESSION_HEADER)) else {
        return resp;
    };
    match door.manager.admit(&door.app, id.clone(), caller) {
        Ok(()) => resp,
        Err(refused) => {
            if let Err(e) = door.manager.close_session(&id).await {
                tracing::warn!(session = %id, error = %e, "mcp: cannot close a session over its cap");
            }
            refused.into_response()
        }
    }
}

fn session_of(value: Option<&HeaderValue>) -> Option<SessionId> {
    value.and_then(|v| v.to_str().ok()).map(SessionId::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_event_ids_parse() {
        assert_eq!(call_event("3/7"), Some((3, 7)));
        assert_eq!(call_event("0"), None);
        assert_eq!(call_event("x/1"), None);
    }

    #[tokio::test]
    async fn a_reader_after_the_end_gets_what_it_missed_and_ends() {
        let events: Vec<ServerSseMessage> = (0..3)
            .map(|i| ServerSseMessage::priming(format!("{i}/5"), Duration::from_secs(1)))
            .collect();
        let replay = Replay::start(futures_util::stream::iter(events));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !replay.finished() && tokio::time::Instant::now() < deadline {
            tokio::task::yield_now().await;
        }
        assert!(replay.wanted(), "nobody read it yet");
        let ids: Vec<String> = replay
            .follow(Some(0))
            .filter_map(|e| async move { e.event_id })
            .collect()
            .await;
        assert_eq!(ids, ["1/5", "2/5"]);
        assert!(!replay.wanted(), "handed over: no longer kept");
    }
}
