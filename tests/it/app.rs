//! The application layer driven directly, with no door: the functions every
//! door calls (who calls and what it may do, the text rules, submitting
//! with a tenant's limits and an idempotency key, following a request to
//! its end, a user's memory) against a real PostgreSQL, with a real maasd
//! answering the request.

use std::sync::Arc;

use maas::app::follow::{Follower, Frame, RequestState, Target};
use maas::app::{App, AppError, Kind, MemoryServices, Need, Principal, input, memory, submit};
use maas::config::{Config, Secret};
use maas::listener::{Event, ListenerHandler, Notifier};
use maas::metrics::Stats;
use maas::model::{Scope, Status};
use maas::repo::requests::NewRequest;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::GENEROUS;
use crate::support::daemon::Opts;
use crate::support::db::TestDb;
use crate::support::tenants::{start, token};

/// Follows notifications for the hub only.
struct Quiet;

impl ListenerHandler for Quiet {
    fn connected(&self, _reconnect: bool) {}
    fn disconnected(&self, _reason: &str) {}
    fn event(&self, _event: &Event) {}
}

/// The application over `db`, as `maasctl mcp` builds it: its own pool,
/// its own LISTEN session, no HTTP state.
fn app_on(db: &TestDb, shutdown: &CancellationToken) -> App {
    let cfg = Arc::new(Config {
        database_url: Secret(db.url.clone()),
        ..Config::default()
    });
    let notifier = Notifier::new(Arc::new(Stats::default()));
    tokio::spawn(maas::listener::run(
        cfg.clone(),
        notifier.clone(),
        Arc::new(Quiet),
        shutdown.clone(),
    ));
    let llm = Arc::new(maas::llm::Llm::from_config(&cfg.llm, "offline").unwrap());
    let memory = MemoryServices {
        embedder: None,
        archivist: Arc::new(maas::archivist::Archivist::new(
            db.pool(),
            llm,
            cfg.clone(),
            "app-test".into(),
        )),
    };
    App::new(cfg, db.pool(), notifier, memory, shutdown.clone()).0
}

/// The caller of `tok`, as every door authenticates it.
async fn caller(app: &App, tok: &str) -> (maas::app::Caller, Principal) {
    let caller = maas::app::Caller::of_token(tok);
    let who = app.authenticate(caller).await.unwrap().expect("a live token is known");
    (caller, who)
}

fn refused<T: std::fmt::Debug>(r: Result<T, AppError>) -> AppError {
    r.expect_err("refused")
}

/// Follows request `id` of `tenant` until it is terminal.
async fn follow_to_end(app: &App, id: Uuid, tenant: Uuid) -> RequestState {
    let sub = app.hub.subscribe(Target::Request(id), 16);
    let mut follower = Follower::new(app.pool.clone(), sub).for_tenant(tenant);
    let mut state = follower
        .current()
        .await
        .unwrap()
        .pop()
        .expect("the request is the tenant's");
    let deadline = tokio::time::Instant::now() + GENEROUS;
    while !state.is_terminal() {
        let next = tokio::time::timeout_at(deadline, follower.next())
            .await
            .unwrap_or_else(|_| panic!("request {id} not terminal in time; last {state:?}"));
        for frame in next.expect("the hub runs").unwrap() {
            if let Frame::State(s) = frame {
                state = s;
            }
        }
    }
    state
}

#[tokio::test]
async fn the_application_layer_serves_a_caller_with_no_door() {
    let db = TestDb::new().await;
    let _maasd = start(&db, Opts::default()).await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    let submitter = token(&c, "app-layer", "bound", "submit").await;
    let reader = token(&c, "app-layer", "reader", "read").await;
    let stranger = token(&c, "app-other", "other", "read").await;
    c.execute("UPDATE api_tokens SET user_id = $1 WHERE name = 'bound'", &[&user])
        .await
        .unwrap();
    c.execute(
        "UPDATE tenants SET requests_per_minute = 2 WHERE name = 'app-layer'",
        &[],
    )
    .await
    .unwrap();
    let shutdown = CancellationToken::new();
    let app = app_on(&db, &shutdown);

    // Who calls, and what it may do.
    let (_, who) = caller(&app, &submitter).await;
    assert_eq!((who.scope, who.user, who.limited), (Scope::Submit, Some(user), true));
    assert!(
        app.authenticate(maas::app::Caller::of_token("maas_not_a_token"))
            .await
            .unwrap()
            .is_none()
    );
    let e = refused(who.require(Need::ReadUser));
    assert_eq!((e.kind, e.code.as_str()), (Kind::Forbidden, "scope_required"));
    let e = refused(memory::user(&app, &who, Uuid::new_v4(), "user_id").await);
    assert_eq!((e.kind, e.code.as_str()), (Kind::Forbidden, "user_not_allowed"));
    assert!(e.message.starts_with("user_id:"), "names the field: {}", e.message);
    let e = refused(input::query_text("query", "  "));
    assert_eq!((e.kind, e.code.as_str()), (Kind::Unprocessable, "empty_field"));

    // Submitting: the key replays, a reused key is refused, the limit holds.
    let req = NewRequest {
        user_id: user,
        thread_id: None,
        query: "My sister Ana lives in Lisbon. Where does my sister live?",
        callback_url: None,
        debug: false,
        tenant_id: who.tenant,
        metadata: None,
        stream: false,
        clarify: None,
        review: false,
    };
    let (id, replayed) = submit::enqueue(&app, &who, &req, Some("k-1")).await.unwrap();
    assert!(!replayed);
    assert_eq!(
        submit::enqueue(&app, &who, &req, Some("k-1")).await.unwrap(),
        (id, true)
    );
    let other = NewRequest {
        query: "something else",
        ..req.clone()
    };
    let e = refused(submit::enqueue(&app, &who, &other, Some("k-1")).await);
    assert_eq!(
        (e.kind, e.code.as_str()),
        (Kind::Unprocessable, "idempotency_key_reused")
    );
    submit::enqueue(&app, &who, &other, None).await.unwrap();
    let e = refused(submit::enqueue(&app, &who, &other, None).await);
    assert_eq!((e.kind, e.code.as_str()), (Kind::TooMany, "requests_per_minute"));
    assert!(e.retry_after_secs().is_some_and(|s| s >= 1), "{e:?}");

    // Following it to its end, as a long-poll and MCP's `ask` do.
    let done = follow_to_end(&app, id, who.tenant).await;
    assert_eq!(done.stage, Status::Completed, "{done:?}");
    assert!(done.answer.as_deref().is_some_and(|a| !a.is_empty()), "{done:?}");
    let (_, outsider) = caller(&app, &stranger).await;
    let sub = app.hub.subscribe(Target::Request(id), 4);
    let mut theirs = Follower::new(app.pool.clone(), sub).for_tenant(outsider.tenant);
    assert!(
        theirs.current().await.unwrap().is_empty(),
        "another tenant sees nothing"
    );

    // A user's memory: the reader finds the turn; the searches are capped.
    let (key, reading) = caller(&app, &reader).await;
    let shown = memory::user(&app, &reading, user, "user_id").await.unwrap();
    let search = maas::users::Search {
        query: "sister Lisbon",
        ..Default::default()
    };
    let place = app.searches.enter(key).unwrap();
    let found = memory::search(&app, shown, search, place).await.unwrap();
    assert_eq!(found.user_id, user);
    assert!(
        found.hits.iter().any(|h| h.content.contains("Lisbon")),
        "{:?}",
        found.hits
    );
    let mut held = Vec::new();
    let e = loop {
        match app.searches.enter(key) {
            Ok(p) if held.len() < 10_000 => held.push(p),
            Ok(_) => panic!("no cap on searches per token"),
            Err(e) => break e,
        }
    };
    assert_eq!((e.kind, e.code.as_str()), (Kind::TooMany, "too_many_searches"));
    assert_eq!(held.len(), app.cfg.http.max_searches_per_token);
    shutdown.cancel();
}
