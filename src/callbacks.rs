//! Callback deliveries (telling the user's application of an outcome), from the durable
//! outbox `callback_outbox`.
//!
//! - **Nothing is lost.** A trigger queues the delivery in the same
//!   transaction as the request's terminal transition (`COMPLETED`, `FAILED`,
//!   `CANCELLED`), whoever makes it. The outbox row lives until it is
//!   delivered or given up (`dead`), across restarts of any daemon.
//! - **Several daemons.** Each daemon runs one worker. A worker claims due
//!   rows with `FOR UPDATE SKIP LOCKED` and pushes their `next_attempt_at`
//!   past the delivery timeout as a lease, so no two workers deliver the same
//!   row at once, and a delivery whose daemon died is retried after the lease.
//! - **At least once.** A receiver may see a delivery twice (a crash between
//!   its `2xx` and our record of it); `X-Maas-Delivery` is the outbox id, the
//!   key to deduplicate on.
//! - **Retries** with exponential backoff and jitter, stored in the row
//!   (`next_attempt_at`), up to `callbacks.max_attempts`, then `dead`.
//! - **Signed.** `X-Maas-Signature: sha256=<hex HMAC-SHA256(secret,
//!   "{X-Maas-Timestamp}.{body}")>`; see [`sign`] and [`verify`]. The
//!   secret is the request's tenant's `callback_secret` when it has one
//!   (`maasctl tenants set --callback-secret`), else `callbacks.secret`.
//!   Without `callbacks.secret` nothing is sent: deliveries wait in the
//!   outbox.
//! - Redirects are not followed; only a `2xx` counts as delivered.
//! - Never to loopback, private, link-local or unique-local addresses unless
//!   `callbacks.allow_networks` names them, checked on the address connected
//!   to ([`guard`]); a refused destination is given up at once (`dead`).
//! - The worker wakes when the LISTEN session reports a terminal status, and
//!   polls every `callbacks.poll_secs` otherwise (retries, missed wakes).
//! - It runs as the daemon service [`Callbacks`].
//! - Every attempt is counted by outcome (`maas_callback_deliveries_total`:
//!   delivered, failed, dead).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::sync::{Notify, Semaphore, broadcast};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{CallbacksConfig, Config};
use crate::db::Pool;
use crate::listener::{Event, Notifier};
use crate::repo::callbacks::{self as outbox, Delivery};
use crate::service::Service;

pub mod guard;

/// `sha256=` and the hex HMAC-SHA256 of `"{timestamp}.{body}"`.
pub const SIGNATURE_HEADER: &str = "x-maas-signature";
/// Unix seconds when the attempt was signed; part of the signed text, so a
/// receiver can refuse old replays.
pub const TIMESTAMP_HEADER: &str = "x-maas-timestamp";
/// The outbox id: the same for every attempt of one delivery.
pub const DELIVERY_HEADER: &str = "x-maas-delivery";
/// `request.completed`, `request.failed` or `request.cancelled`.
pub const EVENT_HEADER: &str = "x-maas-event";

/// Woken by events, the worker claims at most this often.
const MIN_PASS_INTERVAL: Duration = Duration::from_millis(100);

type HmacSha256 = Hmac<Sha256>;

/// The signature header value for `body` sent at `timestamp`.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    // HMAC takes keys of any length; new_from_slice cannot fail for it.
    let Ok(mut mac) = HmacSha256::new_from_slice(secret) else {
        return String::new();
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256=");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Checks a signature header in constant time (for receivers and tests).
pub fn verify(secret: &[u8], timestamp: i64, body: &[u8], header: &str) -> bool {
    let Some(hex) = header.strip_prefix("sha256=") else {
        return false;
    };
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return false;
    }
    let bytes: Vec<u8> = (0..32)
        .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    let Ok(mut mac) = HmacSha256::new_from_slice(secret) else {
        return false;
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.verify_slice(&bytes).is_ok()
}

/// The delivery worker as a daemon service. It subscribes to the
/// notifier when built, so build it before the engine runs.
pub struct Callbacks {
    pool: Pool,
    cfg: Arc<Config>,
    events: Mutex<Option<broadcast::Receiver<Event>>>,
}

impl Callbacks {
    pub fn new(pool: Pool, cfg: Arc<Config>, notifier: &Notifier) -> Callbacks {
        Callbacks {
            pool,
            cfg,
            events: Mutex::new(Some(notifier.subscribe())),
        }
    }
}

impl Service for Callbacks {
    fn name(&self) -> &'static str {
        "callbacks"
    }

    fn run(self: Arc<Self>, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        let events = self.events.lock().ok().and_then(|mut e| e.take());
        async move {
            let Some(events) = events else {
                tracing::error!("callbacks: service started twice");
                return;
            };
            run(self.pool.clone(), self.cfg.clone(), events, shutdown).await;
        }
        .boxed()
    }
}

/// Runs the delivery worker until `shutdown`; `events` wakes it.
pub async fn run(pool: Pool, cfg: Arc<Config>, events: broadcast::Receiver<Event>, shutdown: CancellationToken) {
    let cb = &cfg.callbacks;
    if cb.secret.expose().is_empty() {
        tracing::info!(
            "callbacks: callbacks.secret is not set; deliveries wait in callback_outbox until it is \
             (maasctl doctor reports them)"
        );
        return;
    }
    // Validated at load; a bad entry here would have stopped the daemon.
    let guard = guard::Guard::new(crate::config::netallow::parse(&cb.allow_networks).unwrap_or_default());
    let http = match reqwest::Client::builder()
        .user_agent(concat!("maas/", env!("CARGO_PKG_VERSION"), " (callbacks)"))
        .timeout(cb.timeout())
        .connect_timeout(cb.timeout())
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(guard.clone()))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "callbacks: cannot build the HTTP client; no deliveries from this daemon");
            return;
        }
    };
    let worker = Arc::new(Worker {
        pool,
        cfg: cfg.clone(),
        http,
        guard,
    });
    worker.run(events, shutdown).await;
}

/// The worker's delivery slots: `callbacks.concurrency` permits, a bell
/// rung when one is freed (so a worker that filled every slot claims again
/// at once instead of at the next poll), and the deliveries running.
struct Slots {
    free: Arc<Semaphore>,
    freed: Arc<Notify>,
    tasks: TaskTracker,
}

struct Worker {
    pool: Pool,
    cfg: Arc<Config>,
    http: reqwest::Client,
    guard: guard::Guard,
}

impl Worker {
    fn cb(&self) -> &CallbacksConfig {
        &self.cfg.callbacks
    }

    /// The lease of a claimed delivery: the longest it can take, plus slack.
    fn lease(&self) -> Duration {
        self.cb().timeout().saturating_mul(2) + Duration::from_secs(5)
    }

    async fn run(self: Arc<Self>, events: broadcast::Receiver<Event>, shutdown: CancellationToken) {
        let slots = Slots {
            free: Arc::new(Semaphore::new(self.cb().concurrency)),
            freed: Arc::new(Notify::new()),
            tasks: TaskTracker::new(),
        };
        let mut events = Some(events);
        while let Some(last_pass) = self.fill(&slots, &shutdown).await {
            if !self.wait(&slots, &mut events, last_pass, &shutdown).await {
                break;
            }
        }
        // Deliveries in flight end within their timeout; a delivery cut
        // short is retried after its lease.
        slots.tasks.close();
        let bound = self.cb().timeout() + Duration::from_secs(1);
        if tokio::time::timeout(bound, slots.tasks.wait()).await.is_err() {
            tracing::warn!("callbacks: deliveries still running at shutdown; they will be retried");
        }
    }

    /// Claims as many due deliveries as there are free slots and starts
    /// each in its slot, until no slot is free or fewer were due. Returns
    /// when the last claim began (`None` at shutdown).
    async fn fill(self: &Arc<Self>, slots: &Slots, shutdown: &CancellationToken) -> Option<Instant> {
        loop {
            if shutdown.is_cancelled() {
                return None;
            }
            let pass = Instant::now();
            let free = slots.free.available_permits().min(self.cb().batch);
            if free == 0 {
                return Some(pass);
            }
            let claimed = match self.pool.get().await {
                Ok(client) => outbox::claim(&client, free, self.lease()).await,
                Err(e) => Err(e.into()),
            };
            let due = match claimed {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!(error = %e, "callbacks: claim failed; retrying at the next poll");
                    return Some(pass);
                }
            };
            let n = due.len();
            for d in due {
                let Ok(permit) = slots.free.clone().try_acquire_owned() else {
                    break; // cannot happen: we claimed at most `free`
                };
                let me = self.clone();
                let freed = slots.freed.clone();
                slots.tasks.spawn(async move {
                    me.deliver(d).await;
                    drop(permit);
                    freed.notify_one();
                });
            }
            if n < free {
                return Some(pass);
            }
        }
    }

    /// Waits for a terminal transition (bursts coalesced to one pass per
    /// `MIN_PASS_INTERVAL` after `last_pass`), a freed slot (if all were
    /// taken) or the poll tick: true, time for a pass; false at shutdown.
    async fn wait(
        &self,
        slots: &Slots,
        events: &mut Option<broadcast::Receiver<Event>>,
        last_pass: Instant,
        shutdown: &CancellationToken,
    ) -> bool {
        let saturated = slots.free.available_permits() == 0;
        let tick = tokio::time::sleep(Duration::from_secs(self.cb().poll_secs));
        tokio::pin!(tick);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = &mut tick => return true,
                _ = slots.freed.notified(), if saturated => return true,
                ev = async { match events.as_mut() { Some(rx) => rx.recv().await, None => std::future::pending().await } } => {
                    match ev {
                        Ok(ev) if !ev.status.is_terminal() => continue,
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                            let since = last_pass.elapsed();
                            if since < MIN_PASS_INTERVAL {
                                tokio::select! {
                                    _ = shutdown.cancelled() => return false,
                                    _ = tokio::time::sleep(MIN_PASS_INTERVAL - since) => {}
                                }
                            }
                            return true;
                        }
                        Err(broadcast::error::RecvError::Closed) => {
                            *events = None;
                        }
                    }
                }
            }
        }
    }

    async fn deliver(&self, d: Delivery) {
        let ts = chrono::Utc::now().timestamp();
        let secret = d.tenant_secret.as_ref().unwrap_or(&self.cb().secret);
        let signature = sign(secret.expose().as_bytes(), ts, d.body.as_bytes());
        let started = Instant::now();
        // An address in the URL is not resolved, so not seen by the guard's resolver.
        if let Some(refused) = reqwest::Url::parse(&d.url)
            .ok()
            .and_then(|u| self.guard.check_url(&u).err())
        {
            return self.refuse(&d, &refused.to_string()).await;
        }
        let sent = self
            .http
            .post(&d.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(EVENT_HEADER, &d.event)
            .header(DELIVERY_HEADER, d.id.to_string())
            .header(TIMESTAMP_HEADER, ts.to_string())
            .header(SIGNATURE_HEADER, signature)
            .body(d.body.clone())
            .send()
            .await;
        let host = reqwest::Url::parse(&d.url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default();
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (status, error) = match sent {
            Ok(resp) if resp.status().is_success() => {
                crate::metrics::callback_delivery("delivered", started.elapsed());
                let status = i32::from(resp.status().as_u16());
                tracing::debug!(delivery = d.id, request.id = %d.request_id, %host, status, ms, "callback delivered");
                self.record(|c| async move { outbox::delivered(&c, d.id, status).await })
                    .await;
                return;
            }
            Ok(resp) => (
                Some(i32::from(resp.status().as_u16())),
                format!("HTTP {}", resp.status()),
            ),
            // Without the URL: it may carry a token in its query string.
            Err(e) if refused(&e) => return self.refuse(&d, &describe(&e.without_url())).await,
            Err(e) => (None, describe(&e.without_url())),
        };
        let attempts = u32::try_from(d.attempt).unwrap_or(u32::MAX);
        let dead = attempts >= self.cb().max_attempts;
        let retry_in = self.cb().retry_delay(attempts);
        crate::metrics::callback_delivery(if dead { "dead" } else { "failed" }, started.elapsed());
        if dead {
            tracing::warn!(delivery = d.id, request.id = %d.request_id, %host, attempt = attempts, error = %error,
                "callback failed; attempts exhausted, delivery is dead");
        } else {
            tracing::warn!(delivery = d.id, request.id = %d.request_id, %host, attempt = attempts, error = %error,
                retry_in_ms = u64::try_from(retry_in.as_millis()).unwrap_or(u64::MAX), "callback failed; will retry");
        }
        let d = &d;
        let error = &error;
        self.record(|c| async move { outbox::failed(&c, d, status, error, retry_in, dead).await })
            .await;
    }

    /// A destination the guard refuses: given up at once (no retry can
    /// change the answer short of a new configuration).
    async fn refuse(&self, d: &Delivery, error: &str) {
        tracing::warn!(delivery = d.id, request.id = %d.request_id, error = %error, "callback refused; delivery is dead");
        self.record(|c| async move { outbox::failed(&c, d, None, error, Duration::ZERO, true).await })
            .await;
    }

    /// Writes an attempt's outcome, retrying briefly; if the database stays
    /// away, the lease runs out and the delivery is attempted again.
    async fn record<F, Fut>(&self, write: F)
    where
        F: Fn(deadpool_postgres::Object) -> Fut,
        Fut: std::future::Future<Output = Result<(), crate::db::Error>>,
    {
        for delay_ms in [0u64, 200, 1000, 3000] {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            let res = match self.pool.get().await {
                Ok(c) => write(c).await,
                Err(e) => Err(e.into()),
            };
            match res {
                Ok(()) => return,
                Err(e) => tracing::warn!(error = %e, "callbacks: could not record a delivery outcome"),
            }
        }
    }
}

/// The guard's resolver refused every address of the destination.
fn refused(e: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<guard::Refused>() {
            return true;
        }
        source = s.source();
    }
    false
}

fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_redirect() {
        "redirect"
    } else {
        "request"
    };
    format!("{kind}: {}", crate::error::chain(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_verify_and_bind_the_timestamp_and_body() {
        let sig = sign(b"k", 1_700_000_000, b"{\"a\":1}");
        assert!(sig.starts_with("sha256=") && sig.len() == 71, "{sig}");
        assert!(verify(b"k", 1_700_000_000, b"{\"a\":1}", &sig));
        assert!(!verify(b"other", 1_700_000_000, b"{\"a\":1}", &sig));
        assert!(!verify(b"k", 1_700_000_001, b"{\"a\":1}", &sig));
        assert!(!verify(b"k", 1_700_000_000, b"{\"a\":2}", &sig));
        assert!(!verify(b"k", 1_700_000_000, b"{\"a\":1}", "sha256=zz"));
    }

    #[test]
    fn the_signed_text_is_timestamp_dot_body() {
        // RFC 4231 test case 2 (key "Jefe"), with the data split as "{ts}.{body}"
        // would be impossible; instead compare with HMAC over the joined text.
        let Ok(mut mac) = HmacSha256::new_from_slice(b"Jefe") else {
            panic!("hmac key");
        };
        mac.update(b"42.what do ya want for nothing?");
        let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            sign(b"Jefe", 42, b"what do ya want for nothing?"),
            format!("sha256={hex}")
        );
    }
}
