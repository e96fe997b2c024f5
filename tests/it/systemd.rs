//! systemd: `maasd` is READY only when migrated and listening, feeds the
//! watchdog, says STOPPING, and its unit file passes the exposure bar.

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use uuid::Uuid;

use crate::support::count;
use crate::support::daemon::Maasd;
use crate::support::db::{TestDb, value};
use crate::support::ops::{GENEROUS, fast};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maasd_is_ready_only_when_migrated_and_listening_and_feeds_the_watchdog() {
    use std::os::unix::net::UnixDatagram;
    let db = TestDb::empty().await; // maasd must migrate it first
    let c = db.client().await;
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("notify");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}.sock", Uuid::new_v4().simple()));
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut d = Maasd::spawn(
        &db.url,
        fast()
            .env("NOTIFY_SOCKET", path.display())
            .env("WATCHDOG_USEC", 1_000_000),
    );
    let deadline = std::time::Instant::now() + GENEROUS;
    let mut messages: Vec<String> = Vec::new();
    let mut buf = [0u8; 4096];
    let recv = |messages: &mut Vec<String>, buf: &mut [u8]| {
        if let Ok(n) = sock.recv(buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            true
        } else {
            false
        }
    };
    while !messages.iter().any(|m| m.contains("READY=1")) {
        assert!(std::time::Instant::now() < deadline, "no READY=1: {messages:?}");
        recv(&mut messages, &mut buf);
    }
    // At READY the schema is migrated and the LISTEN session exists.
    let version: i32 = value(&c, "SELECT max(version) FROM maas_migrations", &[]).await;
    assert_eq!(version, maas::db::migrate::latest_version());
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'maasd-listener'"
        )
        .await,
        1
    );
    // The watchdog is fed (every half interval).
    let before = messages.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        recv(&mut messages, &mut buf);
    }
    let after = messages.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    assert!(after - before >= 3, "watchdog pings: {messages:?}");
    d.signal(Signal::SIGTERM);
    let deadline = std::time::Instant::now() + GENEROUS;
    while !messages.iter().any(|m| m.contains("STOPPING=1")) {
        assert!(std::time::Instant::now() < deadline, "no STOPPING=1: {messages:?}");
        recv(&mut messages, &mut buf);
    }
    assert_eq!(d.wait_exit(GENEROUS).await, Some(0));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_unit_file_passes_the_exposure_bar() {
    let unit = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/maasd.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    for line in [
        "Type=notify",
        "WatchdogSec=",
        "Restart=on-failure",
        "TimeoutStopSec=45",
        "MemoryMax=",
        "IPAddressDeny=link-local multicast",
    ] {
        assert!(text.contains(line), "{line} missing from the unit");
    }
    // TimeoutStopSec covers the default grace period, the callback
    // deliveries in flight (their timeout + 1 s) and the final writes.
    let defaults = maas::config::Config::default();
    assert!(45 >= defaults.grace_secs + defaults.callbacks.timeout_secs + 1 + 10);
    let out = match Command::new("systemd-analyze")
        .args(["security", "--offline=yes"])
        .arg(&unit)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            crate::support::missing(
                Some("MAAS_REQUIRE_SYSTEMD_ANALYZE"),
                &format!("the exposure check: systemd-analyze is not available ({e}; Debian: apt-get install systemd)"),
            );
            return;
        }
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let Some(level) = text
        .lines()
        .find_map(|l| l.split("Overall exposure level for maasd.service:").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
    else {
        if text.contains("--offline") || text.contains("unrecognized option") {
            crate::support::missing(
                Some("MAAS_REQUIRE_SYSTEMD_ANALYZE"),
                &format!(
                    "the exposure check: this systemd-analyze has no --offline mode (systemd 250 or later has):\n{text}"
                ),
            );
            return;
        }
        panic!("no exposure level in the output:\n{text}");
    };
    assert!(level <= 2.0, "exposure {level} is above 2.0:\n{text}");
}

/// Watchdog pings received on `sock` within `window`.
fn pings_within(sock: &std::os::unix::net::UnixDatagram, window: Duration) -> usize {
    let mut buf = [0u8; 4096];
    let until = std::time::Instant::now() + window;
    let mut n = 0;
    while std::time::Instant::now() < until {
        if let Ok(len) = sock.recv(&mut buf)
            && String::from_utf8_lossy(&buf[..len]).contains("WATCHDOG=1")
        {
            n += 1;
        }
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maasd_stops_feeding_the_watchdog_while_its_claim_loop_is_wedged() {
    use std::os::unix::net::UnixDatagram;
    let db = TestDb::new().await;
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("notify");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}.sock", Uuid::new_v4().simple()));
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    // No statement or lock limit, so a claim behind a table lock hangs.
    let d = Maasd::spawn(
        &db.url,
        fast()
            .env("NOTIFY_SOCKET", path.display())
            .env("WATCHDOG_USEC", 1_000_000)
            .env("MAAS_ENGINE_STALL_SECS", 2)
            .env("MAAS_DB__LOCK_TIMEOUT_MS", 0)
            .env("MAAS_DB__STATEMENT_TIMEOUT_MS", 0),
    );
    let deadline = std::time::Instant::now() + GENEROUS;
    let mut buf = [0u8; 4096];
    loop {
        assert!(std::time::Instant::now() < deadline, "no READY=1");
        if let Ok(n) = sock.recv(&mut buf)
            && String::from_utf8_lossy(&buf[..n]).contains("READY=1")
        {
            break;
        }
    }
    // Idle with nothing due: fed.
    assert!(
        pings_within(&sock, Duration::from_secs(4)) >= 4,
        "an idle engine feeds the watchdog"
    );

    // Wedge the claim loop: the next claim (the sweep wakes every
    // dispatcher each second) waits for this lock forever; the LISTEN
    // session's health query does not touch the table and stays healthy.
    let mut holder = crate::support::db::connect(&db.url).await;
    let tx = holder.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE pipeline_runs IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let wedged = std::time::Instant::now();
    crate::support::wait_until(GENEROUS, "the daemon says the engine is wedged", || async {
        d.plain_log().contains("the engine makes no progress")
    })
    .await;
    let noticed = wedged.elapsed();
    assert!(noticed < Duration::from_secs(15), "noticed after {noticed:?}");
    // Drain what was sent before, then no more pings.
    let _ = pings_within(&sock, Duration::from_millis(600));
    assert_eq!(
        pings_within(&sock, Duration::from_secs(3)),
        0,
        "the watchdog is starved:\n{}",
        d.plain_log()
    );

    // Unwedged, it feeds again.
    tx.rollback().await.unwrap();
    assert!(
        pings_within(&sock, Duration::from_secs(4)) >= 2,
        "fed again:\n{}",
        d.plain_log()
    );
    let log = d.plain_log();
    assert!(
        ["claim has run for", "has not answered", "sweep has not finished"]
            .iter()
            .any(|why| log.contains(why)),
        "the log names the stall: {log}"
    );
    let _ = std::fs::remove_file(&path);
}
