//! The operator console in a real headless Chromium against a real
//! `maasd` and PostgreSQL: pages render, live parts change without a
//! reload, actions land in `operator_actions`. Each test keeps a
//! screenshot under `target/console-screenshots/`; with
//! `MAAS_CONSOLE_DOCS=1` the README's screenshots in `docs/` are
//! refreshed from them.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::browser::Browser;
use crate::support::cli::{NO_ENV, maasctl_async};
use crate::support::daemon::Opts;
use crate::support::db::{TestDb, value};

async fn submit(api: &Api, body: Value) -> Uuid {
    let resp = api.submit(&body).await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let v: Value = resp.json().await.unwrap();
    v["request_id"].as_str().unwrap().parse().unwrap()
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

    b.goto(&api.url("/console")).await;
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
