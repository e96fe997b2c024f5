//! The dedicated LISTEN session.
//!
//! - Its own direct connection, never a pooled one (a pool's driver discards
//!   notifications, and LISTEN does not survive PgBouncer's transaction mode).
//! - TCP keepalives and a timed health query on the same session: a frozen
//!   backend keeps TCP alive, and only a query notices.
//! - Reconnects with capped exponential backoff and jitter; the delay resets
//!   only after LISTEN succeeded.
//! - LISTEN before look: after every (re)connect it reports `connected`, and
//!   the daemon runs its catch-up sweep then, so nothing slips in between.
//! - Payloads are parsed strictly; junk is reported and skipped, never fatal.
//! - It owns the process's [`Notifier`]: every valid notification is
//!   broadcast there (after the handler saw it), and the notifier answers
//!   for the session's health (listening, silence, connects), so HTTP and
//!   the watchdog need no handle on the engine.
//! - The same session listens on [`DELTAS_CHANNEL`] too: the pieces of
//!   streamed answers ([`DeltaNote`]), broadcast on their own
//!   ([`Notifier::subscribe_deltas`]) to the live hub; the engine never
//!   sees them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use futures_util::StreamExt;
use serde::Deserialize;
use tokio::sync::{broadcast, mpsc};
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::Config;
use crate::db::pg_config;
use crate::metrics::Stats;
use crate::model::Status;

/// The channel the triggers notify (`triggers/0001_notify_pipeline_change.sql`).
pub const CHANNEL: &str = "pipeline_events";

/// The channel the publisher of a streamed answer notifies
/// (`sql/queries/delta_publish.sql`).
pub const DELTAS_CHANNEL: &str = "answer_deltas";

/// A notification from `answer_deltas`: piece `seq` of attempt `attempt` of
/// request `id`'s answer, a restart, or text that follows the piece before.
/// `text` is `None` for a restart and for a piece too long to be sent
/// inline (read it from the table: `repo::deltas::after`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct DeltaNote {
    pub id: Uuid,
    pub attempt: i32,
    pub seq: i32,
    #[serde(default)]
    pub restart: bool,
    #[serde(default)]
    pub text: Option<String>,
}

/// Parses an `answer_deltas` payload (see [`DeltaNote`]).
pub fn parse_delta(payload: &str) -> Result<DeltaNote, PayloadError> {
    if payload.len() > 8000 {
        return Err(PayloadError::TooLong(payload.len()));
    }
    serde_json::from_str(payload).map_err(|e| PayloadError::Malformed(e.to_string()))
}

/// A notification from `pipeline_events`: which row, its new status, and
/// the operation (`INSERT`, `UPDATE`, or `SWEEP` from `maasctl sweep`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: Uuid,
    pub status: Status,
    pub operation: String,
    /// A status the row passed through inside the statement that moved it
    /// on (`"passed": true`, `finish.sql`): announced, never claimable.
    pub passed: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PayloadError {
    #[error("payload is {0} bytes, more than a notification can carry")]
    TooLong(usize),
    #[error("payload is not the expected JSON object: {0}")]
    Malformed(String),
    #[error("payload names unknown status {0:?}")]
    UnknownStatus(String),
}

#[derive(Deserialize)]
struct RawEvent {
    id: Uuid,
    /// The status, or the text of one this program does not know.
    #[serde(deserialize_with = "status_or_text")]
    status: Result<Status, String>,
    #[serde(default)]
    operation: Option<String>,
    #[serde(default)]
    passed: bool,
}

/// A payload's `status`: a [`Status`] by its name, else the text (so an
/// unknown status is told apart from a malformed payload).
fn status_or_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Result<Status, String>, D::Error> {
    let text = String::deserialize(d)?;
    Ok(Status::from_name(&text).ok_or(text))
}

/// Parses a `pipeline_events` payload: `{"id": uuid, "status": text, "operation": text}`.
pub fn parse_payload(payload: &str) -> Result<Event, PayloadError> {
    if payload.len() > 8000 {
        return Err(PayloadError::TooLong(payload.len()));
    }
    let raw: RawEvent = serde_json::from_str(payload).map_err(|e| PayloadError::Malformed(e.to_string()))?;
    let status = raw
        .status
        .map_err(|text| PayloadError::UnknownStatus(text.chars().take(64).collect()))?;
    Ok(Event {
        id: raw.id,
        status,
        operation: raw.operation.unwrap_or_default(),
        passed: raw.passed,
    })
}

/// What the listener reports to its owner (the engine), besides what it
/// records in the [`Notifier`].
pub trait ListenerHandler: Send + Sync + 'static {
    /// LISTEN is in place (first connect or reconnect): run the catch-up sweep.
    fn connected(&self, reconnect: bool);
    /// The session was lost; notifications are not arriving.
    fn disconnected(&self, reason: &str);
    /// A valid notification, before it is broadcast.
    fn event(&self, event: &Event);
}

/// Capacity of the event broadcast: a subscriber that falls this far behind
/// is told it lagged.
const EVENTS: usize = 4096;
/// Capacity of the broadcast of streamed answers' pieces.
const DELTAS: usize = 16384;

/// The LISTEN session's output and health, shared by every part of the
/// process that follows notifications (the live push, callbacks, readiness,
/// the watchdog). Updated only by [`run`].
pub struct Notifier {
    events: broadcast::Sender<Event>,
    deltas: broadcast::Sender<DeltaNote>,
    listening: AtomicBool,
    /// The listener loop's last sign of life, in ms since `born`.
    born: Instant,
    alive_ms: AtomicU64,
    stats: Arc<Stats>,
}

impl Notifier {
    /// A notifier counting into `stats` (notifications, junk, connects).
    pub fn new(stats: Arc<Stats>) -> Arc<Notifier> {
        let (events, _) = broadcast::channel(EVENTS);
        let (deltas, _) = broadcast::channel(DELTAS);
        Arc::new(Notifier {
            events,
            deltas,
            listening: AtomicBool::new(false),
            born: Instant::now(),
            alive_ms: AtomicU64::new(0),
            stats,
        })
    }

    /// Every valid notification from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Every piece of a streamed answer notified from now on.
    pub fn subscribe_deltas(&self) -> broadcast::Receiver<DeltaNote> {
        self.deltas.subscribe()
    }

    /// True while the LISTEN session is up.
    pub fn is_listening(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    /// How long since the listener loop last showed progress (a health
    /// query answered, a LISTEN set up, a reconnect attempted).
    pub fn silence(&self) -> Duration {
        let last = Duration::from_millis(self.alive_ms.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(last)
    }

    /// How many times LISTEN was set up (first connect included): a change
    /// means notifications may have been missed in between.
    pub fn connects(&self) -> u64 {
        self.stats.listener_connects.load(Ordering::Relaxed)
    }

    /// The counters this notifier feeds (shared with the engine).
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    fn alive(&self) {
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.alive_ms.store(now, Ordering::Relaxed);
    }

    fn connected(&self, reconnect: bool) {
        self.alive();
        self.listening.store(true, Ordering::Relaxed);
        self.stats.listener_connects.fetch_add(1, Ordering::Relaxed);
        if reconnect {
            self.stats.listener_reconnects.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn disconnected(&self) {
        self.listening.store(false, Ordering::Relaxed);
    }

    fn event(&self, event: Event, handler: &dyn ListenerHandler) {
        self.stats.notifications.fetch_add(1, Ordering::Relaxed);
        handler.event(&event);
        let _ = self.events.send(event);
    }

    fn junk(&self, payload: &str, error: &PayloadError) {
        self.stats.junk_payloads.fetch_add(1, Ordering::Relaxed);
        let shown: String = payload.chars().take(120).collect();
        tracing::warn!(payload = %shown, %error, "listener: skipped a notification that is not a pipeline event");
    }
}

/// Runs until `shutdown`: connect, LISTEN, report, forward; reconnect on
/// any failure.
pub async fn run(
    cfg: Arc<Config>,
    notifier: Arc<Notifier>,
    handler: Arc<dyn ListenerHandler>,
    shutdown: CancellationToken,
) {
    let backoff_builder = crate::backoff::reconnect(
        Duration::from_millis(cfg.listener.reconnect_min_ms),
        Duration::from_millis(cfg.listener.reconnect_max_ms),
    );
    let mut backoff = backoff_builder.build();
    let mut connected_before = false;
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        notifier.alive();
        let reason = match session(
            &cfg,
            &notifier,
            handler.as_ref(),
            &shutdown,
            connected_before,
            &mut || {
                backoff = backoff_builder.build();
            },
        )
        .await
        {
            Ok(()) => return, // shutdown
            Err(reason) => reason,
        };
        if reason.listened {
            connected_before = true;
            notifier.disconnected();
            handler.disconnected(&reason.message);
        }
        tracing::warn!(error = %reason.message, "listener: session lost; reconnecting");
        let delay = backoff
            .next()
            .unwrap_or(Duration::from_millis(cfg.listener.reconnect_max_ms));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

struct SessionEnd {
    message: String,
    /// LISTEN had succeeded in this session.
    listened: bool,
}

/// One LISTEN session: connect, LISTEN, report, then forward notifications
/// and check the session's health until it fails or `shutdown`.
async fn session(
    cfg: &Config,
    notifier: &Notifier,
    handler: &dyn ListenerHandler,
    shutdown: &CancellationToken,
    reconnect: bool,
    reset_backoff: &mut (dyn FnMut() + Send),
) -> Result<(), SessionEnd> {
    let Some(mut conn) = connect(cfg, shutdown).await? else {
        return Ok(());
    };
    let listen = async {
        crate::repo::stats::listen(&conn.client, CHANNEL).await?;
        crate::repo::stats::listen(&conn.client, DELTAS_CHANNEL).await
    };
    match tokio::time::timeout(health_timeout(cfg), listen).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(SessionEnd::before_listen(format!("LISTEN: {e}"))),
        Err(_) => return Err(SessionEnd::before_listen("LISTEN timed out".into())),
    }
    reset_backoff();
    tracing::info!(channel = CHANNEL, reconnect, "listener: listening");
    notifier.connected(reconnect);
    handler.connected(reconnect);
    forward(cfg, &mut conn, notifier, handler, shutdown).await
}

impl SessionEnd {
    /// The session ended before LISTEN was in place.
    fn before_listen(message: String) -> SessionEnd {
        SessionEnd {
            message,
            listened: false,
        }
    }

    /// The session ended after LISTEN was in place.
    fn after_listen(message: String) -> SessionEnd {
        SessionEnd {
            message,
            listened: true,
        }
    }
}

/// A connected session: its client and the messages of its connection.
struct Connection {
    client: tokio_postgres::Client,
    messages: mpsc::UnboundedReceiver<Result<AsyncMessage, String>>,
    /// The task that drives the connection, stopped with the session.
    _driver: AbortOnDrop,
}

/// Opens the session's own direct connection and drives it in a task that
/// forwards its messages; `None` on shutdown.
async fn connect(cfg: &Config, shutdown: &CancellationToken) -> Result<Option<Connection>, SessionEnd> {
    let fail = SessionEnd::before_listen;
    let mut pg = pg_config(cfg.listen_url(), "maasd-listener").map_err(|e| fail(e.to_string()))?;
    crate::db::with_limits(&mut pg, &cfg.db);
    let tls = crate::db::tls::connector(cfg.listen_url()).map_err(|e| fail(e.to_string()))?;
    let (client, mut connection) = tokio::select! {
        _ = shutdown.cancelled() => return Ok(None),
        r = pg.connect(tls) => r.map_err(|e| fail(format!("connect: {}", crate::error::chain(&e))))?,
    };
    // Drive the connection ourselves and forward notifications; after the
    // first error or end, the connection is never polled again.
    let (tx, messages) = mpsc::unbounded_channel::<Result<AsyncMessage, String>>();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(msg) = messages.next().await {
            match msg {
                Ok(m) => {
                    if tx.send(Ok(m)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            }
        }
        let _ = tx.send(Err("connection closed by the server".into()));
    });
    Ok(Some(Connection {
        client,
        messages,
        _driver: AbortOnDrop(driver),
    }))
}

/// Forwards the notifications of a listening session and runs its health
/// query every `listener.health_secs`, until the session fails or
/// `shutdown` (then `Ok`).
async fn forward(
    cfg: &Config,
    conn: &mut Connection,
    notifier: &Notifier,
    handler: &dyn ListenerHandler,
    shutdown: &CancellationToken,
) -> Result<(), SessionEnd> {
    let ended = SessionEnd::after_listen;
    let mut health = tokio::time::interval(Duration::from_secs(cfg.listener.health_secs));
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    health.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            msg = conn.messages.recv() => match msg {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if n.channel() == DELTAS_CHANNEL {
                        match parse_delta(n.payload()) {
                            Ok(note) => {
                                // Nobody following is not an error.
                                let _ = notifier.deltas.send(note);
                            }
                            Err(e) => notifier.junk(n.payload(), &e),
                        }
                        continue;
                    }
                    if n.channel() != CHANNEL {
                        continue;
                    }
                    match parse_payload(n.payload()) {
                        Ok(event) => notifier.event(event, handler),
                        Err(e) => notifier.junk(n.payload(), &e),
                    }
                }
                Some(Ok(AsyncMessage::Notice(notice))) => {
                    tracing::debug!(notice = %notice.message(), "listener: server notice");
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(ended(e)),
                None => return Err(ended("connection task ended".into())),
            },
            _ = health.tick() => {
                match tokio::time::timeout(health_timeout(cfg), crate::repo::stats::ping(&conn.client)).await {
                    Ok(Ok(_)) => notifier.alive(),
                    Ok(Err(e)) => return Err(ended(format!("health query: {e}"))),
                    Err(_) => return Err(ended("health query timed out (backend frozen or network stalled)".into())),
                }
            }
        }
    }
}

fn health_timeout(cfg: &Config) -> Duration {
    Duration::from_secs(cfg.listener.health_timeout_secs)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_trigger_payload() {
        let id = Uuid::new_v4();
        let ev = parse_payload(&format!(r#"{{"id":"{id}","status":"ANALYZED","operation":"UPDATE"}}"#));
        assert_eq!(
            ev,
            Ok(Event {
                id,
                status: Status::Analyzed,
                operation: "UPDATE".into(),
                passed: false
            })
        );
        let passed = parse_payload(&format!(
            r#"{{"id":"{id}","status":"READY","operation":"UPDATE","passed":true}}"#
        ));
        assert_eq!(passed.map(|e| (e.status, e.passed)), Ok((Status::Ready, true)));
    }

    #[test]
    fn parses_the_delta_payload_with_or_without_its_text() {
        let id = Uuid::new_v4();
        let inline = parse_delta(&format!(
            r#"{{"id":"{id}","attempt":2,"seq":3,"restart":false,"text":"Hel"}}"#
        ));
        assert_eq!(
            inline.map(|n| (n.attempt, n.seq, n.text)),
            Ok((2, 3, Some("Hel".into())))
        );
        let pointer = parse_delta(&format!(r#"{{"id":"{id}","attempt":1,"seq":9,"restart":false}}"#));
        assert_eq!(pointer.map(|n| n.text), Ok(None));
        assert!(parse_delta("{}").is_err());
        let publish = crate::repo::statement("delta_publish").unwrap_or_default();
        assert!(
            publish.contains(&format!("pg_notify('{DELTAS_CHANNEL}'")),
            "the publisher rings this channel"
        );
    }

    #[test]
    fn refuses_junk_with_a_reason() {
        let id = Uuid::new_v4();
        for junk in ["", "garbage", "{}", "[1,2]", r#"{"id":"nope","status":"NEW"}"#, "null"] {
            assert!(matches!(parse_payload(junk), Err(PayloadError::Malformed(_))), "{junk}");
        }
        assert_eq!(
            parse_payload(&format!(r#"{{"id":"{id}","status":"EXPLODED"}}"#)),
            Err(PayloadError::UnknownStatus("EXPLODED".into()))
        );
        assert!(matches!(
            parse_payload(&"x".repeat(9000)),
            Err(PayloadError::TooLong(9000))
        ));
    }
}
