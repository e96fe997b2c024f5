//! Tenancy of the SQL interface: a producer application's database role
//! with only the grants docs/deploying.md lists ("Producer roles") inserts
//! requests and turns with plain SQL; its rows are its tenant's (the tenant
//! mapped to the role, never a column it chooses), its users the same users
//! as over HTTP, and it reads its own results through `maas_my_requests`
//! and nothing else. Real PostgreSQL, real login roles, real `maasctl`.

use std::time::Duration;

use reqwest::StatusCode;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use crate::support::cli::{NO_ENV, maasctl_async};
use crate::support::daemon::Opts;
use crate::support::db::{TestDb, by_name, column, connect, ensure_login_role, value};
use crate::support::poll::poll_until;
use crate::support::tenants::{get, start, submit_ok, token};

/// The producer role mapped to tenant `shop`.
const SHOP_ROLE: &str = "maas_shop_app";
/// A producer role the default tenant maps (`tenants grant default`).
const PLAIN_ROLE: &str = "maas_plain_app";

/// The producer grants of docs/deploying.md, run by the owner.
const PRODUCER_GRANTS: &str = "
GRANT CONNECT ON DATABASE {db} TO {role};
GRANT USAGE ON SCHEMA public TO {role};
GRANT INSERT ON pipeline_runs, raw_logs TO {role};
GRANT SELECT ON maas_my_requests TO {role};";

/// Logs in as `role` to the test database; `None` (the test is skipped)
/// when the cluster's URL does not name the user postgres.
async fn producer(db: &TestDb, admin: &Client, role: &str) -> Option<Client> {
    if !crate::support::superuser_postgres(&db.url, "the SQL door's tests") {
        return None;
    }
    ensure_login_role(admin, role).await;
    admin
        .batch_execute(&PRODUCER_GRANTS.replace("{db}", &db.name).replace("{role}", role))
        .await
        .unwrap();
    Some(connect(&db.url.replacen("://postgres@", &format!("://{role}@"), 1)).await)
}

/// `maasctl` against the test database; asserts it succeeded.
async fn maasctl_ok(db: &TestDb, args: &[&str]) -> String {
    let (code, out, err) = maasctl_async(&db.url, args, NO_ENV).await;
    assert_eq!(code, 0, "maasctl {args:?}: {out}{err}");
    out
}

/// `maasctl` against the test database; asserts it failed and returns
/// what it said on stderr.
async fn maasctl_refused(db: &TestDb, args: &[&str]) -> String {
    let (code, out, err) = maasctl_async(&db.url, args, NO_ENV).await;
    assert_ne!(code, 0, "maasctl {args:?} succeeded: {out}{err}");
    err
}

/// Tenant `shop` with `SHOP_ROLE` mapped to it by `maasctl tenants add
/// --role`, and `PLAIN_ROLE` mapped to the default tenant; (admin, shop,
/// plain, shop's id).
async fn producers(db: &TestDb) -> Option<(Client, Client, Client, Uuid)> {
    let admin = db.client().await;
    let shop = producer(db, &admin, SHOP_ROLE).await?;
    let plain = producer(db, &admin, PLAIN_ROLE).await?;
    maasctl_ok(db, &["tenants", "add", "shop", "--role", SHOP_ROLE]).await;
    maasctl_ok(db, &["tenants", "grant", "default", "--role", PLAIN_ROLE]).await;
    let shop_id: Uuid = value(&admin, "SELECT id FROM tenants WHERE name = 'shop'", &[]).await;
    Some((admin, shop, plain, shop_id))
}

/// Runs `sql` as a producer and expects a refusal with `code` naming
/// `column`.
async fn refused(
    c: &Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    code: &SqlState,
    col: &str,
) {
    let e = c.execute(sql, params).await.expect_err(sql);
    let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
    assert_eq!(db.code(), code, "{sql}: {db}");
    assert_eq!(db.column(), Some(col), "{sql}: {db}");
}

/// (user_id, tenant_id, tenant_user_id) of request `id`.
pub(crate) async fn stored_as(admin: &Client, id: Uuid) -> (Uuid, Uuid, Option<Uuid>) {
    let row = admin
        .query_one(
            "SELECT user_id, tenant_id, tenant_user_id FROM pipeline_runs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    by_name!(row, "user_id", "tenant_id", "tenant_user_id")
}

async fn stored_user(admin: &Client, tenant: Uuid, user: Uuid) -> Uuid {
    value(admin, "SELECT maas_tenant_user($1, $2)", &[&tenant, &user]).await
}

const INSERT: &str = "INSERT INTO pipeline_runs (id, user_id, user_query) VALUES ($1, $2, $3)";

/// A plain INSERT stores the user as the tenant's
/// stored user, like HTTP, whether the tenant comes from the inserting role
/// (a producer) or from the column (a trusted role); its logged query and a
/// producer's own turn are the same user's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_insert_stores_the_tenants_user() {
    let db = TestDb::new().await;
    let Some((admin, shop, plain, shop_id)) = producers(&db).await else {
        return;
    };
    let user = Uuid::new_v4();
    let stored = stored_user(&admin, shop_id, user).await;

    let by_role = Uuid::new_v4();
    shop.execute(INSERT, &[&by_role, &user, &"from the shop's role"])
        .await
        .unwrap();
    assert_eq!(stored_as(&admin, by_role).await, (stored, shop_id, Some(user)));
    let logged: Vec<Uuid> = column(
        &admin,
        "SELECT user_id FROM raw_logs WHERE request_id = $1",
        &[&by_role],
    )
    .await;
    assert_eq!(logged, vec![stored]);

    // Naming tenant_id as a trusted role (psql as the owner) maps the same way.
    let by_column: Uuid = value(
        &admin,
        "INSERT INTO pipeline_runs (user_id, user_query, tenant_id) VALUES ($1, 'by column', $2) RETURNING id",
        &[&user, &shop_id],
    )
    .await;
    assert_eq!(stored_as(&admin, by_column).await, (stored, shop_id, Some(user)));

    // A producer's own turn is its tenant's user's.
    shop.execute(
        "INSERT INTO raw_logs (user_id, message_type, content) VALUES ($1, 'user_query', 'imported')",
        &[&user],
    )
    .await
    .unwrap();
    let turn: Vec<Uuid> = column(&admin, "SELECT user_id FROM raw_logs WHERE content = 'imported'", &[]).await;
    assert_eq!(turn, vec![stored]);

    // A role the default tenant maps: its ids stay themselves.
    let default_id = Uuid::new_v4();
    plain.execute(INSERT, &[&default_id, &user, &"default"]).await.unwrap();
    assert_eq!(stored_as(&admin, default_id).await, (user, Uuid::nil(), None));
}

/// A stored (version-8) id in user_id (which reached that user's memory
/// before), another tenant in tenant_id, a tenant_user_id that does not
/// match, a producer's turn naming a request: each refused with an error
/// naming the column, whoever inserts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naming_a_stored_id_or_another_tenant_is_refused() {
    let db = TestDb::new().await;
    let Some((admin, shop, plain, shop_id)) = producers(&db).await else {
        return;
    };
    let user = Uuid::new_v4();
    let shops_user = stored_user(&admin, shop_id, user).await;
    let denied = SqlState::INSUFFICIENT_PRIVILEGE;
    let invalid = SqlState::INVALID_PARAMETER_VALUE;
    for c in [&plain, &shop, &admin] {
        refused(
            c,
            INSERT,
            &[&Uuid::new_v4(), &shops_user, &"whose memory?"],
            &invalid,
            "user_id",
        )
        .await;
    }
    let with_tenant = "INSERT INTO pipeline_runs (user_id, user_query, tenant_id) VALUES ($1, 'q', $2)";
    refused(&plain, with_tenant, &[&user, &shop_id], &denied, "tenant_id").await;
    admin
        .execute("INSERT INTO tenants (name) VALUES ('other')", &[])
        .await
        .unwrap();
    let other: Uuid = value(&admin, "SELECT id FROM tenants WHERE name = 'other'", &[]).await;
    refused(&shop, with_tenant, &[&user, &other], &denied, "tenant_id").await;
    let forged = "INSERT INTO pipeline_runs (user_id, user_query, tenant_user_id) VALUES ($1, 'q', $2)";
    let others_user = stored_user(&admin, other, user).await;
    refused(&shop, forged, &[&others_user, &user], &invalid, "tenant_user_id").await;
    let turn = "INSERT INTO raw_logs (user_id, message_type, content, request_id) VALUES ($1, 'user_query', 't', $2)";
    refused(&shop, turn, &[&user, &Uuid::new_v4()], &denied, "request_id").await;
    let stored_turn = "INSERT INTO raw_logs (user_id, message_type, content) VALUES ($1, 'user_query', 't')";
    refused(&plain, stored_turn, &[&shops_user], &invalid, "user_id").await;

    // Nothing of it reached the shop user.
    let rows: i64 = value(
        &admin,
        "SELECT (SELECT count(*) FROM pipeline_runs) + (SELECT count(*) FROM raw_logs)",
        &[],
    )
    .await;
    assert_eq!(rows, 0);
}

/// A producer reads its own tenant's results through `maas_my_requests`
/// (with the user ids it sent) and nothing else: not another tenant's
/// rows, not the base tables, not the tenant mapping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_reads_its_own_results_through_the_view_only() {
    let db = TestDb::new().await;
    let Some((_admin, shop, plain, _)) = producers(&db).await else {
        return;
    };
    let (user, mine, theirs) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    shop.execute(INSERT, &[&mine, &user, &"shop's"]).await.unwrap();
    plain.execute(INSERT, &[&theirs, &user, &"default's"]).await.unwrap();

    for (c, own, other) in [(&shop, mine, theirs), (&plain, theirs, mine)] {
        let rows: Vec<(Uuid, Uuid)> = c
            .query("SELECT id, user_id FROM maas_my_requests", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| by_name!(r, "id", "user_id"))
            .collect();
        assert_eq!(rows, vec![(own, user)], "and not {other}");
    }
    for sql in [
        "SELECT count(*) FROM pipeline_runs",
        "SELECT count(*) FROM raw_logs",
        "SELECT count(*) FROM tenants",
        "SELECT count(*) FROM tenant_roles",
        "SELECT count(*) FROM lsm_storage",
        "UPDATE pipeline_runs SET status = 'CANCELLED'",
        "DELETE FROM raw_logs",
        "INSERT INTO pipeline_runs (user_id, user_query) VALUES (gen_random_uuid(), 'q') RETURNING id",
    ] {
        let e = shop.execute(sql, &[]).await.expect_err(sql);
        assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{sql}: {e}");
    }
}

/// A plain INSERT by a mapped role shares memory with the same user over
/// HTTP for that tenant: the turn the shop sent over HTTP is in the context
/// of the request its role inserted, and the shop's token reads that
/// request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_insert_shares_memory_with_the_same_user_over_http() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    let Some(shop) = producer(&db, &admin, SHOP_ROLE).await else {
        return;
    };
    let api = start(&db, Opts::default()).await;
    let tok = token(&admin, "shop", "shop-app", "admin").await;
    maasctl_ok(&db, &["tenants", "grant", "shop", "--role", SHOP_ROLE]).await;
    let (user, thread) = (Uuid::new_v4(), Uuid::new_v4());

    let first = submit_ok(&api, &tok, user, thread, "My locker code is ALPHA-7781; remember it.").await;
    let (s, state) = get(&api, &tok, &format!("/api/query/{first}/status?wait=60s")).await;
    assert_eq!(state["status"], "completed", "{s} {state}");

    let id = Uuid::new_v4();
    shop.execute(
        "INSERT INTO pipeline_runs (id, user_id, thread_id, user_query) VALUES ($1, $2, $3, 'What is my locker code?')",
        &[&id, &user, &thread],
    )
    .await
    .unwrap();
    let done = poll_until(Duration::from_secs(60), Duration::from_millis(100), || async {
        let st: Vec<String> = column(&shop, "SELECT status FROM maas_my_requests WHERE id = $1", &[&id]).await;
        st.first().is_some_and(|s| s == "COMPLETED")
    })
    .await;
    assert!(done, "the inserted request did not complete");
    let (s, state) = get(&api, &tok, &format!("/api/query/{id}/status?include=context")).await;
    assert_eq!(s, StatusCode::OK, "{state}");
    let context = state["context"].as_str().unwrap_or_default();
    assert!(context.contains("ALPHA-7781"), "{context}");
}

/// `maasctl tenants grant` maps producer roles only: an unknown role and a
/// role that may UPDATE pipeline_runs (here the superuser) are refused
/// with the reason, and `tenants roles` lists each mapping with the login
/// role it covers; a mapped role moves with another grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_grant_maps_producer_roles_only() {
    let db = TestDb::new().await;
    let Some((_admin, _shop, _plain, _)) = producers(&db).await else {
        return;
    };
    for (role, why) in [
        ("postgres", "UPDATE pipeline_runs"),
        ("maas_no_such_role", "no such database role"),
    ] {
        let err = maasctl_refused(&db, &["tenants", "grant", "shop", "--role", role]).await;
        assert!(err.contains(why), "{err}");
    }
    let tenant_of = |listed: &str, role: &str| {
        listed
            .lines()
            .find(|l| l.contains(role))
            .and_then(|l| l.split_whitespace().next())
            .map(str::to_owned)
    };
    let listed = maasctl_ok(&db, &["tenants", "roles"]).await;
    assert_eq!(tenant_of(&listed, SHOP_ROLE).as_deref(), Some("shop"), "{listed}");
    assert_eq!(tenant_of(&listed, PLAIN_ROLE).as_deref(), Some("default"), "{listed}");
    let out = maasctl_ok(&db, &["tenants", "grant", "shop", "--role", PLAIN_ROLE]).await;
    assert!(out.contains(PLAIN_ROLE), "{out}");
    let listed = maasctl_ok(&db, &["tenants", "roles"]).await;
    assert_eq!(tenant_of(&listed, PLAIN_ROLE).as_deref(), Some("shop"), "{listed}");
}

/// `maasctl tenants revoke` removes a role's mapping, with its audit row,
/// whatever grants the role still holds: a role no mapping covers is
/// refused and reads nothing (it no longer falls to the default tenant),
/// and revoke says so. A role mapped to nothing is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_revoke_leaves_a_role_refused() {
    let db = TestDb::new().await;
    let Some((admin, shop, _plain, _)) = producers(&db).await else {
        return;
    };
    shop.execute(INSERT, &[&Uuid::new_v4(), &Uuid::new_v4(), &"before"])
        .await
        .unwrap();
    // Named twice, revoked once.
    let out = maasctl_ok(&db, &["tenants", "revoke", "--role", SHOP_ROLE, "--role", SHOP_ROLE]).await;
    assert!(
        out.contains(SHOP_ROLE) && out.contains("shop") && out.contains("refused"),
        "{out}"
    );
    assert!(!maasctl_ok(&db, &["tenants", "roles"]).await.contains(SHOP_ROLE));
    let audit: Vec<String> = column(
        &admin,
        "SELECT detail->>'tenant' FROM operator_actions WHERE action = 'tenant_revoke' AND detail->>'role' = $1",
        &[&SHOP_ROLE],
    )
    .await;
    assert_eq!(audit, vec!["shop".to_owned()]);
    let e = shop
        .execute(INSERT, &[&Uuid::new_v4(), &Uuid::new_v4(), &"after"])
        .await
        .expect_err("an unmapped role's insert");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e}");
    let seen: Vec<Uuid> = column(&shop, "SELECT id FROM maas_my_requests", &[]).await;
    assert_eq!(seen, Vec::<Uuid>::new());

    for role in [SHOP_ROLE, "maas_never_mapped"] {
        let err = maasctl_refused(&db, &["tenants", "revoke", "--role", role]).await;
        assert!(err.contains(role) && err.contains("not mapped"), "{err}");
    }
}
