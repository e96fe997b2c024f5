//! Callbacks: signed, retried, delivered once across daemons and restarts,
//! given up on dead receivers, and driven by freed slots.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::cli::{maasctl, maasctl_env};
use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{TestDb, by_name, value};
use crate::support::ops::{GENEROUS, fast, json, wait_listening, wait_status};
use crate::support::{count, wait_until};

/// One received callback.
#[derive(Clone, Debug)]
struct Received {
    headers: HashMap<String, String>,
    body: Bytes,
}

#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    /// Answer 500 to this many requests first.
    fail_first: Arc<Mutex<usize>>,
    /// Take this long to answer.
    slow: Duration,
}

async fn callback_receiver(fail_first: usize) -> (String, Receiver) {
    slow_callback_receiver(fail_first, Duration::ZERO).await
}

async fn slow_callback_receiver(fail_first: usize, slow: Duration) -> (String, Receiver) {
    let state = Receiver {
        got: Arc::default(),
        fail_first: Arc::new(Mutex::new(fail_first)),
        slow,
    };
    async fn hook(State(s): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
        tokio::time::sleep(s.slow).await;
        let headers = headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        s.got.lock().unwrap().push(Received { headers, body });
        let mut fail = s.fail_first.lock().unwrap();
        if *fail > 0 {
            *fail -= 1;
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::NO_CONTENT
        }
    }
    let app = Router::new().route("/hook", post(hook)).with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hook"), state)
}

const SECRET: &str = "cb-secret-for-tests";

/// Daemon settings for callbacks: signed with [`SECRET`], polled every
/// second, retried from 100 ms, sent with a 2 s timeout, loopback allowed
/// (the receivers here listen on it).
fn callback_opts() -> Opts {
    guarded_opts().env("MAAS_CALLBACKS__ALLOW_NETWORKS", "127.0.0.0/8, ::1")
}

/// [`callback_opts`] without the allow-list: loopback refused.
fn guarded_opts() -> Opts {
    fast()
        .env("MAAS_CALLBACKS__SECRET", SECRET)
        .env("MAAS_CALLBACKS__POLL_SECS", 1)
        .env("MAAS_CALLBACKS__RETRY_BASE_MS", 100)
        .env("MAAS_CALLBACKS__TIMEOUT_SECS", 2)
}

fn callback_daemon(url: &str) -> Maasd {
    Maasd::spawn(url, callback_opts())
}

/// Inserts `n` requests (`query 1`, `query 2`, ...) whose outcome is called back to `hook`.
async fn insert_with_callback(c: &Client, hook: &str, query: &str, n: i64) {
    c.execute(
        "INSERT INTO pipeline_runs (user_id, user_query, callback_url)
         SELECT gen_random_uuid(), $2 || ' ' || g, $1 FROM generate_series(1, $3::int8) g",
        &[&hook, &query, &n],
    )
    .await
    .unwrap();
}

/// Waits `within` until `n` callbacks are delivered; panics with `what` then.
async fn wait_delivered(c: &Client, n: i64, within: Duration, what: &str) {
    wait_until(within, what, || async {
        count(c, "SELECT count(*) FROM callback_outbox WHERE state = 'delivered'").await == n
    })
    .await;
}

fn verified(r: &Received) -> Value {
    let ts: i64 = r.headers["x-maas-timestamp"].parse().unwrap();
    assert!(
        maas::callbacks::verify(SECRET.as_bytes(), ts, &r.body, &r.headers["x-maas-signature"]),
        "bad signature: {r:?}"
    );
    serde_json::from_slice(&r.body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_are_signed_retried_and_survive_restarts() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (hook, rx) = callback_receiver(2).await;
    let mut d = callback_daemon(&db.url);
    let id: Uuid = value(&c, "INSERT INTO pipeline_runs (user_id, user_query, callback_url) VALUES (gen_random_uuid(), 'call me back', $1) RETURNING id", &[&hook]).await;
    wait_status(&c, id, "COMPLETED").await;
    wait_delivered(&c, 1, GENEROUS, "delivered after two 500s").await;
    {
        let got = rx.got.lock().unwrap().clone();
        assert_eq!(got.len(), 3, "two failures, one success");
        let ids: Vec<&String> = got.iter().map(|r| &r.headers["x-maas-delivery"]).collect();
        assert!(
            ids.iter().all(|i| *i == ids[0]),
            "one delivery id across attempts: {ids:?}"
        );
        let body = verified(&got[2]);
        assert_eq!(body["id"], id.to_string());
        assert_eq!(body["status"], "COMPLETED");
        assert_eq!(got[2].headers["x-maas-event"], "request.completed");
        assert!(body["answer"].as_str().unwrap().starts_with("[offline]"), "{body}");
    }
    let (attempts, last_status): (i32, Option<i32>) = {
        let r = c
            .query_one("SELECT attempts, last_status FROM callback_outbox", &[])
            .await
            .unwrap();
        by_name!(r, "attempts", "last_status")
    };
    assert_eq!((attempts, last_status), (3, Some(204)));
    let (code, out, _) = maasctl(&db.url, &["requests", "show", &id.to_string()]);
    assert_eq!(code, 0);
    assert!(out.contains("request.completed") && out.contains("delivered"), "{out}");

    // With no daemon running, a cancel from psql still queues its callback;
    // the next daemon delivers it.
    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait_exit(GENEROUS).await, Some(0));
    c.execute("UPDATE maas_control SET paused = true", &[]).await.unwrap();
    let late: Uuid = value(&c, "INSERT INTO pipeline_runs (user_id, user_query, callback_url) VALUES (gen_random_uuid(), 'cancelled by psql', $1) RETURNING id", &[&hook]).await;
    c.execute("UPDATE pipeline_runs SET status = 'CANCELLED' WHERE id = $1", &[&late])
        .await
        .unwrap();
    assert_eq!(
        count(&c, "SELECT count(*) FROM callback_outbox WHERE state = 'pending'").await,
        1
    );
    let _d2 = callback_daemon(&db.url);
    wait_delivered(&c, 2, GENEROUS, "the restarted daemon delivers the cancel").await;
    let got = rx.got.lock().unwrap().clone();
    let last = verified(got.last().unwrap());
    assert_eq!(last["id"], late.to_string());
    assert_eq!(last["status"], "CANCELLED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_deliver_each_callback_once_and_give_up_on_dead_receivers() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (hook, rx) = callback_receiver(0).await;
    let _a = callback_daemon(&db.url);
    let _b = Maasd::spawn(
        &db.url,
        callback_opts()
            .env("MAAS_CALLBACKS__RETRY_BASE_MS", 50)
            .env("MAAS_CALLBACKS__MAX_ATTEMPTS", 2),
    );
    wait_listening(&c, 2).await;
    insert_with_callback(&c, &hook, "many", 40).await;
    crate::support::wait_all_terminal(&c, GENEROUS).await;
    wait_delivered(&c, 40, GENEROUS, "forty deliveries").await;
    let got = rx.got.lock().unwrap().clone();
    let mut ids: Vec<String> = got.iter().map(|r| r.headers["x-maas-delivery"].clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 40);
    assert_eq!(got.len(), 40, "each delivery sent once");
    for r in &got {
        verified(r);
    }

    // A receiver that is gone: retried, then dead. Daemon b gives up after 2
    // attempts, daemon a after 12; whichever claims it, start it at 11.
    let gone: Uuid = value(
        &c,
        "INSERT INTO pipeline_runs (user_id, user_query, callback_url, status)
             VALUES (gen_random_uuid(), 'nobody listens', 'http://127.0.0.1:1/hook', 'NEW') RETURNING id",
        &[],
    )
    .await;
    wait_status(&c, gone, "COMPLETED").await;
    c.execute(
        "UPDATE callback_outbox SET attempts = greatest(attempts, 11) WHERE run_id = $1",
        &[&gone],
    )
    .await
    .unwrap();
    wait_until(GENEROUS, "the undeliverable callback is dead", || async {
        count(&c, "SELECT count(*) FROM callback_outbox WHERE state = 'dead'").await == 1
    })
    .await;
    let (code, out, _) = maasctl(&db.url, &["--json", "stats"]);
    assert_eq!(code, 0);
    assert_eq!(json(&out)["callbacks"]["dead"], 1);
    let (code, out, _) = maasctl_env(&db.url, &["doctor"], &[("MAAS_CALLBACKS__SECRET", SECRET)]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("warn  callbacks") && out.contains("1 dead"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_every_slot_busy_claims_again_when_one_frees() {
    let db = TestDb::new().await;
    let c = db.client().await;
    // Each delivery takes 300 ms, longer than the runs take to complete, so
    // most deliveries are due after the last terminal transition woke the
    // worker: with one slot and a poll far away, only freed slots drive them.
    let (hook, rx) = slow_callback_receiver(0, Duration::from_millis(300)).await;
    let _d = Maasd::spawn(
        &db.url,
        fast()
            .env("MAAS_CALLBACKS__SECRET", SECRET)
            .env("MAAS_CALLBACKS__ALLOW_NETWORKS", "127.0.0.0/8")
            .env("MAAS_CALLBACKS__POLL_SECS", 600)
            .env("MAAS_CALLBACKS__CONCURRENCY", 1),
    );
    wait_listening(&c, 1).await;
    insert_with_callback(&c, &hook, "one by one", 10).await;
    crate::support::wait_all_terminal(&c, GENEROUS).await;
    wait_delivered(&c, 10, Duration::from_secs(20), "ten deliveries, one at a time").await;
    assert_eq!(rx.got.lock().unwrap().len(), 10);
}

/// Without an allow-list, a callback to loopback is refused on the address
/// connected to, whether the URL names the address or a host name that
/// resolves to it; nothing reaches the receiver and the delivery is dead at
/// once with the reason. Allowing the network delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_to_loopback_are_refused_unless_allowed() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (hook, rx) = callback_receiver(0).await;
    let by_name = hook.replace("127.0.0.1", "localhost");
    let mut d = Maasd::spawn(&db.url, guarded_opts());
    insert_with_callback(&c, &hook, "to an address", 1).await;
    insert_with_callback(&c, &by_name, "to a name", 1).await;
    wait_until(GENEROUS, "both deliveries dead", || async {
        count(&c, "SELECT count(*) FROM callback_outbox WHERE state = 'dead'").await == 2
    })
    .await;
    let errors: Vec<(i32, String)> = c
        .query(
            "SELECT attempts, last_error FROM callback_outbox ORDER BY url LIKE '%localhost%'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| by_name!(r, "attempts", "last_error"))
        .collect();
    for (attempts, e) in &errors {
        assert_eq!(*attempts, 1, "{e}");
        assert!(
            e.contains("a loopback address; refused") && e.contains("callbacks.allow_networks"),
            "{e}"
        );
    }
    assert!(
        errors[1].1.contains("callback destination localhost is 127.0.0.1"),
        "{}",
        errors[1].1
    );
    assert!(
        rx.got.lock().unwrap().is_empty(),
        "a refused callback reached the receiver"
    );

    d.signal(Signal::SIGTERM);
    assert_eq!(d.wait_exit(GENEROUS).await, Some(0));
    let _allowed = Maasd::spawn(&db.url, callback_opts());
    insert_with_callback(&c, &by_name, "allowed", 1).await;
    wait_delivered(&c, 1, GENEROUS, "delivered once loopback is allowed").await;
    assert_eq!(rx.got.lock().unwrap().len(), 1);
}

/// The special ranges that reach a private network or a test one are
/// refused like loopback is, even with loopback allowed: the
/// protocol-assignment and benchmarking IPv4 blocks, site-local, local-use
/// NAT64, 6to4 and IPv4-compatible IPv6 (`::127.0.0.1` is not opened by
/// allowing `127.0.0.0/8`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_to_special_ranges_are_refused() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let _d = callback_daemon(&db.url);
    let cases = [
        ("http://192.0.0.8:9/hook", "protocol-assignment"),
        ("http://198.18.0.1:9/hook", "benchmarking"),
        ("http://[fec0::1]:9/hook", "site-local"),
        ("http://[64:ff9b:1::a00:1]:9/hook", "local-use NAT64"),
        ("http://[2002:7f00:1::1]:9/hook", "6to4"),
        ("http://[::127.0.0.1]:9/hook", "IPv4-compatible"),
    ];
    for (url, _) in cases {
        insert_with_callback(&c, url, "special", 1).await;
    }
    wait_until(GENEROUS, "every delivery dead", || async {
        count(&c, "SELECT count(*) FROM callback_outbox WHERE state = 'dead'").await
            == i64::try_from(cases.len()).unwrap()
    })
    .await;
    for (url, range) in cases {
        let row = c
            .query_one(
                "SELECT attempts, last_error FROM callback_outbox WHERE url = $1",
                &[&url],
            )
            .await
            .unwrap();
        let (attempts, e): (i32, String) = by_name!(row, "attempts", "last_error");
        assert_eq!(attempts, 1, "{url}: {e}");
        assert!(e.contains(range) && e.contains("refused"), "{url}: {e}");
    }
}

/// A tenant's callback secret can come from a file or stdin instead of the
/// command line (where every local user's `ps` shows it); a line break at
/// its end is not part of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_callback_secret_is_read_from_a_file_or_stdin() {
    use std::io::Write;
    let db = TestDb::new().await;
    let c = db.client().await;
    let path = std::env::temp_dir().join(format!("maas-secret-{}", uuid::Uuid::new_v4()));
    std::fs::write(&path, "secret-from-a-file-0123\n").unwrap();
    let file = path.to_str().unwrap();
    let (code, out, err) =
        crate::support::cli::maasctl(&db.url, &["tenants", "add", "filed", "--callback-secret-file", file]);
    assert_eq!(code, 0, "{out}{err}");
    let stored =
        || crate::support::db::value::<String>(&c, "SELECT callback_secret FROM tenants WHERE name = 'filed'", &[]);
    assert_eq!(stored().await, "secret-from-a-file-0123");
    let mut child = crate::support::cli::command(
        &db.url,
        &["tenants", "set", "filed", "--callback-secret-file", "-"],
        crate::support::cli::NO_ENV,
    )
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"secret-from-stdin-456789\r\n")
        .unwrap();
    let done = child.wait_with_output().unwrap();
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    assert_eq!(stored().await, "secret-from-stdin-456789");
    let (code, _, err) = crate::support::cli::maasctl(
        &db.url,
        &[
            "tenants",
            "set",
            "filed",
            "--callback-secret",
            "x",
            "--callback-secret-file",
            file,
        ],
    );
    assert_ne!(code, 0, "both forms at once are refused: {err}");
    let _ = std::fs::remove_file(&path);
}
