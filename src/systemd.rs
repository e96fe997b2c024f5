//! systemd integration for `Type=notify` units (`systemd/maasd.service`).
//!
//! - `READY=1` only once migrations are applied and the LISTEN session is in
//!   place ([`Engine::is_listening`]): the unit is not "started" before
//!   `maasd` can hear a notification.
//! - The watchdog (`WATCHDOG=1`, `WatchdogSec=`) is fed from a liveness
//!   check, not from a timer: only while the listener loop shows progress
//!   ([`Engine::listener_silence`]) — each health query on the LISTEN session
//!   that succeeds, and each reconnect attempt while the database is away —
//!   and the engine is not wedged ([`Engine::stall`]): no claim runs past
//!   `engine_stall_secs`, every dispatcher answers the sweep's wake, the
//!   sweep finishes its passes. A claim loop stuck in a statement or gone
//!   stops the pings, and systemd restarts the daemon.
//!   A hung runtime, a wedged listener task or a health query stuck past its
//!   timeout stop the pings, and systemd restarts the daemon. A database
//!   outage does not: the daemon is doing the right thing (reconnecting), and
//!   restarting it would not help; `maasctl doctor` and `STATUS=` say so.
//! - `STATUS=` tells `systemctl status` what the daemon is doing;
//!   `STOPPING=1` is sent when the graceful stop begins.
//!
//! Without `NOTIFY_SOCKET` (not under systemd) all of this is a no-op.

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::dispatcher::Engine;

/// The longest the listener loop may legitimately go without a sign of life:
/// between two health queries (interval plus timeout), or one reconnect
/// attempt (connect timeout, LISTEN under the health timeout, then the
/// capped backoff), plus slack. `WatchdogSec=` must be longer than this.
pub fn liveness_bound(cfg: &Config) -> Duration {
    let healthy = Duration::from_secs(cfg.listener.health_secs + cfg.listener.health_timeout_secs);
    let reconnecting = Duration::from_secs(5 + cfg.listener.health_timeout_secs)
        + Duration::from_millis(cfg.listener.reconnect_max_ms);
    healthy.max(reconnecting) + Duration::from_secs(5)
}

/// Spawns the notifier: READY when listening, then the watchdog and STATUS
/// updates until `shutdown`, then STOPPING (and the watchdog keeps being fed
/// while the graceful stop runs; `TimeoutStopSec=` bounds it).
pub fn spawn(engine: Arc<Engine>, cfg: Arc<Config>, shutdown: CancellationToken) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    tokio::spawn(supervise(engine, cfg, shutdown));
}

fn notify(state: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!(error = %e, "systemd: notify failed");
    }
}

async fn supervise(engine: Arc<Engine>, cfg: Arc<Config>, shutdown: CancellationToken) {
    let watchdog = sd_notify::watchdog_enabled();
    let bound = liveness_bound(&cfg);
    if let Some(wd) = watchdog
        && wd <= bound
    {
        tracing::warn!(
            watchdog_ms = wd.as_millis(),
            liveness_bound_ms = bound.as_millis(),
            "systemd: WatchdogSec is shorter than the listener's liveness bound; raise WatchdogSec"
        );
    }
    // The watchdog runs from process start; feed it while waiting for LISTEN
    // too (migrations are done; the first connect may take a moment).
    let ping = watchdog.map_or(Duration::from_secs(3600), |wd| (wd / 2).max(Duration::from_millis(100)));
    if !wait_listening(&engine, &shutdown, watchdog.is_some(), ping, bound).await {
        return stopping(watchdog, ping).await;
    }
    notify(&[
        NotifyState::Ready,
        NotifyState::Status(&format!(
            "listening on {}; worker {}",
            crate::listener::CHANNEL,
            engine.worker()
        )),
    ]);
    tracing::info!("systemd: READY=1 sent (migrated and listening)");
    // Ping on every tick while alive: more often than needed is harmless,
    // and STATUS follows the LISTEN session within a few seconds.
    let mut tick = tokio::time::interval(ping.min(Duration::from_secs(5)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut alive = Alive {
        listening: true,
        starved: false,
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return stopping(watchdog, ping).await,
            _ = tick.tick() => {}
        }
        alive.status(&engine);
        if watchdog.is_some() {
            alive.feed(&engine, bound);
        }
    }
}

/// Waits until the engine listens, feeding the watchdog (when `watchdog`)
/// every `ping` while the listener loop shows progress; false when
/// `shutdown` comes first.
async fn wait_listening(
    engine: &Engine,
    shutdown: &CancellationToken,
    watchdog: bool,
    ping: Duration,
    bound: Duration,
) -> bool {
    let mut last_ping = tokio::time::Instant::now();
    loop {
        if engine.is_listening() {
            return true;
        }
        if watchdog && last_ping.elapsed() >= ping && engine.listener_silence() <= bound {
            notify(&[NotifyState::Watchdog]);
            last_ping = tokio::time::Instant::now();
        }
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}

/// What the notifier last told systemd once the daemon was ready.
struct Alive {
    listening: bool,
    /// The watchdog is no longer fed.
    starved: bool,
}

impl Alive {
    /// STATUS follows the LISTEN session.
    fn status(&mut self, engine: &Engine) {
        let now_listening = engine.is_listening();
        if now_listening == self.listening {
            return;
        }
        self.listening = now_listening;
        let status = if now_listening {
            format!("listening on {}; worker {}", crate::listener::CHANNEL, engine.worker())
        } else {
            "LISTEN session lost; reconnecting (the sweep keeps due rows moving)".to_owned()
        };
        notify(&[NotifyState::Status(&status)]);
    }

    /// Feeds the watchdog while the listener loop progresses within `bound`
    /// and the engine is not stalled; says once when it stops and resumes.
    fn feed(&mut self, engine: &Engine, bound: Duration) {
        let silence = engine.listener_silence();
        let stall = engine.stall();
        if silence <= bound && stall.is_none() {
            if self.starved {
                tracing::info!("systemd: the engine progresses again; feeding the watchdog");
            }
            notify(&[NotifyState::Watchdog]);
            self.starved = false;
        } else if !self.starved {
            self.starved = true;
            match stall {
                Some(stall) => tracing::error!(
                    stall = %stall,
                    "systemd: the engine makes no progress; no longer feeding the watchdog"
                ),
                None => tracing::error!(
                    silent_ms = silence.as_millis(),
                    "systemd: the listener loop shows no progress; no longer feeding the watchdog"
                ),
            }
        }
    }
}

/// Sends `STOPPING=1` once per process, from whichever comes first: the
/// notifier task, or the daemon itself when its graceful stop is done (a
/// fast stop may end before the notifier task is polled).
pub fn notify_stopping() {
    static SENT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if std::env::var_os("NOTIFY_SOCKET").is_none() || SENT.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    notify(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping: no longer claiming; finishing running stages"),
    ]);
}

async fn stopping(watchdog: Option<Duration>, ping: Duration) {
    notify_stopping();
    if watchdog.is_none() {
        return;
    }
    loop {
        tokio::time::sleep(ping).await;
        notify(&[NotifyState::Watchdog]);
    }
}
