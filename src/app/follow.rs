//! Following requests to their end: one fan-out of the process's own LISTEN
//! session to every follower of this process (HTTP long-polls, WebSockets
//! and SSE streams, MCP `ask`), whatever its door.
//!
//! - The [`Hub`] takes every notification from the listener's broadcast
//!   (`Notifier::subscribe`), so there is still one LISTEN session per process.
//!   Subscribers register by request id or by user id; a notification
//!   nobody subscribed to costs nothing (no lookup).
//! - A notification carries only `{id, status, operation}`. For a terminal
//!   status the hub reads the row (answer, error) — once per batch of
//!   notifications, in one query, whoever is subscribed. For subscribers by
//!   user it needs the user of every notification: it looks the request up
//!   (same batched query) and caches `request → user` until the request is
//!   terminal; the cache is bounded.
//! - The hub never waits for a subscriber: each has a small bounded queue;
//!   when it is full the subscriber is marked lagged and re-reads its state
//!   from the database when it catches up. When the hub itself lags behind
//!   the broadcast, or the listener reconnects (notifications may have been
//!   lost meanwhile), every subscriber is told to re-read.
//! - Intermediate statuses are pushed in the order of the notifications;
//!   one that passed while a subscriber was re-reading may be skipped. The
//!   terminal state is always delivered: it is read from the table.
//!
//! A follower that holds an [`Access`] ends when its token is revoked:
//! opened with a database token, it checks it again every
//! [`TOKEN_TTL`](super::caller::TOKEN_TTL) (through the token cache, so a
//! revoked token's follower ends within two cache periods). How an end is
//! said is the door's (`http::live`, `mcp`).
//!
//! Streamed answers (`deltas.rs`): a subscriber that asked for them
//! ([`Hub::subscribe_streaming`]) also gets the pieces of the answers of
//! the requests it follows, from the listener's second broadcast
//! ([`Notifier::subscribe_deltas`]); for a subscriber by user the hub
//! looks the request's user up as for a status notification (once, cached
//! until the request ends). The
//! [`Follower`] puts them in order per request ([`deltas::Cursors`]), reads
//! what it missed from `answer_deltas`, shows an explicit restart when a
//! new attempt writes, and shows nothing of a request after its terminal
//! state.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::db::Pool;
use crate::listener::{DeltaNote, Event, Notifier};
use crate::model::Status;
use crate::repo::requests::{RequestStatus, request_state_of_tenant, request_states, user_states};

mod access;
pub mod deltas;
mod follower;
pub use access::Access;
pub use deltas::{Cursor, Frame};
pub use follower::{Follower, until_end};

/// Most requests a subscriber by user is shown on (re)subscribing.
const USER_STATES_LIMIT: i64 = 100;
/// Most `request → user` entries the hub caches.
const USER_CACHE_LIMIT: usize = 100_000;
/// Most notifications handled (and looked up) together.
const BATCH: usize = 1024;

/// A change of one request, as pushed to subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub id: Uuid,
    pub status: Status,
    pub answer: Option<String>,
    pub error: Option<String>,
    /// The question a request in WAITING_USER_INPUT waits on.
    pub question: Option<String>,
}

impl From<RequestStatus> for Change {
    fn from(r: RequestStatus) -> Change {
        Change {
            id: r.id,
            status: r.status,
            answer: r.answer,
            error: r.error,
            question: r.question,
        }
    }
}

/// The JSON every endpoint shows of a request (docs/http-api.md, "Status shapes"):
/// `status` is `processing`, `waiting_user_input` (with `question`),
/// `awaiting_review`, `completed` (with `answer`) or `failed` (with
/// `error`); `stage` is the pipeline status (`NEW` … `COMPLETED`, `FAILED`,
/// `CANCELLED`). A cancelled request shows as `failed` with stage
/// `CANCELLED` and an error that says so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestState {
    pub request_id: Uuid,
    pub status: &'static str,
    pub stage: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
}

impl RequestState {
    pub fn of(c: &Change) -> RequestState {
        let (status, answer, error) = match c.status {
            Status::Completed => ("completed", Some(c.answer.clone().unwrap_or_default()), None),
            Status::Failed => (
                "failed",
                None,
                Some(c.error.clone().unwrap_or_else(|| "the request failed".into())),
            ),
            Status::Cancelled => (
                "failed",
                None,
                Some(match &c.error {
                    Some(e) if !e.is_empty() => format!("cancelled: {e}"),
                    _ => "cancelled".into(),
                }),
            ),
            Status::WaitingUserInput => ("waiting_user_input", None, None),
            Status::AwaitingReview => ("awaiting_review", None, None),
            Status::New
            | Status::Analyzing
            | Status::Analyzed
            | Status::Assembling
            | Status::Ready
            | Status::Responding => ("processing", None, None),
        };
        RequestState {
            request_id: c.id,
            status,
            stage: c.status,
            answer,
            error,
            question: c.question.clone().filter(|_| c.status == Status::WaitingUserInput),
        }
    }

    pub fn is_terminal(&self) -> bool {
        self.stage.is_terminal()
    }

    /// Terminal, or waiting for its user's reply: what a caller that waits
    /// for an answer must be shown (the question is the answer for now).
    /// An answer under review is not: it is delivered once approved.
    pub fn needs_caller(&self) -> bool {
        self.is_terminal() || self.stage == Status::WaitingUserInput
    }
}

/// Whether a change to `status` is shown with what the row holds (answer,
/// error, question) rather than the notification alone.
fn reads_row(status: Status) -> bool {
    status.is_terminal() || status == Status::WaitingUserInput
}

/// What a subscriber follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Request(Uuid),
    User(Uuid),
}

/// A message to one subscriber.
#[derive(Debug, Clone)]
pub enum Push {
    Change(Arc<Change>),
    /// Notifications may have been missed: re-read from the database.
    Resync,
    /// A piece of a streamed answer (only to subscribers that asked).
    Delta(Arc<DeltaNote>),
}

struct Sink {
    id: u64,
    tx: mpsc::Sender<Push>,
    lagged: Arc<AtomicBool>,
    /// Takes the pieces of streamed answers.
    deltas: bool,
}

impl Sink {
    /// Never waits: a full queue marks the subscriber lagged instead.
    fn offer(&self, push: Push) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(push) {
            self.lagged.store(true, Ordering::Relaxed);
        }
    }
}

#[derive(Default)]
struct Subs {
    by_request: HashMap<Uuid, Vec<Sink>>,
    by_user: HashMap<Uuid, Vec<Sink>>,
}

/// The in-memory fan-out of notifications to HTTP subscribers.
pub struct Hub {
    subs: Mutex<Subs>,
    next_id: AtomicU64,
}

/// One subscriber's registration; unregisters when dropped.
pub struct Subscription {
    hub: Arc<Hub>,
    target: Target,
    id: u64,
    rx: mpsc::Receiver<Push>,
    lagged: Arc<AtomicBool>,
}

impl Subscription {
    pub fn target(&self) -> Target {
        self.target
    }

    /// The next push; `None` when the hub stopped. Cancel-safe.
    pub async fn recv(&mut self) -> Option<Push> {
        self.rx.recv().await
    }

    /// True (once) when pushes were dropped since the last call.
    pub fn take_lagged(&self) -> bool {
        self.lagged.swap(false, Ordering::Relaxed)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.remove(self.target, self.id);
    }
}

impl Hub {
    pub fn new() -> Arc<Hub> {
        Arc::new(Hub {
            subs: Mutex::new(Subs::default()),
            next_id: AtomicU64::new(1),
        })
    }

    /// Registers a subscriber with a queue of `capacity` pushes. Register
    /// before reading the current state, so no change slips in between.
    pub fn subscribe(self: &Arc<Self>, target: Target, capacity: usize) -> Subscription {
        self.register(target, capacity, false)
    }

    /// [`Hub::subscribe`], with the pieces of streamed answers too.
    pub fn subscribe_streaming(self: &Arc<Self>, target: Target, capacity: usize) -> Subscription {
        self.register(target, capacity, true)
    }

    fn register(self: &Arc<Self>, target: Target, capacity: usize, deltas: bool) -> Subscription {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let lagged = Arc::new(AtomicBool::new(false));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let sink = Sink {
            id,
            tx,
            lagged: lagged.clone(),
            deltas,
        };
        if let Ok(mut subs) = self.subs.lock() {
            match target {
                Target::Request(r) => subs.by_request.entry(r).or_default().push(sink),
                Target::User(u) => subs.by_user.entry(u).or_default().push(sink),
            }
        }
        Subscription {
            hub: self.clone(),
            target,
            id,
            rx,
            lagged,
        }
    }

    fn remove(&self, target: Target, id: u64) {
        let Ok(mut subs) = self.subs.lock() else { return };
        let (map, key) = match target {
            Target::Request(r) => (&mut subs.by_request, r),
            Target::User(u) => (&mut subs.by_user, u),
        };
        if let Some(v) = map.get_mut(&key) {
            v.retain(|s| s.id != id);
            if v.is_empty() {
                map.remove(&key);
            }
        }
    }

    /// Whether anyone follows a user.
    fn follows_users(&self) -> bool {
        self.subs.lock().is_ok_and(|s| !s.by_user.is_empty())
    }

    /// Subscribers by request and by user.
    pub fn counts(&self) -> (usize, usize) {
        self.subs
            .lock()
            .map(|s| {
                (
                    s.by_request.values().map(Vec::len).sum(),
                    s.by_user.values().map(Vec::len).sum(),
                )
            })
            .unwrap_or((0, 0))
    }

    /// Tells every subscriber to re-read from the database.
    pub fn resync_all(&self, reason: &'static str) {
        let Ok(subs) = self.subs.lock() else { return };
        let mut n = 0;
        for sink in subs.by_request.values().chain(subs.by_user.values()).flatten() {
            sink.offer(Push::Resync);
            n += 1;
        }
        if n > 0 {
            tracing::info!(subscribers = n, reason, "live: subscribers re-read their state");
        }
    }

    /// Which ids of `events` need a row read: terminal and waiting ones
    /// someone follows (their answer, error or question is in the row),
    /// and, when anyone follows a user, those whose user is not cached.
    fn plan(&self, events: &[Event], users: &HashMap<Uuid, Uuid>) -> Vec<Uuid> {
        let Ok(subs) = self.subs.lock() else {
            return Vec::new();
        };
        let by_user = !subs.by_user.is_empty();
        let mut ids: Vec<Uuid> = events
            .iter()
            .filter(|e| {
                let user = users.get(&e.id);
                let followed = subs.by_request.contains_key(&e.id)
                    || (by_user && user.is_none_or(|u| subs.by_user.contains_key(u)));
                (reads_row(e.status) && followed) || (by_user && user.is_none())
            })
            .map(|e| e.id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Delivers a batch of notifications; `rows` are the rows read for it.
    fn deliver(&self, events: &[Event], rows: &HashMap<Uuid, RequestStatus>, users: &mut HashMap<Uuid, Uuid>) {
        for row in rows.values() {
            users.insert(row.id, row.user_id);
        }
        let Ok(subs) = self.subs.lock() else { return };
        for e in events {
            let user = users.get(&e.id).copied();
            let req_sinks = subs.by_request.get(&e.id);
            let user_sinks = user.and_then(|u| subs.by_user.get(&u));
            if req_sinks.is_some() || user_sinks.is_some() {
                // Terminal and waiting states come from the table (answer,
                // error, question); others from the notification, in its
                // order.
                let change = match rows.get(&e.id) {
                    Some(row) if reads_row(e.status) => Change::from(row.clone()),
                    _ => Change {
                        id: e.id,
                        status: e.status,
                        answer: None,
                        error: None,
                        question: None,
                    },
                };
                let change = Arc::new(change);
                for sink in req_sinks.into_iter().flatten().chain(user_sinks.into_iter().flatten()) {
                    sink.offer(Push::Change(change.clone()));
                }
            }
            if e.status.is_terminal() {
                users.remove(&e.id);
            }
        }
        if users.len() > USER_CACHE_LIMIT {
            users.clear();
        }
    }

    /// Offers a piece of a streamed answer to the subscribers that take
    /// them: those of its request, and those of its user when cached.
    fn deliver_delta(&self, note: DeltaNote, users: &HashMap<Uuid, Uuid>) {
        let Ok(subs) = self.subs.lock() else { return };
        let req_sinks = subs.by_request.get(&note.id);
        let user_sinks = users.get(&note.id).and_then(|u| subs.by_user.get(u));
        if req_sinks.is_none() && user_sinks.is_none() {
            return;
        }
        let note = Arc::new(note);
        for sink in req_sinks.into_iter().flatten().chain(user_sinks.into_iter().flatten()) {
            if sink.deltas {
                sink.offer(Push::Delta(note.clone()));
            }
        }
    }
}

/// Runs the hub until `shutdown`: takes notifications from `events` (the
/// listener's broadcast, subscribed before the engine started) and fans them
/// out. Ends every subscription when it returns.
pub async fn run_hub(
    hub: Arc<Hub>,
    pool: Pool,
    notifier: Arc<Notifier>,
    mut events: broadcast::Receiver<Event>,
    shutdown: CancellationToken,
) {
    let mut users: HashMap<Uuid, Uuid> = HashMap::new();
    let mut deltas = notifier.subscribe_deltas();
    let mut connects = notifier.connects();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = events.recv() => r,
            d = deltas.recv() => {
                // A piece missed here is read from the table by the
                // follower that sees the gap; the terminal state has all.
                match d {
                    Ok(note) => deliver_note(&hub, &pool, note, &mut users).await,
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                }
                continue;
            }
            _ = tick.tick() => {
                // A (re)connected listener: notifications sent before it
                // listened are gone, so everyone re-reads (after the first
                // connect too: a subscriber may have read the table before).
                let now = notifier.connects();
                if now != connects {
                    connects = now;
                    hub.resync_all("listener reconnected");
                    crate::metrics::live_resync("listener_reconnected");
                }
                continue;
            }
        };
        let mut batch = Vec::new();
        let mut lagged = false;
        match first {
            Ok(e) => batch.push(e),
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(missed = n, "live: fell behind the notifications");
                lagged = true;
            }
            Err(broadcast::error::RecvError::Closed) => break,
        }
        while batch.len() < BATCH {
            match events.try_recv() {
                Ok(e) => batch.push(e),
                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "live: fell behind the notifications");
                    lagged = true;
                }
                Err(_) => break,
            }
        }
        if lagged {
            users.clear();
            hub.resync_all("hub lagged");
            crate::metrics::live_resync("hub_lagged");
        }
        if batch.is_empty() {
            continue;
        }
        deliver_batch(&hub, &pool, &batch, &mut users).await;
    }
    // Dropping the sinks ends every subscriber's queue.
    if let Ok(mut subs) = hub.subs.lock() {
        subs.by_request.clear();
        subs.by_user.clear();
    }
}

/// Delivers a piece of a streamed answer; when someone follows a user and
/// the request's user is not cached (a subscriber that joined mid-answer),
/// it is looked up first (once: it stays cached until the request ends).
async fn deliver_note(hub: &Hub, pool: &Pool, note: DeltaNote, users: &mut HashMap<Uuid, Uuid>) {
    if !users.contains_key(&note.id) && hub.follows_users() {
        match read_states(pool, &[note.id]).await {
            Ok(rows) => users.extend(rows.into_iter().map(|r| (r.id, r.user_id))),
            Err(e) => tracing::debug!(error = %e, "live: could not look up the user of a streamed answer"),
        }
    }
    hub.deliver_delta(note, users);
}

/// Reads the rows a batch of notifications needs ([`Hub::plan`]) and
/// delivers it; when the rows cannot be read, every subscriber re-reads
/// once the database answers again.
async fn deliver_batch(hub: &Hub, pool: &Pool, batch: &[Event], users: &mut HashMap<Uuid, Uuid>) {
    let ids = hub.plan(batch, users);
    let mut rows = HashMap::new();
    if !ids.is_empty() {
        match read_states(pool, &ids).await {
            Ok(found) => rows.extend(found.into_iter().map(|r| (r.id, r))),
            Err(e) => {
                tracing::warn!(error = %e, "live: could not read request states; subscribers will re-read");
                hub.resync_all("lookup failed");
                crate::metrics::live_resync("lookup_failed");
                return;
            }
        }
    }
    hub.deliver(batch, &rows, users);
}

async fn read_states(pool: &Pool, ids: &[Uuid]) -> Result<Vec<RequestStatus>, crate::db::Error> {
    let client = pool.get().await?;
    request_states(&client, ids).await
}

#[cfg(test)]
mod tests;
