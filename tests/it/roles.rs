//! Migrations as the owner role, the daemon as a runtime role with only the
//! grants docs/deploying.md lists: no DDL rights, and it still runs a
//! request to COMPLETED.

use crate::support::cli::{NO_ENV, maasctl_async};
use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{TestDb, connect};
use crate::support::ops::{insert_one, wait_status};

/// The grants of docs/deploying.md, run by the owner role.
const GRANTS: &str = "
GRANT CONNECT ON DATABASE {db} TO maas_app;
GRANT USAGE ON SCHEMA public TO maas_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO maas_app;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO maas_app;
ALTER DEFAULT PRIVILEGES FOR ROLE maas_owner IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO maas_app;
ALTER DEFAULT PRIVILEGES FOR ROLE maas_owner IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO maas_app;";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_runs_as_a_role_without_ddl_rights_after_the_owner_migrates() {
    let db = TestDb::empty().await;
    if !crate::support::superuser_postgres(&db.url, "the roles test") {
        return;
    }
    let admin = db.client().await;
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'maas_owner') THEN CREATE ROLE maas_owner LOGIN; END IF;
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'maas_app') THEN CREATE ROLE maas_app LOGIN; END IF;
             END $$;
             ALTER DATABASE {0} OWNER TO maas_owner;
             REVOKE ALL ON DATABASE {0} FROM PUBLIC;",
            db.name
        ))
        .await
        .unwrap();
    let owner_url = db.url.replacen("://postgres@", "://maas_owner@", 1);
    let app_url = db.url.replacen("://postgres@", "://maas_app@", 1);

    let (code, out, err) = maasctl_async(&owner_url, &["migrate"], NO_ENV).await;
    assert_eq!(code, 0, "{out}{err}");
    connect(&owner_url)
        .await
        .batch_execute(&GRANTS.replace("{db}", &db.name))
        .await
        .unwrap();

    // The runtime role cannot change the schema.
    let app = connect(&app_url).await;
    let e = app.batch_execute("CREATE TABLE intruder (x int)").await.unwrap_err();
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
        "{e}"
    );

    let d = Maasd::spawn(&app_url, Opts::default());
    let id = insert_one(&app, "as the runtime role").await;
    wait_status(&app, id, "COMPLETED").await;
    let log = d.plain_log();
    assert!(!log.contains("permission denied"), "{log}");
}
