//! Everything but the LISTEN session through a real PgBouncer in
//! transaction mode (the distribution's package; PgBouncer before 1.21
//! keeps no prepared statement across transactions, so one left behind on
//! a server connection, or expected on the next, fails here), with a pool
//! of two server connections that maasd's many clients really share:
//! requests submitted over HTTP and by INSERT complete, the scheduled
//! archivist of two daemons archives every turn once with never two runs
//! at once (its run lease is a row, not a session lock), `maasctl`
//! works through it, and so does a limited tenant's submission.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::cli::maasctl_async;
use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{TestDb, value};
use crate::support::{
    GENEROUS, assert_all_completed_once, assert_no_overlapping_cron_runs, count, insert_requests, wait_until,
};

/// Server connections PgBouncer keeps per database and user.
const POOL_SIZE: i64 = 2;

/// A PgBouncer process in front of the test cluster; killed when dropped.
struct PgBouncer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its folder (configuration, user list, log): read by then.
        if let Some(dir) = self.log.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The `pgbouncer` binary, or `None` where the package is not installed
/// (bin/test installs it and sets `MAAS_REQUIRE_PGBOUNCER`, so there it
/// must be found, as under CI).
fn pgbouncer_binary() -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/usr/local/sbin"])
        .map(|dir| Path::new(dir).join("pgbouncer"))
        .find(|p| p.is_file());
    if found.is_none() {
        crate::support::missing(
            Some("MAAS_REQUIRE_PGBOUNCER"),
            "pgbouncer not found (install the distribution's `pgbouncer` package to run the pooler test)",
        );
    }
    found
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl PgBouncer {
    /// Starts PgBouncer (transaction pooling, [`POOL_SIZE`] server
    /// connections, trust auth) in front of the server of `direct`.
    async fn start(binary: &Path, direct: &str) -> PgBouncer {
        let pg: tokio_postgres::Config = direct.parse().unwrap();
        let user = pg.get_user().unwrap_or("postgres").to_owned();
        let server_port = pg.get_ports().first().copied().unwrap_or(5432);
        // As root it runs as `postgres` (below), which must reach its files:
        // the system's temporary folder, as for the test cluster
        // (`db::devdb`), not the target folder, which may sit in a folder
        // only root can enter (a clone made with `mktemp -d`).
        let base = if nix::unistd::Uid::effective().is_root() {
            std::env::temp_dir()
        } else {
            PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        };
        let dir = base.join(format!("maas-pgbouncer-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let ini = dir.join("pgbouncer.ini");
        let users = dir.join("userlist.txt");
        std::fs::write(&users, format!("\"{user}\" \"\"\n")).unwrap();
        std::fs::write(
            &ini,
            format!(
                "[databases]\n* = host=127.0.0.1 port={server_port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {users}\nadmin_users = {user}\n\
                 pool_mode = transaction\ndefault_pool_size = {POOL_SIZE}\nmin_pool_size = 0\n\
                 reserve_pool_size = 0\nmax_client_conn = 500\nmax_db_connections = {POOL_SIZE}\n\
                 server_reset_query =\nignore_startup_parameters = extra_float_digits\n",
                users = users.display(),
            ),
        )
        .unwrap();
        let log = dir.join("pgbouncer.log");
        let mut cmd = Command::new(binary);
        cmd.arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        // PgBouncer refuses to run as root: run it as the cluster's owner.
        if nix::unistd::Uid::effective().is_root() {
            use std::os::unix::process::CommandExt;
            let owner = nix::unistd::User::from_name("postgres")
                .unwrap()
                .expect("a postgres user (it owns the test cluster)");
            nix::unistd::chown(&dir, Some(owner.uid), Some(owner.gid)).unwrap();
            for f in [&ini, &users, &log] {
                nix::unistd::chown(f, Some(owner.uid), Some(owner.gid)).unwrap();
            }
            cmd.uid(owner.uid.as_raw()).gid(owner.gid.as_raw());
        }
        let bouncer = PgBouncer {
            child: cmd.spawn().unwrap(),
            port,
            log,
        };
        wait_until(GENEROUS, "pgbouncer accepts connections", || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok()
        })
        .await;
        bouncer
    }

    /// `direct` with PgBouncer's address instead of the server's.
    fn url(&self, direct: &str) -> String {
        let (scheme_user, rest) = direct.split_once('@').unwrap();
        let (_, db) = rest.split_once('/').unwrap();
        format!("{scheme_user}@127.0.0.1:{}/{db}", self.port)
    }

    /// One result of PgBouncer's admin console (`SHOW …`), as rows of
    /// column → value.
    async fn show(&self, direct: &str, what: &str) -> Vec<std::collections::HashMap<String, String>> {
        let admin = self.url(direct);
        let (base, _) = admin.rsplit_once('/').unwrap();
        let c = crate::support::db::connect(&format!("{base}/pgbouncer")).await;
        c.simple_query(&format!("SHOW {what}"))
            .await
            .unwrap()
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(
                    r.columns()
                        .iter()
                        .enumerate()
                        .map(|(i, col)| (col.name().to_owned(), r.get(i).unwrap_or("").to_owned()))
                        .collect(),
                ),
                _ => None,
            })
            .collect()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The environment of a daemon or `maasctl` that goes through the pooler.
fn pooled(opts: Opts, direct: &str) -> Opts {
    opts.env("MAAS_DB__POOLER", "transaction")
        .env("MAAS_LISTEN_DATABASE_URL", direct)
}

/// A daemon whose database is `url` (the pooler's), ready, and a client for it.
async fn pooled_api(url: &str, opts: Opts) -> Api {
    let mut d = Maasd::spawn(url, opts);
    let mut addr = d.http_addr(GENEROUS).await;
    if addr.ip().is_unspecified() {
        addr.set_ip([127, 0, 0, 1].into());
    }
    let api = Api {
        d,
        addr,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap(),
        token: None,
    };
    wait_until(GENEROUS, "the daemon is ready through the pooler", || async {
        api.get("/readyz").await.status() == StatusCode::OK
    })
    .await;
    api
}

/// A daemon through the pooler whose archivist runs every second on any
/// pending turn, in batches of two, its model calls 5 ms.
fn scheduled(direct: &str) -> Opts {
    pooled(Opts::default(), direct)
        .env("MAAS_ARCHIVIST__SCHEDULE", "* * * * * *")
        .env("MAAS_ARCHIVIST__MIN_PENDING", "1")
        .env("MAAS_ARCHIVIST__COOLDOWN_SECS", "0")
        .env("MAAS_ARCHIVIST__BATCH_LOGS", "2")
        .env("MAAS_LLM__OFFLINE__LATENCY_MS", "5")
}

/// Submits 20 requests over HTTP, every other one with an idempotency key,
/// each with its number as metadata; returns their ids.
async fn submit_twenty(api: &Api) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for i in 0..20 {
        let body = json!({ "user_id": Uuid::from_u128(i % 5 + 1), "query": format!("through the pooler #{i}"),
                           "metadata": { "i": i } });
        let mut rb = api.http.post(api.url("/api/query")).json(&body);
        if i % 2 == 0 {
            rb = rb.header("idempotency-key", format!("key-{i}"));
        }
        let resp = rb.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::ACCEPTED, "{}", resp.text().await.unwrap());
        let body: Value = resp.json().await.unwrap();
        ids.push(body["request_id"].as_str().unwrap().parse::<Uuid>().unwrap());
    }
    ids
}

/// The scheduled archivist of both daemons archives every turn, once, and
/// two runs never overlap.
async fn assert_the_schedule_archives_every_turn_once(c: &Client) {
    // A run's row is written when the run ends, after its users' marks:
    // wait for both.
    wait_until(
        GENEROUS,
        "the schedule archives every turn and records its run",
        || async {
            count(c, "SELECT count(*) FROM archive_marks WHERE archived_seq < logged_seq").await == 0
                && count(c, "SELECT count(*) FROM archive_marks").await > 0
                && count(
                    c,
                    "SELECT count(*) FROM archive_runs WHERE trigger = 'cron' AND logs > 0",
                )
                .await
                    > 0
        },
    )
    .await;
    assert_no_overlapping_cron_runs(c).await;
    let double = count(
        c,
        "SELECT count(*) FROM (SELECT u.lid FROM lsm_storage l, unnest(l.raw_log_ids) u(lid) GROUP BY u.lid HAVING count(*) > 1) d",
    )
    .await;
    assert_eq!(double, 0, "a turn was archived twice");
    assert!(count(c, "SELECT count(*) FROM lsm_storage").await > 0);
    assert!(
        count(
            c,
            "SELECT count(*) FROM archive_runs WHERE trigger = 'cron' AND logs > 0"
        )
        .await
            > 0
    );
}

/// The clients of `db` really shared the pooler's two server connections.
async fn assert_clients_shared_the_servers(bouncer: &PgBouncer, db: &TestDb) {
    let clients = bouncer.show(&db.url, "CLIENTS").await;
    let ours = clients.iter().filter(|r| r["database"] == db.name).count();
    let servers = bouncer.show(&db.url, "SERVERS").await;
    let theirs = servers.iter().filter(|r| r["database"] == db.name).count();
    assert!(
        i64::try_from(theirs).unwrap() <= POOL_SIZE && ours > theirs,
        "{ours} clients on {theirs} server connections"
    );
}

/// `maasctl` through the pooler at `url` (`direct` for its LISTEN):
/// reads, an archive run, migrate, and an operator transition (one
/// statement with its audit row); `request` is a request submitted with
/// metadata `{"i":0}`.
async fn assert_maasctl_works_through(url: &str, direct: &str, c: &Client, request: Uuid) {
    let env = [("MAAS_DB__POOLER", "transaction"), ("MAAS_LISTEN_DATABASE_URL", direct)];
    let id = request.to_string();
    for args in [
        vec!["requests", "list", "--limit", "5"],
        vec!["requests", "show", id.as_str()],
        vec!["stats"],
        vec!["archivist", "run"],
        vec!["migrate"],
    ] {
        let (code, out, err) = maasctl_async(url, &args, &env).await;
        assert_eq!(code, 0, "maasctl {args:?} through pgbouncer: {out}\n{err}");
        assert!(!err.contains("prepared statement"), "{err}");
    }
    let (_, out, _) = maasctl_async(url, &["requests", "show", id.as_str()], &env).await;
    assert!(out.contains("metadata  {\"i\":0}"), "{out}");
    let held: Uuid = value(
        c,
        "INSERT INTO pipeline_runs (user_id, user_query, run_after) VALUES ($1, 'held', now() + interval '1 hour') RETURNING id",
        &[&Uuid::new_v4()],
    )
    .await;
    let held = held.to_string();
    let (code, out, err) = maasctl_async(url, &["requests", "cancel", "--reason", "pooler test", &held], &env).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let status: String = value(
        c,
        "SELECT status FROM pipeline_runs WHERE id = $1::text::uuid",
        &[&held],
    )
    .await;
    assert_eq!(status, "CANCELLED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_but_listen_works_through_pgbouncer_in_transaction_mode() {
    let Some(binary) = pgbouncer_binary() else { return };
    let db = TestDb::new().await;
    let c = db.client().await;
    let bouncer = PgBouncer::start(&binary, &db.url).await;
    let url = bouncer.url(&db.url);
    let api = pooled_api(&url, scheduled(&db.url)).await;
    let _second = Maasd::spawn(&url, scheduled(&db.url));

    // Over HTTP (with and without an idempotency key) and by INSERT.
    let ids = submit_twenty(&api).await;
    insert_requests(&c, 20, "inserted behind the pooler").await;
    assert_all_completed_once(&c, 40).await;
    let resp = api.get(&format!("/api/query/{}/status?wait=10s", ids[3])).await;
    let state: Value = resp.json().await.unwrap();
    assert_eq!(state["status"], "completed", "{state}");
    assert_eq!(state["metadata"], json!({ "i": 3 }));

    assert_the_schedule_archives_every_turn_once(&c).await;
    assert_clients_shared_the_servers(&bouncer, &db).await;
    assert_maasctl_works_through(&url, &db.url, &c, ids[0]).await;

    let logs = format!("{}{}", api.d.plain_log(), bouncer.log_text());
    assert!(!logs.contains("prepared statement"), "{logs}");
    assert!(!logs.contains("unsupported startup parameter"), "{logs}");
}

/// A limited tenant through the pooler: `maasctl tenants add` and `tokens
/// create` write through it, and the submissions of its token lock and
/// count the tenant's row (every statement of `repo::tenants` unnamed):
/// they complete, and the one over the limit is 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_tenant_submits_through_pgbouncer_in_transaction_mode() {
    let Some(binary) = pgbouncer_binary() else { return };
    let db = TestDb::new().await;
    let bouncer = PgBouncer::start(&binary, &db.url).await;
    let url = bouncer.url(&db.url);
    let env = [
        ("MAAS_DB__POOLER", "transaction"),
        ("MAAS_LISTEN_DATABASE_URL", db.url.as_str()),
    ];
    let maasctl = |args: &'static [&'static str]| maasctl_async(&url, args, &env);
    let (code, out, err) = maasctl(&[
        "tenants",
        "add",
        "acme",
        "--requests-per-minute",
        "3",
        "--max-in-flight",
        "10",
    ])
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, token, err) = maasctl(&["tokens", "create", "app", "--tenant", "acme", "--scope", "submit"]).await;
    assert_eq!(code, 0, "{token}\n{err}");
    let mut api = pooled_api(&url, pooled(Opts::default(), &db.url)).await;
    api.token = Some(token.trim().to_owned());

    let mut ids = Vec::new();
    for i in 0..4 {
        let body = json!({ "user_id": Uuid::from_u128(7), "query": format!("a limited tenant's #{i}") });
        let resp = api
            .authed(api.http.post(api.url("/api/query")).json(&body))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        if i < 3 {
            assert_eq!(status, StatusCode::ACCEPTED, "{body}");
            ids.push(body["request_id"].as_str().unwrap().to_owned());
        } else {
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
            assert_eq!(body["code"], "requests_per_minute", "{body}");
        }
    }
    for id in &ids {
        let state: Value = api
            .get(&format!("/api/query/{id}/status?wait=30s"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(state["status"], "completed", "{state}");
    }

    let logs = format!("{}{}", api.d.plain_log(), bouncer.log_text());
    assert!(!logs.contains("prepared statement"), "{logs}");
}

#[test]
fn transaction_pooling_needs_a_direct_listen_url() {
    let (code, _, err) = crate::support::cli::maasctl_env(
        "postgres://u@127.0.0.1:1/db",
        &["requests", "list"],
        &[("MAAS_DB__POOLER", "transaction")],
    );
    assert_ne!(code, 0);
    assert!(err.contains("listen_database_url"), "{err}");
}

/// The scheduled archivist's run lease (what replaced the session advisory
/// lock): one owner at a time, renewable by its owner, free again when
/// released or run out.
#[tokio::test]
async fn the_archive_run_lease_admits_one_owner_at_a_time() {
    use maas::repo::archive::{lease_runs, release_runs};
    let db = TestDb::new().await;
    let c = db.client().await;
    let pool = db.pool();
    let client = pool.get().await.unwrap();
    let (long, short) = (Duration::from_secs(60), Duration::from_millis(200));
    assert!(
        lease_runs(&client, "archivist", "a", long).await.unwrap(),
        "a free lease is taken"
    );
    assert!(
        !lease_runs(&client, "archivist", "b", long).await.unwrap(),
        "a held lease is not"
    );
    assert!(
        lease_runs(&client, "archivist", "a", short).await.unwrap(),
        "its owner renews it"
    );
    // Run out: another owner takes it, and the first one's release is a no-op.
    wait_until(GENEROUS, "the short lease runs out", || async {
        count(
            &c,
            "SELECT count(*) FROM archive_schedule WHERE run_expires_at <= now()",
        )
        .await
            == 1
    })
    .await;
    assert!(
        lease_runs(&client, "archivist", "b", long).await.unwrap(),
        "a lease run out is taken"
    );
    release_runs(&client, "archivist", "a").await.unwrap();
    assert!(
        !lease_runs(&client, "archivist", "a", long).await.unwrap(),
        "a stale release frees nothing"
    );
    release_runs(&client, "archivist", "b").await.unwrap();
    assert!(
        lease_runs(&client, "archivist", "a", long).await.unwrap(),
        "a released lease is free"
    );
    // The lease row claims no tick: the schedule's tick claim still moves it forward.
    assert!(
        maas::repo::archive::claim_tick(&client, "archivist", chrono::Utc::now())
            .await
            .unwrap()
    );
}
