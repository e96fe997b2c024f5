//! A primary that becomes read-only is a lost connection: with
//! `target_session_attrs=read-write` the daemon drops its connections,
//! `/readyz` answers 503 while no server takes writes, and work resumes
//! when one does. The LISTEN session can use its own connection string
//! (`listen_database_url`, for a transaction-mode pooler in front of the rest).
//!
//! On a private cluster of its own: making it read-only must not disturb
//! the other tests.

use std::path::PathBuf;

use maas::db::devdb::{Cluster, ClusterSpec, ensure_database};
use tokio_postgres::Client;

use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{by_name, connect, ensure_login_role};
use crate::support::ops::{insert_one, wait_status};
use crate::support::{GENEROUS, wait_until};

async fn readyz(http: &reqwest::Client, addr: std::net::SocketAddr) -> (u16, String) {
    match http.get(format!("http://{addr}/readyz")).send().await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

async fn wait_readyz(http: &reqwest::Client, addr: std::net::SocketAddr, want: u16, also: &str) {
    wait_until(GENEROUS, &format!("/readyz answers {want} ({also})"), || async {
        let (status, body) = readyz(http, addr).await;
        status == want && body.contains(also)
    })
    .await;
}

async fn set_read_only(admin: &Client, on: bool) {
    // The admin session itself must write while the server is read-only.
    admin
        .batch_execute("SET default_transaction_read_only = off")
        .await
        .unwrap();
    let sql = if on {
        "ALTER SYSTEM SET default_transaction_read_only = on"
    } else {
        "ALTER SYSTEM RESET default_transaction_read_only"
    };
    admin.batch_execute(sql).await.unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_turned_read_only_is_a_connection_loss_until_it_takes_writes_again() {
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::ensure(&ClusterSpec {
            dir: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("maas-readonly-pg"),
            port: None,
            durable: false,
            max_connections: 100,
        })
        .unwrap()
    })
    .await
    .unwrap();
    let db = format!("maas_ro_{}", uuid::Uuid::new_v4().simple());
    let admin_url = cluster.url("postgres");
    let admin = connect(&admin_url).await;
    // A leftover of an interrupted run would make everything read-only.
    set_read_only(&admin, false).await;
    ensure_database(&admin_url, &db).await.unwrap();
    ensure_login_role(&admin, "maas_listen").await;
    let url = format!("{}?target_session_attrs=read-write", cluster.url(&db));
    let listen_url = format!("postgres://maas_listen@127.0.0.1:{}/{db}", cluster.port);
    let mut d = Maasd::spawn(&url, Opts::default().env("MAAS_LISTEN_DATABASE_URL", &listen_url));
    let addr = d.http_addr(GENEROUS).await;
    let http = reqwest::Client::new();
    wait_readyz(&http, addr, 200, "ready").await;

    // The LISTEN session runs as listen_database_url's role, the pool as database_url's.
    let c = connect(&cluster.url(&db)).await;
    let users: Vec<(String, String)> = c
        .query(
            "SELECT DISTINCT application_name, usename FROM pg_stat_activity
             WHERE datname = current_database() AND application_name LIKE 'maasd%' ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| by_name!(r, "application_name", "usename"))
        .collect();
    assert!(
        users.contains(&("maasd-listener".into(), "maas_listen".into())),
        "{users:?}"
    );
    assert!(users.contains(&("maasd".into(), "postgres".into())), "{users:?}");

    set_read_only(&admin, true).await;
    wait_readyz(&http, addr, 503, "database").await;
    let (_, body) = readyz(&http, addr).await;
    assert!(body.contains("does not allow writes"), "{body}");

    // A request submitted meanwhile (by a session that may write) waits.
    c.batch_execute("SET default_transaction_read_only = off")
        .await
        .unwrap();
    let id = insert_one(&c, "after the failover").await;
    set_read_only(&admin, false).await;
    wait_readyz(&http, addr, 200, "ready").await;
    wait_status(&c, id, "COMPLETED").await;
    assert!(d.is_running(), "{}", d.plain_log());
    d.kill();
    drop(admin);
    let _ = tokio::task::spawn_blocking(move || cluster.stop(false)).await;
}
