//! Test databases: a private cluster (or `TEST_DATABASE_URL`), a template
//! migrated once per run, and a fresh clone per test, dropped with FORCE
//! when the guard drops (kept when `MAAS_KEEP_TEST_DB` is set).

use std::sync::OnceLock;

use maas::db::devdb::{Cluster, ClusterSpec, quote_ident};
use maas::db::migrate;
use tokio::sync::OnceCell;
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{Client, NoTls, Row};

/// Reads columns of a row into a tuple by their names, never by position:
/// `by_name!(row, "status", "attempt")` is `(row.get("status"), row.get("attempt"))`.
macro_rules! by_name {
    ($row:expr, $($col:literal),+ $(,)?) => {
        ($($row.get($col)),+)
    };
}
pub(crate) use by_name;

/// Every row `sql` returns, each read by `read`; panics on a query error.
pub async fn rows<T>(c: &Client, sql: &str, params: &[&(dyn ToSql + Sync)], read: impl Fn(&Row) -> T) -> Vec<T> {
    c.query(sql, params).await.unwrap().iter().map(read).collect()
}

/// The first column of the one row `sql` returns; panics on a query error
/// or when it returns no row or several.
pub async fn value<T: for<'a> FromSql<'a>>(c: &Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> T {
    c.query_one(sql, params).await.unwrap().get(0)
}

/// The first column of every row `sql` returns; panics on a query error.
pub async fn column<T: for<'a> FromSql<'a>>(c: &Client, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<T> {
    rows(c, sql, params, |r| r.get(0)).await
}

/// The plan (`EXPLAIN (COSTS OFF)`) of `sql` with `$n` replaced by
/// `values[n - 1]`: literals, as the server sees parameters in a custom plan.
pub async fn plan_with(c: &Client, sql: &str, values: &[&str]) -> String {
    let mut sql = sql.to_owned();
    for (i, v) in values.iter().enumerate().rev() {
        sql = sql.replace(&format!("${}", i + 1), v);
    }
    column::<String>(c, &format!("EXPLAIN (COSTS OFF) {sql}"), &[])
        .await
        .join("\n")
}

/// Creates login role `role` unless it exists (roles are shared by every
/// database of the cluster, so tests may race to create one).
pub async fn ensure_login_role(c: &Client, role: &str) {
    c.batch_execute(&format!(
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN
           CREATE ROLE {} LOGIN; END IF; END $$",
        quote_ident(role)
    ))
    .await
    .unwrap();
}

/// Admin URL (database `postgres`) of the cluster the tests use.
/// Applies migration `version` again, in a transaction of its own: the
/// upgrade tests rebuild the schema as it was before it, then run it.
pub async fn apply_migration(c: &Client, version: i32) {
    let sql = migrate::MIGRATIONS
        .iter()
        .find(|m| m.version == version)
        .unwrap_or_else(|| panic!("no migration {version}"))
        .sql;
    c.batch_execute(&format!("BEGIN; {sql}; COMMIT;")).await.unwrap();
}

pub fn admin_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("TEST_DATABASE_URL") {
            return url;
        }
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("maas-test-pg");
        let spec = ClusterSpec {
            dir,
            port: None,
            durable: false,
            max_connections: 400,
        };
        match Cluster::ensure(&spec) {
            Ok(c) => c.url("postgres"),
            Err(e) => panic!("cannot provision the test cluster: {e}"),
        }
    })
    .clone()
}

/// Replaces the database name of a connection URL.
pub fn with_db(url: &str, db: &str) -> String {
    let (base, _) = url.rsplit_once('/').unwrap_or((url, ""));
    let base = base.trim_end_matches('/');
    format!("{base}/{db}")
}

pub async fn connect(url: &str) -> Client {
    let (client, conn) = url
        .parse::<tokio_postgres::Config>()
        .unwrap()
        .connect(NoTls)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

fn template_name() -> String {
    let mut all = String::new();
    for m in migrate::MIGRATIONS {
        all.push_str(m.sql);
    }
    for t in migrate::TRIGGERS {
        all.push_str(t.sql);
    }
    format!("maas_tpl_{}", &migrate::checksum(&all)[..16])
}

static TEMPLATE: OnceCell<String> = OnceCell::const_new();

async fn template(admin: &str) -> String {
    TEMPLATE
        .get_or_init(|| async {
            let name = template_name();
            let client = connect(admin).await;
            // Leftovers of earlier runs (tests that were killed).
            let stale: Vec<String> = column(
                &client,
                "SELECT datname FROM pg_database WHERE datname LIKE 'maas\\_t\\_%' OR datname LIKE 'maas\\_tpltmp\\_%'",
                &[],
            )
            .await;
            if std::env::var_os("MAAS_KEEP_TEST_DB").is_none() {
                for db in stale {
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote_ident(&db)))
                        .await;
                }
            }
            let exists = client
                .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
                .await
                .unwrap()
                .is_some();
            if !exists {
                let tmp = format!("maas_tpltmp_{}", std::process::id());
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {tmp} WITH (FORCE)"))
                    .await
                    .unwrap();
                client.batch_execute(&format!("CREATE DATABASE {tmp}")).await.unwrap();
                let mut c = connect(&with_db(admin, &tmp)).await;
                migrate::migrate(&mut c, true).await.unwrap();
                drop(c);
                // Rename into place; another process may have won the race.
                if client
                    .batch_execute(&format!("ALTER DATABASE {tmp} RENAME TO {name}"))
                    .await
                    .is_err()
                {
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {tmp} WITH (FORCE)"))
                        .await;
                }
            }
            name
        })
        .await
        .clone()
}

/// A migrated database of one's own.
pub struct TestDb {
    pub name: String,
    pub url: String,
    admin: String,
}

impl TestDb {
    pub async fn new() -> TestDb {
        let admin = admin_url();
        let tpl = template(&admin).await;
        let name = format!("maas_t_{}", uuid::Uuid::new_v4().simple());
        let client = connect(&admin).await;
        // CREATE DATABASE ... TEMPLATE fails while another session is copying
        // the same template; retry briefly.
        let mut tries = 0;
        loop {
            match client
                .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {tpl}"))
                .await
            {
                Ok(()) => break,
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => panic!("create test database: {e}"),
            }
        }
        TestDb {
            url: with_db(&admin, &name),
            name,
            admin,
        }
    }

    /// An empty database (not migrated) of one's own.
    pub async fn empty() -> TestDb {
        let admin = admin_url();
        let name = format!("maas_t_{}", uuid::Uuid::new_v4().simple());
        connect(&admin)
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        TestDb {
            url: with_db(&admin, &name),
            name,
            admin,
        }
    }

    pub async fn client(&self) -> Client {
        connect(&self.url).await
    }

    /// The daemon's own pool over this database, for calling the
    /// library's statements directly.
    pub fn pool(&self) -> maas::db::Pool {
        let cfg = maas::config::Config {
            database_url: maas::config::Secret(self.url.clone()),
            ..Default::default()
        };
        maas::db::connect_pool(&cfg, "test").unwrap()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if std::env::var_os("MAAS_KEEP_TEST_DB").is_some() {
            eprintln!("keeping test database {}", self.url);
            return;
        }
        let admin = self.admin.clone();
        let name = self.name.clone();
        // Drop runs inside the test's runtime; use a thread with its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let c = connect(&admin).await;
                let _ = c
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await;
            });
        })
        .join();
    }
}
