//! What both benchmark binaries (`maas`, `chaos`) share: the private
//! PostgreSQL cluster and fresh databases on it, connections, the runtime,
//! the fake provider set up for a daemon, and percentiles. The `maasd`
//! processes, the fake provider and polling with a deadline are the
//! integration tests' own (`tests/it/support`).
//!
//! Each bench uses part of this module: `mod support;` carries an
//! `allow(dead_code)` for the rest.

#[path = "../../tests/it/support/daemon.rs"]
pub mod daemon;
#[path = "../../tests/it/support/fake_llm.rs"]
pub mod fake_llm;
#[path = "../../tests/it/support/poll.rs"]
pub mod poll;

use std::time::Duration;

pub use poll::{count, poll_until};

use daemon::Opts;
use fake_llm::{FakeConfig, FakeLlm};
use maas::db::devdb::{Cluster, ClusterSpec, ensure_database};
use tokio::time::Instant;
use tokio_postgres::Client;

/// A multi-threaded runtime, after lifting the open-file limit (many
/// daemons, connections and provider calls at once).
pub fn runtime() -> tokio::runtime::Runtime {
    if let Err(e) = maas::sys::raise_fd_limit() {
        eprintln!("{e}");
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The bench's own durable cluster under the target directory (`dir_name`
/// inside `CARGO_TARGET_TMPDIR`), created on the first run, started.
pub async fn start_cluster(dir_name: &str, max_connections: u32) -> Cluster {
    let spec = ClusterSpec {
        dir: std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(dir_name),
        port: None,
        durable: true,
        max_connections,
    };
    tokio::task::spawn_blocking(move || Cluster::ensure(&spec))
        .await
        .unwrap()
        .unwrap()
}

/// Stops the cluster (it stays on disk for the next run); says so when it
/// cannot.
pub async fn stop_cluster(cluster: Cluster) {
    if let Err(e) = tokio::task::spawn_blocking(move || cluster.stop(false)).await.unwrap() {
        eprintln!("could not stop the benchmark cluster: {e}");
    }
}

/// Drops database `name` if a previous run left it, creates it empty and
/// returns its URL.
pub async fn fresh_database(cluster: &Cluster, name: &str) -> String {
    let admin_url = cluster.url("postgres");
    let admin = connect(&admin_url, Duration::from_secs(30)).await;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await
        .unwrap();
    drop(admin);
    ensure_database(&admin_url, name).await.unwrap();
    cluster.url(name)
}

/// One connection attempt (3 s), named after the bench binary in
/// `pg_stat_activity` (never `maasd…`, which the daemons' names start with).
pub async fn try_connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    // maas's own TLS connector, so `sslmode=verify-full` URLs (bench --tls) work.
    let (rest, tls) = maas::db::tls::split(url).unwrap();
    let mut cfg: tokio_postgres::Config = rest.parse().unwrap();
    cfg.application_name(env!("CARGO_CRATE_NAME"))
        .connect_timeout(Duration::from_secs(3));
    let (c, conn) = cfg.connect(tls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(c)
}

/// Connects, retrying until `within` runs out; panics then.
pub async fn connect(url: &str, within: Duration) -> Client {
    let deadline = Instant::now() + within;
    loop {
        match try_connect(url).await {
            Ok(c) => return c,
            Err(e) if Instant::now() > deadline => panic!("cannot connect to {url}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The fake provider over HTTP, answering every call after `latency` with
/// a valid analysis (which the responder takes as its answer too).
pub async fn analysis_provider(latency: Option<Duration>) -> FakeLlm {
    FakeLlm::start_with(FakeConfig {
        default_text: maas::llm::offline::analysis_example(),
        default_latency: latency,
        ..FakeConfig::default()
    })
    .await
}

/// `opts` with the daemon's LLM calls going to the OpenAI-shaped provider
/// at `base_url`, with API key `key`.
pub fn on_provider(opts: Opts, base_url: &str, key: &str) -> Opts {
    opts.env("MAAS_LLM_PROVIDER", "openai")
        .env("OPENAI_BASE_URL", base_url)
        .env("OPENAI_API_KEY", key)
}

/// The value at fraction `p` (0 to 1, nearest rank) of `sorted`; `None`
/// when it is empty.
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "an index into a short sample"
)]
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let idx = (last as f64 * p).round() as usize;
    Some(sorted[idx.min(last)])
}
