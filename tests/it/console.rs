//! The operator console in a real headless Chromium against a real
//! `maasd` and PostgreSQL: pages render, live parts change without a
//! reload, actions land in `operator_actions`. Each test keeps a
//! screenshot under `target/console-screenshots/`; with
//! `MAAS_CONSOLE_DOCS=1` the screenshots of docs/console.md are
//! refreshed from them.

use std::path::Path;
use std::time::Duration;

use fantoccini::Locator;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::browser::Browser;
use crate::support::cli::{NO_ENV, maasctl_async};
use crate::support::console::{Console, browser_logged_in, csrf_at, csrf_of, plain_client};
use crate::support::daemon::Opts;
use crate::support::db::{TestDb, by_name, value};
use crate::support::fake_llm::{Api as FakeApi, FakeLlm, Reply};
use crate::support::ops::{status_of, wait_status};

async fn submit(api: &Api, body: Value) -> Uuid {
    api.submit_accepted(&body).await
}

/// Copies a screenshot into `docs/` when asked to (`MAAS_CONSOLE_DOCS=1`).
fn to_docs(shot: &Path, name: &str) {
    if std::env::var("MAAS_CONSOLE_DOCS").is_ok_and(|v| v == "1") {
        std::fs::copy(shot, Path::new(env!("CARGO_MANIFEST_DIR")).join("docs").join(name)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_overview_shows_a_request_reach_completed_without_a_reload() {
    let Some(b) = Browser::start().await else { return };
    let db = TestDb::new().await;
    let api = Api::start(&db, Opts::default()).await;
    let c = db.client().await;
    // Paused, so the request waits where the page can see it.
    let (code, _, err) = maasctl_async(&db.url, &["pause", "--reason", "console test"], NO_ENV).await;
    assert_eq!(code, 0, "{err}");

    b.goto_live(&api.url("/console")).await;
    assert!(
        b.text("#pause").await.starts_with("Paused"),
        "the overview shows the pause"
    );
    b.wait_js("the live stream is open", "return document.body.dataset.live === 'on';")
        .await;
    b.mark().await;

    let id = submit(
        &api,
        json!({ "user_id": Uuid::new_v4(), "query": "what does the console show?" }),
    )
    .await;
    b.wait_js(
        "the overview shows one NEW request waiting",
        "const r = document.querySelector('#backlog tr[data-status=NEW]'); return !!r && r.cells[1].textContent.trim() === '1';",
    )
    .await;

    let (code, _, err) = maasctl_async(&db.url, &["resume", "--reason", "console test"], NO_ENV).await;
    assert_eq!(code, 0, "{err}");
    b.wait_js(
        "the request shows as COMPLETED among the finished",
        &format!("return !!document.querySelector('#recent tr[data-id=\"{id}\"][data-status=COMPLETED]');"),
    )
    .await;
    b.wait_js(
        "the pause is gone from the page",
        "return document.querySelector('#pause').textContent.trim() === 'Running';",
    )
    .await;
    assert!(b.same_page().await, "the page was not reloaded");
    let status: String = value(&c, "SELECT status FROM pipeline_runs WHERE id = $1", &[&id]).await;
    assert_eq!(status, "COMPLETED");
    let shot = b.screenshot("overview").await;
    to_docs(&shot, "console-overview.png");
    b.close().await;
}

const KEY: &str = "sk-console-test";

fn analysis() -> String {
    json!({
        "needs_context": false, "context_type": "none", "time_scope": "none",
        "search_keywords": ["console"], "context_found": null,
    })
    .to_string()
}

/// The rows the list shows: (id, status).
async fn listed(b: &Browser) -> Vec<(String, String)> {
    let v = b
        .js("return [...document.querySelectorAll('#rows tr.row')].map(r => [r.dataset.id, r.dataset.status]);")
        .await;
    serde_json::from_value(v).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_requests_filter_then_retry_a_failed_one_and_cancel_a_slow_one() {
    let Some(b) = Browser::start().await else { return };
    let db = TestDb::new().await;
    let fake = FakeLlm::start().await;
    let opts = Opts::default()
        .env("MAAS_LLM_PROVIDER", "openai")
        .env("OPENAI_BASE_URL", fake.openai_base_url())
        .env("OPENAI_API_KEY", KEY);
    let api = Api::start(&db, opts).await;
    let c = db.client().await;

    // The fake's default reply is no analysis: this one fails.
    fake.push(FakeApi::OpenAi, Reply::bad_request(FakeApi::OpenAi));
    let failed = submit(
        &api,
        json!({ "user_id": Uuid::new_v4(), "query": "alpha: the provider refuses" }),
    )
    .await;
    wait_status(&c, failed, "FAILED").await;
    fake.set_default(analysis(), None);
    let done = submit(
        &api,
        json!({ "user_id": Uuid::new_v4(), "query": "beta: this one completes" }),
    )
    .await;
    wait_status(&c, done, "COMPLETED").await;

    // The list, filtered by status and by text in the form.
    b.goto_live(&api.url("/console/requests")).await;
    let all = listed(&b).await;
    assert_eq!(all.len(), 2, "{all:?}");
    b.c.find(Locator::Css("#f-status"))
        .await
        .unwrap()
        .select_by_value("FAILED")
        .await
        .unwrap();
    b.click("#f-apply").await;
    b.wait_js(
        "the list is filtered by status",
        "return location.search.includes('status=FAILED') && document.body.dataset.live === 'on';",
    )
    .await;
    assert_eq!(listed(&b).await, vec![(failed.to_string(), "FAILED".to_owned())]);
    b.c.find(Locator::Css("#f-status"))
        .await
        .unwrap()
        .select_by_value("")
        .await
        .unwrap();
    b.fill("#f-text", "BETA").await;
    b.click("#f-apply").await;
    b.wait_js(
        "the list is filtered by text",
        "return location.search.includes('text=BETA') && document.body.dataset.live === 'on';",
    )
    .await;
    assert_eq!(listed(&b).await, vec![(done.to_string(), "COMPLETED".to_owned())]);
    b.screenshot("requests-filtered").await;

    // New rows appear live on the unfiltered list.
    b.goto_live(&api.url("/console/requests")).await;
    b.mark().await;
    let third = submit(
        &api,
        json!({ "user_id": Uuid::new_v4(), "query": "gamma: shows up live" }),
    )
    .await;
    b.wait_js(
        "the new request appears in the list",
        &format!("return !!document.querySelector('#rows tr[data-id=\"{third}\"]');"),
    )
    .await;
    assert!(b.same_page().await, "the list was not reloaded");
    wait_status(&c, third, "COMPLETED").await;

    // Open the failed one and retry it, with a reason.
    b.goto_live(&api.url("/console/requests?status=FAILED")).await;
    b.click(&format!("#rows tr[data-id=\"{failed}\"] a")).await;
    b.wait_js(
        "the request page is open",
        "return !!document.querySelector('#timeline') && document.body.dataset.live === 'on';",
    )
    .await;
    let timeline = b.text("#timeline").await;
    assert!(
        timeline.contains("bad_request"),
        "the timeline names the error class: {timeline}"
    );
    b.fill("#retry-reason", "provider fixed").await;
    b.click("#retry").await;
    b.wait_js(
        "the retried request shows COMPLETED",
        "return document.querySelector('#status').textContent.trim() === 'COMPLETED';",
    )
    .await;
    wait_status(&c, failed, "COMPLETED").await;
    let (actor, reason): (String, String) = {
        let r = c
            .query_one(
                "SELECT actor, reason FROM operator_actions WHERE run_id = $1 AND action = 'retry'",
                &[&failed],
            )
            .await
            .unwrap();
        by_name!(r, "actor", "reason")
    };
    assert_eq!((actor.as_str(), reason.as_str()), ("local", "provider fixed"));
    let shot = b.screenshot("request-retried").await;
    to_docs(&shot, "console-request.png");

    // A slow one: cancel it while its analyze waits on the provider.
    fake.set_default(analysis(), Some(Duration::from_secs(120)));
    let slow = submit(
        &api,
        json!({ "user_id": Uuid::new_v4(), "query": "delta: slow, to be cancelled" }),
    )
    .await;
    wait_status(&c, slow, "ANALYZING").await;
    b.goto_live(&api.url(&format!("/console/requests/{slow}"))).await;
    assert_eq!(b.text("#status").await, "ANALYZING");
    b.fill("#cancel-reason", "stuck on the provider").await;
    b.click("#cancel").await;
    b.wait_js(
        "the page shows CANCELLED",
        "return document.querySelector('#status').textContent.trim() === 'CANCELLED';",
    )
    .await;
    assert_eq!(status_of(&c, slow).await, "CANCELLED");
    let logged: i64 = value(
        &c,
        "SELECT count(*) FROM operator_actions WHERE run_id = $1 AND action = 'cancel' AND actor = 'local' AND reason = 'stuck on the provider'",
        &[&slow],
    )
    .await;
    assert_eq!(logged, 1);
    assert!(b.text("#actions-log").await.contains("stuck on the provider"));
    b.screenshot("request-cancelled").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_needs_a_token_login_and_a_csrf_token_for_every_action() {
    let db = TestDb::new().await;
    let api = Api::start(&db, Opts::default().env("MAAS_API_TOKENS", "tok-console")).await;
    let c = db.client().await;
    let http = plain_client();
    let id = {
        let mut a = Api {
            token: Some("tok-console".into()),
            ..api
        };
        let id = submit(&a, json!({ "user_id": Uuid::new_v4(), "query": "behind a token" })).await;
        wait_status(&c, id, "COMPLETED").await;
        a.token = None;
        (id, a)
    };
    let (id, api) = id;

    // No session: pages send to the login, actions are refused.
    let r = http.get(api.url("/console")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/console/login");
    let r = http
        .post(api.url(&format!("/console/requests/{id}/cancel")))
        .header("origin", api.url(""))
        .form(&[("reason", "x"), ("csrf", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // A wrong token is refused; the right one gives an HttpOnly, SameSite=Strict cookie.
    let r = http
        .post(api.url("/console/login"))
        .header("origin", api.url(""))
        .form(&[("token", "nope")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = http
        .post(api.url("/console/login"))
        .header("origin", api.url(""))
        .form(&[("token", "tok-console")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_owned();
    let page = http
        .get(api.url(&format!("/console/requests/{id}")))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    // A forged cookie (its last character changed, whatever it was) is no
    // session.
    let last = if session.ends_with('0') { '1' } else { '0' };
    let forged = format!("{}{last}", &session[..session.len() - 1]);
    let r = http
        .get(api.url("/console"))
        .header("cookie", &forged)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    // An action without the CSRF token is refused and changes nothing.
    let fresh = {
        let a = Api {
            token: Some("tok-console".into()),
            ..api
        };
        let user = Uuid::new_v4();
        let (code, _, err) = maasctl_async(&db.url, &["pause", "--reason", "hold it"], NO_ENV).await;
        assert_eq!(code, 0, "{err}");
        let id = submit(&a, json!({ "user_id": user, "query": "to cancel" })).await;
        (id, Api { token: None, ..a })
    };
    let (fresh, api) = fresh;
    let r = http
        .post(api.url(&format!("/console/requests/{fresh}/cancel")))
        .header("origin", api.url(""))
        .header("cookie", &session)
        .form(&[("reason", "no csrf")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(status_of(&c, fresh).await, "NEW");

    // In the browser: log in, cancel with the form (it carries the token).
    let Some(b) = browser_logged_in(&api, "tok-console").await else {
        return;
    };
    assert_eq!(
        b.js("return document.cookie.includes('maas_console');").await,
        json!(false),
        "HttpOnly"
    );
    b.goto_live(&api.url(&format!("/console/requests/{fresh}"))).await;
    b.fill("#cancel-reason", "cancelled after login").await;
    b.click("#cancel").await;
    b.wait_js(
        "the page shows CANCELLED",
        "return document.querySelector('#status').textContent.trim() === 'CANCELLED';",
    )
    .await;
    assert_eq!(status_of(&c, fresh).await, "CANCELLED");
    b.screenshot("login-then-cancel").await;
    b.close().await;
}

/// With tokens configured (so no loopback guard runs first), a login with a
/// valid token and an action with a valid session and CSRF token are
/// refused by the `Origin` check alone: each request below is the one that
/// succeeds at the end, but for its `Origin`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_refuses_a_foreign_origin_by_the_origin_check_alone() {
    let db = TestDb::new().await;
    let api = Api::start(&db, Opts::default().env("MAAS_API_TOKENS", "tok-origin")).await;
    let c = db.client().await;
    let http = plain_client();
    let foreign = "https://evil.example";
    let login = |origin: Option<&'static str>| {
        let mut post = http.post(api.url("/console/login")).form(&[("token", "tok-origin")]);
        if let Some(origin) = origin {
            post = post.header("origin", origin);
        }
        post.send()
    };
    // The login: a valid token from a foreign page, or with no Origin at all.
    for (origin, says) in [
        (Some(foreign), "Origin `https://evil.example` is not this server"),
        (None, "needs an Origin header"),
    ] {
        let r = login(origin).await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{origin:?}");
        assert!(r.headers().get("set-cookie").is_none(), "no session for {origin:?}");
        let body = r.text().await.unwrap();
        assert!(body.contains(says), "{origin:?}: {body}");
    }
    let r = http
        .post(api.url("/console/login"))
        .header("origin", api.url(""))
        .form(&[("token", "tok-origin")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let session = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();

    // An action with the session and its valid CSRF token, from a foreign page.
    let (code, _, err) = maasctl_async(&db.url, &["pause", "--reason", "hold it"], NO_ENV).await;
    assert_eq!(code, 0, "{err}");
    let submitter = Api {
        token: Some("tok-origin".into()),
        ..api
    };
    let id = submit(
        &submitter,
        json!({ "user_id": Uuid::new_v4(), "query": "cancel me from afar" }),
    )
    .await;
    let api = Api {
        token: None,
        ..submitter
    };
    let path = format!("/console/requests/{id}/cancel");
    let csrf = csrf_at(&http, api.url(&format!("/console/requests/{id}")), Some(&session)).await;
    assert!(!csrf.is_empty(), "the page carries the CSRF token");
    let cancel = |origin: &str| {
        http.post(api.url(&path))
            .header("cookie", &session)
            .header("origin", origin)
            .form(&[("reason", "from another site"), ("csrf", csrf.as_str())])
            .send()
    };
    let r = cancel(foreign).await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("Origin `https://evil.example` is not this server"),
        "{body}"
    );
    assert_eq!(status_of(&c, id).await, "NEW", "nothing changed");
    let actions: i64 = value(&c, "SELECT count(*) FROM operator_actions WHERE action = 'cancel'", &[]).await;
    assert_eq!(actions, 0);
    // The same request from the console's own origin goes through.
    let r = cancel(&api.url("")).await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::SEE_OTHER,
        "{}",
        r.text().await.unwrap_or_default()
    );
    assert_eq!(status_of(&c, id).await, "CANCELLED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_read_only_mode_hides_and_refuses_actions() {
    let db = TestDb::new().await;
    let console = Console::open(&db, Opts::default().env("MAAS_HTTP__CONSOLE_READ_ONLY", "true")).await;
    let api = &console.api;
    let c = db.client().await;
    let (code, _, err) = maasctl_async(&db.url, &["pause", "--reason", "hold it"], NO_ENV).await;
    assert_eq!(code, 0, "{err}");
    let id = submit(api, json!({ "user_id": Uuid::new_v4(), "query": "look, do not touch" })).await;
    let page = console.page(&format!("/console/requests/{id}")).await;
    assert!(page.contains("read-only mode"), "{page}");
    assert!(!page.contains("id=\"cancel\""), "no cancel button in read-only mode");
    // Even with the right CSRF token, the action is refused.
    let csrf = csrf_of(&page);
    let r = console
        .post_as(
            None,
            &format!("/console/requests/{id}/cancel"),
            &[("reason", "try anyway"), ("csrf", &csrf)],
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.text().await.unwrap().contains("read-only"));
    assert_eq!(status_of(&c, id).await, "NEW");
    let Some(b) = console.browser().await else { return };
    b.goto_live(&api.url(&format!("/console/requests/{id}"))).await;
    assert!(b.text("#act").await.contains("read-only mode"));
    b.screenshot("read-only").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_steps_a_debug_request_through_with_continue() {
    let Some(b) = Browser::start().await else { return };
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default()).await;
    let id: Uuid = value(
        &c,
        "INSERT INTO pipeline_runs (user_id, user_query, debug) VALUES (gen_random_uuid(), 'step by step', true) RETURNING id",
        &[],
    )
    .await;
    for (resting, next) in [("ANALYZED", "READY"), ("READY", "COMPLETED")] {
        wait_status(&c, id, resting).await;
        b.goto_live(&api.url(&format!("/console/requests/{id}"))).await;
        b.wait_js(
            &format!("the page shows {resting}"),
            &format!("return document.querySelector('#status').textContent.trim() === '{resting}';"),
        )
        .await;
        b.fill("#continue-reason", &format!("looked at {resting}")).await;
        b.click("#continue").await;
        b.wait_js(
            &format!("the page shows {next}"),
            &format!("return document.querySelector('#status').textContent.trim() === '{next}';"),
        )
        .await;
    }
    wait_status(&c, id, "COMPLETED").await;
    let reasons: Vec<String> = crate::support::db::column(
        &c,
        "SELECT reason FROM operator_actions WHERE run_id = $1 AND action = 'continue' AND actor = 'local' ORDER BY id",
        &[&id],
    )
    .await;
    assert_eq!(reasons, ["looked at ANALYZED", "looked at READY"]);
    b.screenshot("debug-continued").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_memory_page_searches_a_users_memory_and_archives_now() {
    let Some(b) = Browser::start().await else { return };
    let db = TestDb::new().await;
    let c = db.client().await;
    // The offline provider; no schedule, so only the button archives;
    // records searched too (off by default).
    let api = Api::start(
        &db,
        Opts::default()
            .env("MAAS_ARCHIVIST__ENABLED", "false")
            .env("MAAS_MEMORY__RECORDS", 3),
    )
    .await;
    let user = Uuid::new_v4();
    let id = submit(
        &api,
        json!({ "user_id": user, "query": "my sister is moving to Lisbon next spring" }),
    )
    .await;
    wait_status(&c, id, "COMPLETED").await;
    c.execute(
        "INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, tags, summary, raw_log_ids)
         VALUES ($1, now() - interval '2 days', now() - interval '1 day', '{garden}', 'The user grows tomatoes on a balcony.', '{}')",
        &[&user],
    )
    .await
    .unwrap();
    let pending: i64 = value(
        &c,
        "SELECT logged_seq - archived_seq FROM archive_marks WHERE user_id = $1",
        &[&user],
    )
    .await;
    assert!(pending >= 1, "the request left turns to archive");

    // From the request's page to its user's memory.
    b.goto_live(&api.url(&format!("/console/requests/{id}"))).await;
    b.click("#user-link").await;
    b.wait_js(
        "the memory page is open",
        "return !!document.querySelector('#archive-state') && document.body.dataset.live === 'on';",
    )
    .await;
    assert_eq!(b.text("#pending").await, pending.to_string());
    assert_eq!(
        b.js("return document.querySelectorAll('#turns tr.turn').length;").await,
        json!(pending)
    );
    assert!(b.text("#records").await.contains("tomatoes"));

    // The search box runs the pipeline's retrieval and shows scores.
    b.fill("#q", "tomatoes balcony").await;
    b.click("#search-go").await;
    b.wait_js(
        "the search shows a scored record",
        "return [...document.querySelectorAll('#hits tr.hit')].some(r => r.dataset.kind === 'record' && parseFloat(r.dataset.score) > 0);",
    )
    .await;
    b.fill("#q", "Lisbon").await;
    b.click("#search-go").await;
    b.wait_js(
        "the search shows a scored turn",
        "return location.search.includes('q=Lisbon') && [...document.querySelectorAll('#hits tr.hit')].some(r => r.dataset.kind === 'turn' && parseFloat(r.dataset.score) > 0);",
    )
    .await;
    let shot = b.screenshot("memory-search").await;
    to_docs(&shot, "console-memory.png");

    // Archive now: the pending turns become a record, recorded with the reason.
    let records_before: i64 = value(&c, "SELECT count(*) FROM lsm_storage WHERE user_id = $1", &[&user]).await;
    b.fill("#archive-reason", "support ticket 42").await;
    b.click("#archive").await;
    b.wait_js(
        "the page shows nothing pending",
        "return !!document.querySelector('#pending') && document.querySelector('#pending').textContent.trim() === '0';",
    )
    .await;
    let (left, records): (i64, i64) = {
        let r = c
            .query_one(
                "SELECT (SELECT logged_seq - archived_seq FROM archive_marks WHERE user_id = $1) AS pending,
                        (SELECT count(*) FROM lsm_storage WHERE user_id = $1) AS records",
                &[&user],
            )
            .await
            .unwrap();
        by_name!(r, "pending", "records")
    };
    assert_eq!(left, 0, "every pending turn was archived");
    assert!(records > records_before, "a record was written");
    let covered: i64 = value(
        &c,
        "SELECT count(*) FROM lsm_storage s, unnest(s.raw_log_ids) t WHERE s.user_id = $1",
        &[&user],
    )
    .await;
    assert_eq!(covered, pending, "the new records cover the pending turns");
    let logged: i64 = value(
        &c,
        "SELECT count(*) FROM operator_actions WHERE action = 'archive_run' AND actor = 'local'
           AND reason = 'support ticket 42' AND detail ->> 'user_id' = $1::uuid::text AND detail ->> 'outcome' = 'archived'",
        &[&user],
    )
    .await;
    assert_eq!(logged, 1);
    assert!(b.text("#actions-log").await.contains("support ticket 42"));
    assert_eq!(
        b.js("return document.querySelectorAll('#turns tr.turn').length;").await,
        json!(0)
    );
    b.screenshot("memory-archived").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_prompts_page_diffs_two_versions_and_activates_one() {
    let Some(b) = Browser::start().await else { return };
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(&db, Opts::default()).await;
    // A second Analyzer version, kept inactive: the first with one line
    // changed and one added.
    let v1: String = value(
        &c,
        "SELECT prompt_template FROM system_prompts WHERE role_name = 'Analyzer' AND is_active",
        &[],
    )
    .await;
    let first = v1.lines().next().unwrap().to_owned();
    let v2 = format!(
        "{}\nAlways answer in JSON, even when unsure.",
        v1.replacen(&first, "You are the careful analyzer of a memory service.", 1)
    );
    let new: i32 = value(
        &c,
        "INSERT INTO system_prompts (role_name, version, prompt_template, is_active)
         SELECT 'Analyzer', max(version) + 1, $1, false FROM system_prompts WHERE role_name = 'Analyzer'
         RETURNING version",
        &[&v2],
    )
    .await;

    b.goto_live(&api.url("/console")).await;
    b.click("header a[href='/console/prompts']").await;
    b.wait_js(
        "the prompts page is open",
        "return !!document.querySelector('#roles') && document.body.dataset.live === 'on';",
    )
    .await;
    b.c.find(Locator::Css("#diff-b"))
        .await
        .unwrap()
        .select_by_value(&new.to_string())
        .await
        .unwrap();
    b.c.find(Locator::Css("#diff-a"))
        .await
        .unwrap()
        .select_by_value(&(new - 1).to_string())
        .await
        .unwrap();
    b.click("#diff-go").await;
    b.wait_js(
        "the diff shows the changed and the added lines",
        "const rows = [...document.querySelectorAll('#diff tr')]; \
         return rows.some(r => r.dataset.tag === 'ins' && r.innerText.includes('Always answer in JSON')) \
             && rows.some(r => r.dataset.tag === 'ins' && r.innerText.includes('careful analyzer')) \
             && rows.some(r => r.dataset.tag === 'del');",
    )
    .await;
    let shot = b.screenshot("prompts-diff").await;
    to_docs(&shot, "console-prompts.png");

    b.fill(&format!("#activate-reason-{new}"), "roll forward").await;
    b.click(&format!("#activate-{new}")).await;
    b.wait_js(
        "the page shows the new version active",
        &format!("return document.querySelector('#versions tr[data-version=\"{new}\"]')?.dataset.active === 'yes';"),
    )
    .await;
    let active: i32 = value(
        &c,
        "SELECT version FROM system_prompts WHERE role_name = 'Analyzer' AND is_active",
        &[],
    )
    .await;
    assert_eq!(active, new);
    let logged: i64 = value(
        &c,
        "SELECT count(*) FROM operator_actions WHERE action = 'prompt_activate' AND actor = 'local'
           AND reason = 'roll forward' AND detail ->> 'role' = 'Analyzer' AND (detail ->> 'version')::int = $1
           AND (detail ->> 'previous')::int = $1 - 1",
        &[&new],
    )
    .await;
    assert_eq!(logged, 1);
    assert!(b.text("#actions-log").await.contains("roll forward"));
    b.screenshot("prompts-activated").await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_archive_now_and_prompt_activation_need_csrf_and_are_refused_read_only() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    c.execute(
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content) VALUES ($1, gen_random_uuid(), 'user_query', 'keep me pending')",
        &[&user],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO system_prompts (role_name, version, prompt_template, is_active)
         SELECT 'Assembler', max(version) + 1, 'another assembler', false FROM system_prompts WHERE role_name = 'Assembler'",
        &[],
    )
    .await
    .unwrap();
    let active = || async {
        value::<i32>(
            &c,
            "SELECT version FROM system_prompts WHERE role_name = 'Assembler' AND is_active",
            &[],
        )
        .await
    };
    let before = active().await;
    let pending = || async {
        value::<i64>(
            &c,
            "SELECT logged_seq - archived_seq FROM archive_marks WHERE user_id = $1",
            &[&user],
        )
        .await
    };
    let http = plain_client();
    let archive = format!("/console/users/{user}/archive");
    let activate = format!("/console/prompts/Assembler/{}/activate", before + 1);

    let api = Api::start(&db, Opts::default().env("MAAS_ARCHIVIST__ENABLED", "false")).await;
    for path in [&archive, &activate] {
        // No CSRF token, then a wrong one: refused before anything runs.
        for form in [
            vec![("reason", "no csrf")],
            vec![("reason", "bad csrf"), ("csrf", "0000")],
        ] {
            let r = http
                .post(api.url(path))
                .header("origin", api.url(""))
                .form(&form)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path} {form:?}");
            assert!(r.text().await.unwrap().contains("csrf"));
        }
    }
    // The right token but no reason: refused too.
    let csrf = csrf_at(&http, api.url(&format!("/console/users/{user}")), None).await;
    assert!(!csrf.is_empty(), "the page carries the token");
    let r = http
        .post(api.url(&archive))
        .header("origin", api.url(""))
        .form(&[("csrf", csrf.as_str()), ("reason", " ")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("reason"));
    assert_eq!(pending().await, 1);
    assert_eq!(active().await, before);
    let actions: i64 = value(
        &c,
        "SELECT count(*) FROM operator_actions WHERE action IN ('archive_run', 'prompt_activate')",
        &[],
    )
    .await;
    assert_eq!(actions, 0, "nothing refused was recorded");
    drop(api);

    // Read-only: no button, and refused even with the right token.
    let api = Api::start(
        &db,
        Opts::default()
            .env("MAAS_ARCHIVIST__ENABLED", "false")
            .env("MAAS_HTTP__CONSOLE_READ_ONLY", "true"),
    )
    .await;
    let page = http
        .get(api.url(&format!("/console/users/{user}")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("read-only mode") && !page.contains("id=\"archive\""),
        "{page}"
    );
    let prompts_page = http
        .get(api.url("/console/prompts?role=Assembler"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!prompts_page.contains("id=\"activate-"), "no activate button read-only");
    let csrf = csrf_of(&prompts_page);
    for path in [&archive, &activate] {
        let r = http
            .post(api.url(path))
            .header("origin", api.url(""))
            .form(&[("csrf", csrf.as_str()), ("reason", "try anyway")])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path}");
        assert!(r.text().await.unwrap().contains("read-only"));
    }
    assert_eq!(pending().await, 1);
    assert_eq!(active().await, before);
}

/// A chart's `data-*` figure, as a number.
async fn chart(b: &Browser, id: &str, attr: &str) -> f64 {
    let v = b
        .js(&format!(
            "const e = document.querySelector('svg#{id}'); return e ? Number(e.dataset.{attr}) : -1;"
        ))
        .await;
    v.as_f64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_overview_charts_the_last_hour_and_counts_model_calls_per_provider() {
    let Some(b) = Browser::start().await else { return };
    let db = TestDb::new().await;
    let fake = FakeLlm::start().await;
    let opts = Opts::default()
        .env("MAAS_LLM_PROVIDER", "openai")
        .env("OPENAI_BASE_URL", fake.openai_base_url())
        .env("OPENAI_API_KEY", KEY);
    let api = Api::start(&db, opts).await;
    let c = db.client().await;
    fake.push(FakeApi::OpenAi, Reply::bad_request(FakeApi::OpenAi));
    let failed = submit(&api, json!({ "user_id": Uuid::new_v4(), "query": "one fails" })).await;
    wait_status(&c, failed, "FAILED").await;
    fake.set_default(analysis(), None);
    let done = submit(&api, json!({ "user_id": Uuid::new_v4(), "query": "one completes" })).await;
    wait_status(&c, done, "COMPLETED").await;

    b.goto_live(&api.url("/console")).await;
    // Throughput: a point per bucket, the newest with the finished requests.
    assert_eq!(chart(&b, "chart-throughput", "points").await, 24.0);
    assert!(chart(&b, "chart-throughput", "max").await > 0.0);
    // Failure rate: one of two failed in the newest bucket.
    assert_eq!(chart(&b, "chart-failures", "points").await, 1.0);
    assert_eq!(chart(&b, "chart-failures", "max").await, 50.0);
    // Latency: p50 and p99 of the stages that ran.
    assert!(chart(&b, "chart-latency", "points").await >= 2.0);
    let circles = b
        .js("return document.querySelectorAll('svg#chart-latency circle').length;")
        .await;
    assert!(circles.as_u64().unwrap() >= 2, "{circles}");
    // The provider line: this daemon's counters.
    let calls = b
        .js("const r = document.querySelector('#providers tr[data-provider=openai]'); return r ? Number(r.dataset.calls) : -1;")
        .await;
    let steps_with_model: i64 = value(
        &c,
        "SELECT count(*) FROM pipeline_steps WHERE model IS NOT NULL OR error_class IS NOT NULL",
        &[],
    )
    .await;
    assert!(calls.as_f64().unwrap() >= 2.0, "openai calls: {calls}");
    assert!(b.text("#providers").await.contains("openai"));
    assert!(steps_with_model >= 1);
    assert!(
        b.js("return document.querySelectorAll('#models tr.model').length;")
            .await
            .as_u64()
            .unwrap()
            >= 1,
        "the per-model lines from the steps"
    );

    // The charts refresh with the live overview, without a reload.
    b.mark().await;
    let max_before = chart(&b, "chart-throughput", "max").await;
    for i in 0..3 {
        let id = submit(&api, json!({ "user_id": Uuid::new_v4(), "query": format!("more {i}") })).await;
        wait_status(&c, id, "COMPLETED").await;
    }
    b.wait_js(
        "the throughput chart shows the new requests",
        &format!("return Number(document.querySelector('svg#chart-throughput').dataset.max) > {max_before};"),
    )
    .await;
    assert!(b.same_page().await, "the page was not reloaded");
    let shot = b.screenshot("overview-charts").await;
    to_docs(&shot, "console-charts.png");
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_memory_page_pages_pending_turns_by_keyset() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let user = Uuid::new_v4();
    c.execute(
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content)
         SELECT $1, gen_random_uuid(), 'user_query', 'turn number ' || g FROM generate_series(1, 60) g",
        &[&user],
    )
    .await
    .unwrap();
    let api = Api::start(&db, Opts::default().env("MAAS_ARCHIVIST__ENABLED", "false")).await;
    let http = plain_client();
    let get = |path: String| {
        let http = http.clone();
        let url = api.url(&path);
        async move {
            let r = http.get(url).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            r.text().await.unwrap()
        }
    };
    let first = get(format!("/console/users/{user}")).await;
    assert_eq!(first.matches("class=\"turn\"").count(), 50);
    assert!(first.contains(">turn number 60<") && !first.contains(">turn number 10<"));
    let href = first
        .split("id=\"turns-older\" href=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a link to the older pending turns")
        .replace("&amp;", "&");
    let second = get(href).await;
    assert_eq!(second.matches("class=\"turn\"").count(), 10);
    assert!(second.contains(">turn number 10<") && !second.contains(">turn number 11<"));
    assert!(!second.contains("id=\"turns-older\""), "the last page");
    // A position that is not a number is refused, naming the field.
    let r = http
        .get(api.url(&format!("/console/users/{user}?turns_before=x")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("turns_before"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_now_from_maasctl_is_recorded_as_from_the_console() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let (by_console, by_cli) = (Uuid::new_v4(), Uuid::new_v4());
    for user in [by_console, by_cli] {
        c.execute(
            "INSERT INTO raw_logs (user_id, thread_id, message_type, content) VALUES ($1, gen_random_uuid(), 'user_query', 'archive me now')",
            &[&user],
        )
        .await
        .unwrap();
    }
    // No schedule: only the two actions archive.
    let api = Api::start(&db, Opts::default().env("MAAS_ARCHIVIST__ENABLED", "false")).await;
    let http = plain_client();
    let csrf = csrf_at(&http, api.url(&format!("/console/users/{by_console}")), None).await;
    let r = http
        .post(api.url(&format!("/console/users/{by_console}/archive")))
        .header("origin", api.url(""))
        .form(&[("csrf", csrf.as_str()), ("reason", "one path")])
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::SEE_OTHER,
        "{}",
        r.text().await.unwrap_or_default()
    );
    let user = by_cli.to_string();
    let args = ["archivist", "run", "--user", user.as_str(), "--reason", "one path"];
    let (code, out, err) = maasctl_async(&db.url, &args, NO_ENV).await;
    assert_eq!(code, 0, "{out}{err}");

    let rows = c
        .query(
            "SELECT actor, reason, detail FROM operator_actions WHERE action = 'archive_run' ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let rows: Vec<(String, Option<String>, Value)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    assert_eq!(rows.len(), 2, "one row per action: {rows:?}");
    let (console, cli) = (&rows[0], &rows[1]);
    assert_eq!((console.0.as_str(), cli.0.as_str()), ("local", "night-shift"));
    assert_eq!(
        (console.1.as_deref(), cli.1.as_deref()),
        (Some("one path"), Some("one path"))
    );
    let keys = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
    assert_eq!(keys(&console.2), keys(&cli.2), "the same detail");
    for (detail, user) in [(&console.2, by_console), (&cli.2, by_cli)] {
        assert_eq!(detail["user_id"], user.to_string(), "{detail}");
        assert_eq!(detail["outcome"], "archived", "{detail}");
        assert_eq!(detail["turns"], 1, "{detail}");
        assert!(detail["run_id"].is_i64(), "{detail}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_activation_from_maasctl_is_recorded_as_from_the_console() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let first: i32 = value(
        &c,
        "SELECT version FROM system_prompts WHERE role_name = 'Assembler' AND is_active",
        &[],
    )
    .await;
    c.execute(
        "INSERT INTO system_prompts (role_name, version, prompt_template, is_active) VALUES ('Assembler', $1, 'another assembler', false)",
        &[&(first + 1)],
    )
    .await
    .unwrap();
    let api = Api::start(&db, Opts::default().env("MAAS_ARCHIVIST__ENABLED", "false")).await;
    let http = plain_client();
    let csrf = csrf_at(&http, api.url("/console/prompts?role=Assembler"), None).await;
    let r = http
        .post(api.url(&format!("/console/prompts/assembler/{}/activate", first + 1)))
        .header("origin", api.url(""))
        .form(&[("csrf", csrf.as_str()), ("reason", "roll forward")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let back = first.to_string();
    let args = [
        "prompts",
        "activate",
        "assembler",
        back.as_str(),
        "--reason",
        "roll back",
    ];
    let (code, out, err) = maasctl_async(&db.url, &args, NO_ENV).await;
    assert_eq!(code, 0, "{out}{err}");

    let rows = c
        .query(
            "SELECT actor, detail FROM operator_actions WHERE action = 'prompt_activate' ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let rows: Vec<(String, Value)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        rows,
        vec![
            (
                "local".to_owned(),
                json!({"role": "Assembler", "version": first + 1, "previous": first})
            ),
            (
                "night-shift".to_owned(),
                json!({"role": "Assembler", "version": first, "previous": first + 1})
            ),
        ]
    );
}

// ---- tenants and operators in the browser -----------------------------------

/// Runs `maasctl ARGS` against `db` and returns what it printed (a token,
/// for `tokens create`).
async fn maasctl_ok(db: &TestDb, args: &[&str]) -> String {
    let (code, out, err) = maasctl_async(&db.url, args, NO_ENV).await;
    assert_eq!(code, 0, "maasctl {args:?}: {out}{err}");
    out.trim().to_owned()
}

/// Two tenants as an operator makes them: `shop` and `acme` with
/// `maasctl tenants add`, a `submit` token each, and one request each
/// sent with it. Returns the daemon and (shop's request, acme's request).
async fn two_tenants_with_a_request_each(db: &TestDb) -> (Api, Uuid, Uuid) {
    let api = crate::support::tenants::start(db, Opts::default()).await;
    let mut reqs = Vec::new();
    for tenant in ["shop", "acme"] {
        maasctl_ok(db, &["tenants", "add", tenant]).await;
        let name = format!("{tenant}-app");
        let app = maasctl_ok(
            db,
            &["tokens", "create", &name, "--tenant", tenant, "--scope", "submit"],
        )
        .await;
        let query = format!("{tenant}: where is my order?");
        reqs.push(crate::support::tenants::submit_ok(&api, &app, Uuid::new_v4(), Uuid::new_v4(), &query).await);
    }
    (api, reqs[0], reqs[1])
}

/// Logs in through the login form with `token` and waits for the live page
/// the login lands on, at `landing` (`/console` for an operator token, the
/// requests list for a tenant's).
async fn log_in_with_the_form(b: &Browser, api: &Api, token: &str, landing: &str) {
    b.goto(&api.url("/console/login")).await;
    b.fill("#token", token).await;
    b.click("#login").await;
    b.wait_js(
        &format!("the live page {landing} after login"),
        &format!("return location.pathname === '{landing}' && document.body.dataset.live === 'on';"),
    )
    .await;
}

/// [`two_tenants_with_a_request_each`], then `b` logged in through the
/// form with a `read` token of `shop` (not an operator token): a tenant's
/// session lands on its requests list, not on the overview.
async fn shop_reader_logged_in(b: &Browser, db: &TestDb) -> (Api, Uuid, Uuid) {
    let (api, shop_req, acme_req) = two_tenants_with_a_request_each(db).await;
    let reader = maasctl_ok(
        db,
        &["tokens", "create", "shop-reader", "--tenant", "shop", "--scope", "read"],
    )
    .await;
    log_in_with_the_form(b, &api, &reader, "/console/requests").await;
    (api, shop_req, acme_req)
}

/// Opens `url` and returns the HTTP status and text of the page it shows.
async fn status_and_text(b: &Browser, url: &str) -> (u64, String) {
    b.goto(url).await;
    b.wait_js("the page is loaded", "return document.readyState === 'complete';")
        .await;
    let v = b
        .js("return [performance.getEntriesByType('navigation')[0].responseStatus, document.body.innerText];")
        .await;
    (v[0].as_u64().unwrap_or(0), v[1].as_str().unwrap_or("").to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_the_browser_shows_a_tenants_read_token_only_its_tenant() {
    let Some(b) = Browser::start().await else { return };
    let db = TestDb::new().await;
    let (api, shop_req, acme_req) = shop_reader_logged_in(&b, &db).await;
    let ids: Vec<String> = listed(&b).await.into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, vec![shop_req.to_string()], "only shop's request is listed");
    assert!(!b.text("body").await.contains("acme:"), "nothing of acme's on the page");
    assert_eq!(
        b.js("return !!document.querySelector('header a[href=\"/console\"]');")
            .await,
        json!(false),
        "no link to the overview"
    );
    b.screenshot("tenant-requests").await;

    // Its own request opens; acme's is the 404 page.
    b.goto_live(&api.url(&format!("/console/requests/{shop_req}"))).await;
    assert!(!b.text("#timeline").await.is_empty());
    let (status, text) = status_and_text(&b, &api.url(&format!("/console/requests/{acme_req}"))).await;
    assert_eq!(status, 404, "{text}");
    assert!(text.contains(&format!("no request {acme_req}")), "{text}");
    assert!(!text.contains("acme:"), "{text}");
    b.screenshot("tenant-other-request").await;

    // The overview is refused with a 403 page that names the way in;
    // `/console` itself sends the session to its list.
    let (status, text) = status_and_text(&b, &api.url("/console/overview")).await;
    assert_eq!(status, 403, "{text}");
    assert!(
        text.contains("sees only tenant `shop`") && text.contains("--all-tenants"),
        "{text}"
    );
    b.screenshot("tenant-overview-refused").await;
    b.goto(&api.url("/console")).await;
    b.wait_js(
        "the overview sends a tenant's session to its list",
        "return location.pathname === '/console/requests' && document.body.dataset.live === 'on';",
    )
    .await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_the_browser_shows_an_operator_token_every_tenant() {
    let Some(b) = Browser::start().await else { return };
    let db = TestDb::new().await;
    let (api, shop_req, acme_req) = two_tenants_with_a_request_each(&db).await;
    let oncall = maasctl_ok(
        &db,
        &["tokens", "create", "oncall", "--scope", "operate", "--all-tenants"],
    )
    .await;

    log_in_with_the_form(&b, &api, &oncall, "/console").await;
    assert!(
        b.js("return !!document.querySelector('#backlog');").await == json!(true),
        "the overview is shown"
    );
    b.goto_live(&api.url("/console/requests")).await;
    let mut ids: Vec<String> = listed(&b).await.into_iter().map(|(id, _)| id).collect();
    ids.sort();
    let mut want = vec![shop_req.to_string(), acme_req.to_string()];
    want.sort();
    assert_eq!(ids, want, "both tenants' requests are listed");
    b.screenshot("operator-requests").await;
    for id in [shop_req, acme_req] {
        let (status, text) = status_and_text(&b, &api.url(&format!("/console/requests/{id}"))).await;
        assert_eq!(status, 200, "{text}");
    }
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_the_browser_logout_ends_the_session() {
    let Some(b) = Browser::start().await else { return };
    let db = TestDb::new().await;
    let (api, shop_req, _) = shop_reader_logged_in(&b, &db).await;
    let session =
        b.c.get_named_cookie("maas_console")
            .await
            .unwrap_or_else(|e| panic!("the session cookie: {e}"));
    let session = format!("maas_console={}", session.value());
    assert!(listed(&b).await.iter().any(|(id, _)| *id == shop_req.to_string()));

    b.click("header form[action=\"/console/logout\"] button").await;
    b.wait_js(
        "the login page after logout",
        "return location.pathname === '/console/login';",
    )
    .await;
    b.goto(&api.url("/console/requests")).await;
    b.wait_js(
        "the requests list sends back to the login",
        "return location.pathname === '/console/login' && !!document.querySelector('#token');",
    )
    .await;
    b.screenshot("logged-out").await;
    // The session ended on the server, not only in the browser: its cookie,
    // sent again, is no session either.
    let console = Console {
        api,
        http: plain_client(),
        session: Some(session),
        token: None,
    };
    let r = console.get_as(None, "/console/requests").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/console/login");
    b.close().await;
}
