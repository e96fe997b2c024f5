//! The SQL door against a producer that tries what an attacker holding
//! only the documented grants would (docs/deploying.md, "Producer roles"
//! and the `SQL:` rows of its scope table): functions of its own where the
//! triggers might look for them, a group role's members, roles that no
//! mapping or two tenants' mappings cover, turn ids planted ahead of the
//! sequence. Real PostgreSQL, real login roles with exactly those grants,
//! real `maasctl`; invariant 13.
//!
//! Roles belong to the cluster, not to a test's database, so every role
//! here has a name of its own.

use std::time::Duration;

use bytes::Bytes;
use futures_util::SinkExt;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::support::cli::{NO_ENV, maasctl_async};
use crate::support::daemon::Opts;
use crate::support::db::{TestDb, column, connect, value};
use crate::support::poll::poll_until;
use crate::support::tenants::{get, start, submit_ok, token};

/// The producer grants of docs/deploying.md, step 8, run by the owner;
/// `{schema}` is maas's.
const GRANTS: &str = "
GRANT CONNECT ON DATABASE {db} TO {role};
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT INSERT ON pipeline_runs, raw_logs, pipeline_replies TO {role};
GRANT SELECT ON maas_my_requests TO {role};";

const NIL: Uuid = Uuid::nil();

/// A role name of its own (roles are shared by the cluster's databases).
fn fresh(tag: &str) -> String {
    format!("maas_{tag}_{}", &Uuid::new_v4().simple().to_string()[..10])
}

/// A test database and its superuser client, with tenants `shop` and
/// `helpdesk`; `None` (skipped) when the cluster's URL does not name the
/// user postgres, so no other login role can be made.
struct Env {
    db: TestDb,
    admin: Client,
    shop: Uuid,
    helpdesk: Uuid,
}

impl Env {
    async fn new() -> Option<Env> {
        let db = TestDb::new().await;
        let url = db.url.clone();
        Env::on(db, &url).await
    }

    /// On `db`, whose superuser connects with `url`.
    async fn on(db: TestDb, url: &str) -> Option<Env> {
        if !crate::support::superuser_postgres(&db.url, "the SQL door's tests") {
            return None;
        }
        let admin = connect(url).await;
        let mut ids = Vec::new();
        for name in ["shop", "helpdesk"] {
            ids.push(value(&admin, "INSERT INTO tenants (name) VALUES ($1) RETURNING id", &[&name]).await);
        }
        Some(Env {
            shop: ids[0],
            helpdesk: ids[1],
            db,
            admin,
        })
    }

    /// Creates `role` (LOGIN or not) with the producer grants, in maas's
    /// `schema`.
    async fn role(&self, role: &str, login: bool, schema: &str) {
        let kind = if login { "LOGIN" } else { "NOLOGIN" };
        self.admin
            .batch_execute(&format!(
                "CREATE ROLE {role} {kind};{}",
                GRANTS
                    .replace("{db}", &self.db.name)
                    .replace("{role}", role)
                    .replace("{schema}", schema)
            ))
            .await
            .unwrap();
    }

    /// A NOLOGIN group with the producer grants mapped to `tenant` by
    /// `maasctl tenants grant`, and a LOGIN member of it (`IN ROLE`, with
    /// INHERIT) with no grant of its own: (group, member, member's session).
    async fn group(&self, tenant: &str) -> (String, String, Client) {
        let (group, member) = (fresh("group"), fresh("member"));
        self.role(&group, false, "public").await;
        self.admin
            .batch_execute(&format!("CREATE ROLE {member} LOGIN IN ROLE {group}"))
            .await
            .unwrap();
        maasctl_ok(&self.db, &["tenants", "grant", tenant, "--role", &group]).await;
        let session = self.login(&member).await;
        (group, member, session)
    }

    async fn login(&self, role: &str) -> Client {
        connect(&self.db.url.replacen("://postgres@", &format!("://{role}@"), 1)).await
    }

    async fn stored(&self, tenant: Uuid, user: Uuid) -> Uuid {
        value(
            &self.admin,
            "SELECT maas_tenant_user($1::uuid, $2::uuid)",
            &[&tenant, &user],
        )
        .await
    }

    /// (user_id, tenant_id, tenant_user_id) of request `id`.
    async fn request(&self, id: Uuid) -> (Uuid, Uuid, Option<Uuid>) {
        crate::sql_tenancy::stored_as(&self.admin, id).await
    }

    /// A new producer role of shop (`prefix` and a number), given `setup`
    /// (SQL with `{role}` for its name) as the owner, logged in.
    async fn shop_producer(&self, prefix: &str, setup: &str) -> (String, Client) {
        let role = fresh(prefix);
        self.role(&role, true, "public").await;
        self.admin.batch_execute(&setup.replace("{role}", &role)).await.unwrap();
        maasctl_ok(&self.db, &["tenants", "grant", "shop", "--role", &role]).await;
        let c = self.login(&role).await;
        (role, c)
    }

    /// A request of `tenant` that waits for its user's reply (made by the
    /// owner, as the analyzer's question would leave it).
    async fn waiting(&self, tenant: Uuid) -> Uuid {
        let id: Uuid = value(
            &self.admin,
            "INSERT INTO pipeline_runs (user_id, user_query, tenant_id) VALUES (gen_random_uuid(), 'q', $1) RETURNING id",
            &[&tenant],
        )
        .await;
        self.admin
            .execute(
                "UPDATE pipeline_runs SET status = 'WAITING_USER_INPUT', question = 'Which one?' WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        id
    }

    /// (status, replies logged) of request `id`.
    async fn replied(&self, id: Uuid) -> (String, i64) {
        let r = self
            .admin
            .query_one(
                "SELECT status, (SELECT count(*) FROM raw_logs l WHERE l.request_id = r.id AND l.message_type = 'user_reply')
                 FROM pipeline_runs r WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    }

    /// The next value raw_logs' identity will hand out.
    async fn next_turn_id(&self) -> i64 {
        value(
            &self.admin,
            "SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM raw_logs_id_seq",
            &[],
        )
        .await
    }
}

async fn maasctl_ok(db: &TestDb, args: &[&str]) -> String {
    let (code, out, err) = maasctl_async(&db.url, args, NO_ENV).await;
    assert_eq!(code, 0, "maasctl {args:?}: {out}{err}");
    out
}

const INSERT: &str = "INSERT INTO pipeline_runs (id, user_id, user_query) VALUES ($1, $2, $3)";
const TURN: &str = "INSERT INTO raw_logs (user_id, message_type, content) VALUES ($1, 'user_query', $2)";

/// Runs `sql` and expects a refusal with `code` naming `col` (`None`: no
/// column); returns the error's message.
async fn refused(c: &Client, sql: &str, params: &[&(dyn ToSql + Sync)], code: &SqlState, col: Option<&str>) -> String {
    let e = c.execute(sql, params).await.expect_err(sql);
    let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
    assert_eq!((db.code(), db.column()), (code, col), "{sql}: {db}");
    assert!(db.hint().is_some_and(|h| !h.is_empty()), "{sql}: no hint: {db}");
    db.message().to_owned()
}

/// A plain request of `c` for `user`, stored as `want` (user_id,
/// tenant_id, tenant_user_id).
async fn inserts_as(env: &Env, c: &Client, user: Uuid, want: (Uuid, Uuid, Option<Uuid>)) -> Uuid {
    let id = Uuid::new_v4();
    c.execute(INSERT, &[&id, &user, &"where is my order?"]).await.unwrap();
    assert_eq!(env.request(id).await, want, "request {id} of user {user}");
    id
}

/// The ids `c` reads through maas_my_requests.
async fn reads(c: &Client) -> Vec<Uuid> {
    column(c, "SELECT id FROM maas_my_requests ORDER BY id", &[]).await
}

// ---- the SQL rows of the scope table ------------------------------------------

/// A login role that a group mapped to `shop` covers: its requests and
/// turns are `shop`'s, it reads `shop`'s requests and no other tenant's,
/// and `tenants roles` names it under the group.
async fn row_mapped(env: &Env) {
    let (group, member, c) = env.group("shop").await;
    let user = Uuid::new_v4();
    let stored = env.stored(env.shop, user).await;
    let mine = inserts_as(env, &c, user, (stored, env.shop, Some(user))).await;
    c.execute(TURN, &[&user, &"imported"]).await.unwrap();
    let turn: Vec<Uuid> = column(
        &env.admin,
        "SELECT user_id FROM raw_logs WHERE content = 'imported'",
        &[],
    )
    .await;
    assert_eq!(turn, vec![stored], "the member's turn is shop's user's");

    // The default tenant's and helpdesk's requests stay out of its view.
    let theirs = Uuid::new_v4();
    env.admin
        .execute(INSERT, &[&theirs, &user, &"the default tenant's"])
        .await
        .unwrap();
    let (other_group, _, other) = env.group("helpdesk").await;
    inserts_as(
        env,
        &other,
        user,
        (env.stored(env.helpdesk, user).await, env.helpdesk, Some(user)),
    )
    .await;
    assert_eq!(reads(&c).await, vec![mine]);
    // It answers its own tenant's questions only.
    replies_only_within_its_tenant(env, &c).await;
    // Nor does it learn another role's tenant from the lookup.
    let lookup = "SELECT maas_role_tenant($1::text::name)";
    let theirs: Option<Uuid> = value(&c, lookup, &[&other_group]).await;
    let own: Option<Uuid> = value(&c, lookup, &[&group]).await;
    assert_eq!((theirs, own), (None, Some(env.shop)));

    let listed = maasctl_ok(&env.db, &["tenants", "roles"]).await;
    let line = listed.lines().find(|l| l.contains(&group)).unwrap_or_default();
    assert!(line.starts_with("shop") && line.contains(&member), "{listed}");
}

/// That role naming another tenant, a stored user id, a request on a
/// turn, or a turn id of its own (OVERRIDING SYSTEM VALUE over the next
/// ids, with ON CONFLICT DO NOTHING; COPY with an id): each refused naming
/// the column, and no planted id is taken.
async fn row_refused_values(env: &Env) {
    let (_, _, c) = env.group("shop").await;
    let user = Uuid::new_v4();
    let (denied, invalid) = (SqlState::INSUFFICIENT_PRIVILEGE, SqlState::INVALID_PARAMETER_VALUE);
    let with_tenant = "INSERT INTO pipeline_runs (user_id, user_query, tenant_id) VALUES ($1, 'q', $2)";
    refused(&c, with_tenant, &[&user, &env.helpdesk], &denied, Some("tenant_id")).await;
    let others = env.stored(env.helpdesk, user).await;
    refused(&c, INSERT, &[&Uuid::new_v4(), &others, &"q"], &invalid, Some("user_id")).await;
    let named = "INSERT INTO raw_logs (user_id, message_type, content, request_id) VALUES ($1, 'user_query', 't', $2)";
    refused(&c, named, &[&user, &Uuid::new_v4()], &denied, Some("request_id")).await;

    let next = env.next_turn_id().await;
    let planted = "INSERT INTO raw_logs (id, user_id, message_type, content) OVERRIDING SYSTEM VALUE
                   SELECT $1::int8 + g, $2, 'user_query', 'planted' FROM generate_series(0, 99) g
                   ON CONFLICT DO NOTHING";
    let said = refused(&c, planted, &[&next, &user], &SqlState::GENERATED_ALWAYS, Some("id")).await;
    assert!(said.contains(&next.to_string()), "{said}");
    let sink = c
        .copy_in("COPY raw_logs (id, user_id, message_type, content) FROM STDIN")
        .await
        .unwrap();
    futures_util::pin_mut!(sink);
    let line = format!("{}\t{user}\tuser_query\tcopied\n", next + 1);
    sink.send(Bytes::from(line)).await.unwrap();
    let e = sink.finish().await.expect_err("COPY with an id");
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
    assert_eq!(
        (db.code(), db.column()),
        (&SqlState::GENERATED_ALWAYS, Some("id")),
        "{db}"
    );

    let taken: i64 = value(&env.admin, "SELECT count(*) FROM raw_logs WHERE id >= $1", &[&next]).await;
    assert_eq!(taken, 0, "a planted id was stored");
}

/// A producer that owns a schema (first on its default path), with a
/// look-alike there of every function the triggers call and a path that
/// puts its schema before pg_catalog; and, with maas installed in a schema
/// of its own, a producer that may CREATE in `public` and puts the
/// look-alikes there: the rows of both are mapped and refused as any
/// producer's.
async fn row_own_schema(env: &Env) {
    let (role, c) = env.shop_producer("owner", "CREATE SCHEMA AUTHORIZATION {role}").await;
    look_alikes(&c, &role).await;
    c.batch_execute(&format!("SET search_path = {role}, pg_catalog, public"))
        .await
        .unwrap();
    holds_as_any_producer(env, &c).await;

    look_alikes_in_public_with_maas_in_a_schema_of_its_own().await;
}

/// maas installed in schema `maas`; a producer of `shop` that may CREATE
/// in `public` and puts it first on its path, with the look-alikes there.
async fn look_alikes_in_public_with_maas_in_a_schema_of_its_own() {
    let db = TestDb::empty().await;
    db.client().await.batch_execute("CREATE SCHEMA maas").await.unwrap();
    let url = format!("{}?options=-csearch_path%3Dmaas", db.url);
    let (code, out, err) = maasctl_async(&url, &["migrate"], NO_ENV).await;
    assert_eq!(code, 0, "{out}{err}");
    let Some(env) = Env::on(db, &url).await else {
        return;
    };
    let role = fresh("public");
    env.role(&role, true, "maas").await;
    env.admin
        .batch_execute(&format!(
            "GRANT CREATE ON SCHEMA public TO {role};
             INSERT INTO tenant_roles (role, tenant_id) VALUES ('{role}', '{}');",
            env.shop
        ))
        .await
        .unwrap();
    let c = env.login(&role).await;
    look_alikes(&c, "public").await;
    c.batch_execute("SET search_path = public, maas, pg_catalog")
        .await
        .unwrap();
    holds_as_any_producer(&env, &c).await;
}

/// A look-alike in `schema` of every function the triggers call, each
/// giving the answer an attacker wants: the user id as sent, no tenant, no
/// refusal, no query blank.
async fn look_alikes(c: &Client, schema: &str) {
    let mut sql = String::new();
    for (f, body) in [
        ("maas_tenant_user(t uuid, u uuid) RETURNS uuid", "SELECT u"),
        ("maas_role_tenant(r name) RETURNS uuid", "SELECT NULL::uuid"),
        (
            "producer_tenant(t name) RETURNS uuid",
            "SELECT '00000000-0000-0000-0000-000000000000'::uuid",
        ),
        ("refuse_stored_user(u uuid) RETURNS void", "SELECT"),
        ("maas_turn_id_drawn(id bigint) RETURNS boolean", "SELECT true"),
        (
            "refuse_request_bound(a text, b text, c text, d text, e text) RETURNS void",
            "SELECT",
        ),
        ("btrim(t text) RETURNS text", "SELECT 'not blank'::text"),
        (
            "maas_event(i uuid, s text, o text, p boolean) RETURNS text",
            "SELECT 'forged'::text",
        ),
        ("maas_user_erase_key(u uuid) RETURNS bigint", "SELECT 1::bigint"),
        ("pg_advisory_xact_lock_shared(k bigint) RETURNS void", "SELECT"),
    ] {
        sql.push_str(&format!("CREATE FUNCTION {schema}.{f} LANGUAGE sql AS $x${body}$x$;\n"));
    }
    c.batch_execute(&sql).await.unwrap();
}

/// What any producer of `shop` gets, whatever it created: its request and
/// its turn stored as shop's user; a stored user id, another tenant, a
/// blank query and a turn id of its own refused.
async fn holds_as_any_producer(env: &Env, c: &Client) {
    replies_only_within_its_tenant(env, c).await;
    let user = Uuid::new_v4();
    let stored = env.stored(env.shop, user).await;
    inserts_as(env, c, user, (stored, env.shop, Some(user))).await;
    let others = env.stored(env.helpdesk, user).await;
    let (denied, invalid) = (SqlState::INSUFFICIENT_PRIVILEGE, SqlState::INVALID_PARAMETER_VALUE);
    refused(c, INSERT, &[&Uuid::new_v4(), &others, &"q"], &invalid, Some("user_id")).await;
    let with_tenant = "INSERT INTO pipeline_runs (user_id, user_query, tenant_id) VALUES ($1, 'q', $2)";
    refused(c, with_tenant, &[&user, &env.helpdesk], &denied, Some("tenant_id")).await;
    let blank = c
        .execute(INSERT, &[&Uuid::new_v4(), &user, &"   "])
        .await
        .expect_err("blank query");
    let db = blank.as_db_error().unwrap_or_else(|| panic!("{blank}"));
    assert_eq!(
        (db.code(), db.column(), db.constraint()),
        (
            &SqlState::CHECK_VIOLATION,
            Some("user_query"),
            Some("pipeline_runs_query_not_empty")
        ),
        "{db}"
    );
    let planted = "INSERT INTO raw_logs (id, user_id, message_type, content) OVERRIDING SYSTEM VALUE
                   VALUES ($1, $2, 'user_query', 'planted')";
    let next = env.next_turn_id().await;
    refused(
        c,
        planted,
        &[&(next + 5), &user],
        &SqlState::GENERATED_ALWAYS,
        Some("id"),
    )
    .await;
    let content = format!("a turn of {user}");
    c.execute(TURN, &[&user, &content]).await.unwrap();
    let turn: Vec<Uuid> = column(
        &env.admin,
        "SELECT user_id FROM raw_logs WHERE content = $1",
        &[&content],
    )
    .await;
    assert_eq!(turn, vec![stored]);
}

const REPLY: &str = "INSERT INTO pipeline_replies (run_id, text) VALUES ($1, 'the blue one')";

/// Producer `c` of shop answers shop's waiting request through
/// `pipeline_replies`, and is refused (as absent, naming the column) for
/// helpdesk's and the default tenant's: those keep waiting, no reply
/// logged.
async fn replies_only_within_its_tenant(env: &Env, c: &Client) {
    for tenant in [env.helpdesk, NIL] {
        let id = env.waiting(tenant).await;
        let e = c.execute(REPLY, &[&id]).await.expect_err("another tenant's request");
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
        assert_eq!(
            (db.code(), db.column()),
            (&SqlState::NO_DATA_FOUND, Some("run_id")),
            "{db}"
        );
        assert!(db.message().contains("not a request of this role's tenant"), "{db}");
        assert_eq!(env.replied(id).await, ("WAITING_USER_INPUT".to_owned(), 0));
    }
    let id = env.waiting(env.shop).await;
    assert_eq!(c.execute(REPLY, &[&id]).await.unwrap(), 1);
    assert_eq!(env.replied(id).await, ("NEW".to_owned(), 1));
}

/// A role no mapping covers: every insert refused naming it, and its view
/// empty; once the default tenant maps it (`tenants grant default`), it
/// inserts for the default tenant; once the mapping is removed
/// (`tenants revoke`, which says so), it is refused again.
async fn row_unmapped(env: &Env) {
    let role = fresh("unmapped");
    env.role(&role, true, "public").await;
    let c = env.login(&role).await;
    env.admin
        .execute(INSERT, &[&Uuid::new_v4(), &Uuid::new_v4(), &"a default request"])
        .await
        .unwrap();
    let user = Uuid::new_v4();
    let denied = SqlState::INSUFFICIENT_PRIVILEGE;
    for sql in [INSERT, TURN] {
        let params: Vec<&(dyn ToSql + Sync)> = if sql == INSERT {
            vec![&NIL, &user, &"q"]
        } else {
            vec![&user, &"t"]
        };
        let said = refused(&c, sql, &params, &denied, None).await;
        assert!(said.contains(&role) && said.contains("no tenant"), "{said}");
    }
    assert_eq!(reads(&c).await, Vec::<Uuid>::new(), "an unmapped role reads nothing");

    maasctl_ok(&env.db, &["tenants", "grant", "default", "--role", &role]).await;
    let id = inserts_as(env, &c, user, (user, NIL, None)).await;
    assert!(reads(&c).await.contains(&id));
    let said = maasctl_ok(&env.db, &["tenants", "revoke", "--role", &role]).await;
    assert!(said.contains(&role) && said.contains("refused"), "{said}");
    refused(&c, INSERT, &[&Uuid::new_v4(), &user, &"q"], &denied, None).await;
    assert_eq!(reads(&c).await, Vec::<Uuid>::new());
}

/// A role that mappings of two tenants cover (a member of both groups):
/// its inserts and its view are refused, naming both tenants.
async fn row_two_tenants(env: &Env) {
    let (_, member, _) = env.group("shop").await;
    let (helpdesk_group, _, _) = env.group("helpdesk").await;
    env.admin
        .batch_execute(&format!("GRANT {helpdesk_group} TO {member}"))
        .await
        .unwrap();
    let c = env.login(&member).await;
    let said = refused(
        &c,
        INSERT,
        &[&Uuid::new_v4(), &Uuid::new_v4(), &"q"],
        &SqlState::INSUFFICIENT_PRIVILEGE,
        None,
    )
    .await;
    assert!(said.contains("shop") && said.contains("helpdesk"), "{said}");
    let waiting = env.waiting(env.shop).await;
    let said = refused(&c, REPLY, &[&waiting], &SqlState::INSUFFICIENT_PRIVILEGE, None).await;
    assert!(said.contains("shop") && said.contains("helpdesk"), "{said}");
    assert_eq!(env.replied(waiting).await, ("WAITING_USER_INPUT".to_owned(), 0));
    let e = c
        .query("SELECT * FROM maas_my_requests", &[])
        .await
        .expect_err("the view");
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e}");
    let listed = maasctl_ok(&env.db, &["tenants", "roles"]).await;
    assert!(
        listed.lines().any(|l| l.contains(&member) && l.contains("refused")),
        "{listed}"
    );
}

/// The `SQL:` rows of the scope table in docs/deploying.md.
fn sql_rows() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/deploying.md")).unwrap();
    let section = doc.split("\n## Scopes").nth(1).unwrap_or_default();
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter(|l| l.starts_with("SQL:"))
        .map(str::to_owned)
        .collect()
}

/// Each row's probe, by the row's beginning.
const PROBES: [&str; 5] = [
    "SQL: a login role a tenant's mapping covers",
    "SQL: that role naming another tenant",
    "SQL: that role owning a schema",
    "SQL: a role no mapping covers",
    "SQL: a role two tenants' mappings cover",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sql_row_of_the_scope_table_holds_for_real_login_roles() {
    let rows = sql_rows();
    for row in &rows {
        assert!(
            PROBES.iter().any(|p| row.starts_with(p)),
            "no probe walks the row {row:?}"
        );
    }
    let Some(env) = Env::new().await else {
        return;
    };
    for (i, probe) in PROBES.iter().enumerate() {
        assert!(
            rows.iter().any(|r| r.starts_with(probe)),
            "no row {probe:?} in docs/deploying.md"
        );
        match i {
            0 => row_mapped(&env).await,
            1 => row_refused_values(&env).await,
            2 => row_own_schema(&env).await,
            3 => row_unmapped(&env).await,
            _ => row_two_tenants(&env).await,
        }
    }
}

// ---- beyond the table ---------------------------------------------------------

/// maas installed in `public`, and a producer that may CREATE there (what
/// docs/deploying.md says never to grant, and `maasctl doctor` warns
/// about): it cannot replace maas's functions, and the overloads and the
/// `btrim` it adds, with `public` before pg_catalog on its path, change
/// nothing the triggers run. (maas's own statements are another matter:
/// an overload there can be a closer match for them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn look_alikes_in_maas_own_public_change_nothing_the_triggers_run() {
    let Some(env) = Env::new().await else {
        return;
    };
    let (_, c) = env
        .shop_producer("creator", "GRANT CREATE ON SCHEMA public TO {role}")
        .await;
    for f in [
        "maas_tenant_user(t uuid, u uuid) RETURNS uuid LANGUAGE sql AS 'SELECT u'",
        "maas_role_tenant(r name) RETURNS uuid LANGUAGE sql AS 'SELECT NULL::uuid'",
        "refuse_stored_user(u uuid) RETURNS void LANGUAGE sql AS 'SELECT'",
    ] {
        let e = c
            .batch_execute(&format!("CREATE OR REPLACE FUNCTION public.{f}"))
            .await
            .expect_err(f);
        assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{f}: {e}");
    }
    c.batch_execute(
        "CREATE FUNCTION public.maas_tenant_user(t uuid, u text) RETURNS uuid LANGUAGE sql AS 'SELECT t';
         CREATE FUNCTION public.maas_role_tenant(r text) RETURNS uuid LANGUAGE sql AS 'SELECT NULL::uuid';
         CREATE FUNCTION public.refuse_stored_user(u text) RETURNS void LANGUAGE sql AS 'SELECT';
         CREATE FUNCTION public.btrim(t text) RETURNS text LANGUAGE sql AS $$SELECT 'not blank'::text$$;
         SET search_path = public, pg_catalog;",
    )
    .await
    .unwrap();
    holds_as_any_producer(&env, &c).await;
}

/// A producer planting turn ids ahead of the sequence is refused, and
/// every other tenant's query and answer are logged, as is a turn stored
/// by `users::remember`. Where an id is planted by a role trusted to
/// (the owner), the conflict is an error naming the constraint, never a
/// turn silently not logged: the request whose query would be lost is
/// refused, and the request whose answer would be lost fails naming
/// `raw_logs_pkey` and completes, logged, when retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_turn_ids_never_cost_a_turn() {
    let Some(env) = Env::new().await else {
        return;
    };
    let (_, _, producer) = env.group("shop").await;
    let next = env.next_turn_id().await;
    let planted = "INSERT INTO raw_logs (id, user_id, message_type, content) OVERRIDING SYSTEM VALUE
                   SELECT $1::int8 + g, $2, 'user_query', 'planted' FROM generate_series(0, 999) g
                   ON CONFLICT DO NOTHING";
    refused(
        &producer,
        planted,
        &[&next, &Uuid::new_v4()],
        &SqlState::GENERATED_ALWAYS,
        Some("id"),
    )
    .await;

    let api = start(&env.db, Opts::default()).await;
    let tok = token(&env.admin, "helpdesk", "desk", "admin").await;
    let (user, thread) = (Uuid::new_v4(), Uuid::new_v4());
    let asked = submit_ok(&api, &tok, user, thread, "Is my ticket open?").await;
    let (s, state) = get(&api, &tok, &format!("/api/query/{asked}/status?wait=60s")).await;
    assert_eq!(state["status"], "completed", "{s} {state}");
    let logged: Vec<String> = column(
        &env.admin,
        "SELECT message_type FROM raw_logs WHERE request_id = $1 ORDER BY id",
        &[&asked],
    )
    .await;
    assert_eq!(logged, ["user_query", "assistant_response"]);
    let key = maas::repo::users::UserKey::of_tenant(env.stored(env.helpdesk, user).await, user);
    let pool = env.db.pool();
    let client = pool.get().await.unwrap();
    let kept = maas::users::remember(&client, key, Some(thread), "my ticket number is 4711")
        .await
        .unwrap();
    let content: String = value(&env.admin, "SELECT content FROM raw_logs WHERE id = $1", &[&kept.id]).await;
    assert_eq!(content, "my ticket number is 4711");

    trusted_plants_are_errors(&env, &api, &tok).await;
}

/// The owner plants the next id: the request whose query log would take
/// it is refused with the constraint's name; then the id after the next
/// request's logged query: its answer fails naming the constraint, and a
/// retry completes it with both turns logged.
async fn trusted_plants_are_errors(env: &Env, api: &crate::support::api::Api, tok: &str) {
    let plant = "INSERT INTO raw_logs (id, user_id, message_type, content) OVERRIDING SYSTEM VALUE
                 VALUES ($1, gen_random_uuid(), 'user_query', 'planted by the owner')";
    let next = env.next_turn_id().await;
    env.admin.execute(plant, &[&next]).await.unwrap();
    let e = env
        .admin
        .execute(INSERT, &[&Uuid::new_v4(), &Uuid::new_v4(), &"log me"])
        .await
        .expect_err("a query whose log conflicts");
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
    assert_eq!(db.constraint(), Some("raw_logs_pkey"), "{db}");

    // Paused, so that the answer's id is planted before it is logged.
    let (user, thread) = (Uuid::new_v4(), Uuid::new_v4());
    maasctl_ok(&env.db, &["pause", "--reason", "planting"]).await;
    let id = submit_ok(api, tok, user, thread, "And now?").await;
    let answer_id = env.next_turn_id().await;
    env.admin.execute(plant, &[&answer_id]).await.unwrap();
    maasctl_ok(&env.db, &["resume"]).await;
    let status_of = || async {
        let st: String = value(&env.admin, "SELECT status FROM pipeline_runs WHERE id = $1", &[&id]).await;
        st
    };
    let ended = poll_until(Duration::from_secs(60), Duration::from_millis(100), || async {
        ["COMPLETED", "FAILED"].contains(&status_of().await.as_str())
    })
    .await;
    let error: Option<String> = value(&env.admin, "SELECT error FROM pipeline_runs WHERE id = $1", &[&id]).await;
    let status = status_of().await;
    assert!(
        ended && status == "FAILED" && error.as_deref().is_some_and(|e| e.contains("raw_logs_pkey")),
        "the request whose answer's id was planted: {status}, error {error:?}"
    );
    maasctl_ok(
        &env.db,
        &["requests", "retry", &id.to_string(), "--reason", "planted id"],
    )
    .await;
    let (s, state) = get(api, tok, &format!("/api/query/{id}/status?wait=60s")).await;
    assert_eq!(state["status"], "completed", "{s} {state}");
    let logged: Vec<String> = column(
        &env.admin,
        "SELECT message_type FROM raw_logs WHERE request_id = $1 ORDER BY id",
        &[&id],
    )
    .await;
    assert_eq!(logged, ["user_query", "assistant_response"]);
}

/// `maasctl doctor` warns about a producer that may CREATE in maas's
/// schema and use TEMP, one no mapping covers and one two tenants'
/// mappings cover, naming each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_warns_about_producer_roles() {
    let Some(env) = Env::new().await else {
        return;
    };
    let (_, _, _) = env.group("shop").await;
    let (creator, unmapped) = (fresh("creator"), fresh("unmapped"));
    env.role(&creator, true, "public").await;
    env.role(&unmapped, true, "public").await;
    env.admin
        .batch_execute(&format!(
            "GRANT CREATE ON SCHEMA public TO {creator};
             REVOKE TEMP ON DATABASE {} FROM PUBLIC;",
            env.db.name
        ))
        .await
        .unwrap();
    maasctl_ok(&env.db, &["tenants", "grant", "shop", "--role", &creator]).await;
    let (_, member, _) = env.group("shop").await;
    let (helpdesk_group, _, _) = env.group("helpdesk").await;
    env.admin
        .batch_execute(&format!("GRANT {helpdesk_group} TO {member}"))
        .await
        .unwrap();

    let (_, out, err) = maasctl_async(&env.db.url, &["doctor"], NO_ENV).await;
    let line = out
        .lines()
        .find(|l| l.contains("producers"))
        .unwrap_or_else(|| panic!("{out}{err}"));
    assert!(line.starts_with("warn"), "{line}");
    for (role, says) in [
        (&creator, "maas's own schema public"),
        (&unmapped, "mapped to no tenant"),
        (&member, "helpdesk, shop"),
    ] {
        let part = line.split("; ").find(|p| p.contains(role.as_str())).unwrap_or_default();
        assert!(part.contains(says), "{role}: {line}");
    }
    env.admin
        .batch_execute(&format!("GRANT TEMP ON DATABASE {} TO {creator}", env.db.name))
        .await
        .unwrap();
    let (_, out, _) = maasctl_async(&env.db.url, &["doctor"], NO_ENV).await;
    assert!(out.contains("TEMP"), "{out}");
}
