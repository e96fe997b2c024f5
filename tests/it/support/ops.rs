//! Helpers the operating tests share (requests, control, health, prompts,
//! callbacks, retention, systemd): one request inserted and watched by
//! status, daemons counted by their LISTEN session, `--json` output parsed.

use serde_json::Value;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::daemon::{Maasd, Opts};
use crate::support::{count, wait_until};

pub use crate::support::GENEROUS;

/// `maasctl --json` output, parsed; panics with the output if it is not JSON.
pub fn json(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// The status of request `id`.
pub async fn status_of(c: &Client, id: Uuid) -> String {
    c.query_one("SELECT status FROM pipeline_runs WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

/// Waits until request `id` has status `want`.
pub async fn wait_status(c: &Client, id: Uuid, want: &str) {
    wait_until(GENEROUS, &format!("{id} reaches {want}"), || async {
        status_of(c, id).await == want
    })
    .await;
}

/// Inserts one request with plain SQL; returns its id.
pub async fn insert_one(c: &Client, query: &str) -> Uuid {
    c.query_one(
        "INSERT INTO pipeline_runs (user_id, user_query) VALUES (gen_random_uuid(), $1) RETURNING id",
        &[&query],
    )
    .await
    .unwrap()
    .get(0)
}

/// Waits until at least `n` daemons hold their LISTEN session.
pub async fn wait_listening(c: &Client, n: i64) {
    wait_until(GENEROUS, "the daemons listen", || async {
        count(
            c,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'maasd-listener'",
        )
        .await
            >= n
    })
    .await;
}

/// Daemon settings with a sweep every second.
pub fn fast() -> Opts {
    Opts {
        sweep_secs: 1,
        ..Opts::default()
    }
}

/// [`fast`], with each sweep's pass in the log ("sweep done", at TRACE),
/// for [`wait_sweeps`].
pub fn watched() -> Opts {
    fast().env("RUST_LOG", "info,maas::dispatcher::sweep=trace")
}

/// The sweeps a [`watched`] daemon's log shows so far.
pub fn sweeps(d: &Maasd) -> usize {
    d.log_text().matches("sweep done").count()
}

/// Waits until every daemon of `marks` (each with its [`sweeps`] taken
/// before) has swept `n` more times: each woke its stages to claim what
/// is due `n` times since, and every pass but the last has finished. What
/// a test says is not claimed (paused, held) has then been passed over.
pub async fn wait_sweeps(marks: &[(&Maasd, usize)], n: usize) {
    wait_until(GENEROUS, &format!("{n} sweeps of every daemon"), || async {
        marks.iter().all(|(d, since)| sweeps(d) >= since + n)
    })
    .await;
}
