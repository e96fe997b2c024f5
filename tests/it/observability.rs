//! What an on-call engineer reads, against a real `maasd`: every
//! series the alerts and the dashboard need is exported once a request, a callback and an
//! archive run happened; every series the shipped dashboard
//! (`docs/grafana/maas.json`) and alert rules (`docs/prometheus/alerts.yml`)
//! query exists; the rules pass `promtool check rules` and `promtool test
//! rules`; and one request's JSON log lines all carry its `request_id`.

use std::path::Path;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::api::{Api, accepted};
use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{TestDb, value};
use crate::support::metrics::{metric, samples};
use crate::support::ops::wait_status;
use crate::support::{GENEROUS, count, wait_until};

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The series name of a sample key (`name{...}` → `name`).
fn name_of(series: &str) -> &str {
    series.split('{').next().unwrap_or(series)
}

/// The sum of every sample of `name` whose labels contain all of `labels`.
fn total(text: &str, name: &str, labels: &[&str]) -> f64 {
    samples(text)
        .iter()
        .filter(|(s, _)| name_of(s) == name && labels.iter().all(|l| s.contains(l)))
        .map(|(_, v)| v)
        .sum()
}

/// Every `maas_…` identifier in `text`.
fn series_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("maas_") {
        let start = i + at;
        let boundary = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(text.len(), |n| start + n);
        if boundary {
            out.push(text[start..end].to_owned());
        }
        i = end;
    }
    out.sort();
    out.dedup();
    out
}

/// Every `expr` string of a Grafana dashboard, wherever it is nested.
fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| exprs(i, out)),
        _ => {}
    }
}

/// A callback receiver answering 204 to everything; returns its URL.
async fn receiver() -> String {
    let app = Router::new().route("/hook", post(|| async { StatusCode::NO_CONTENT }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/hook")
}

/// A URL nothing listens on (a port bound, then closed).
async fn dead_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/hook")
}

/// A daemon that refreshes its gauges every second, delivers callbacks
/// (one attempt each), archives on a one-second schedule, and fails every
/// query containing `boom`.
async fn busy_daemon(db: &TestDb) -> Api {
    let opts = Opts::default()
        .env("MAAS_HTTP__METRICS_REFRESH_SECS", 1)
        .env("MAAS_CALLBACKS__SECRET", "observability")
        // The receiver listens on loopback, which callbacks refuse unless allowed.
        .env("MAAS_CALLBACKS__ALLOW_NETWORKS", "127.0.0.0/8, ::1")
        .env("MAAS_CALLBACKS__POLL_SECS", 1)
        .env("MAAS_CALLBACKS__MAX_ATTEMPTS", 1)
        .env("MAAS_CALLBACKS__TIMEOUT_SECS", 2)
        .env("MAAS_ARCHIVIST__SCHEDULE", "* * * * * *")
        .env("MAAS_ARCHIVIST__MIN_PENDING", 1)
        .env("MAAS_ARCHIVIST__COOLDOWN_SECS", 0)
        .env("MAAS_LLM__OFFLINE__FAIL_WHEN_QUERY_CONTAINS", "boom");
    Api::start(db, opts).await
}

/// Drives a request over HTTP, one failing request, a delivered and a dead
/// callback, and an archive run; returns the page scraped once their
/// series show.
async fn drive(db: &TestDb, api: &Api) -> String {
    let c = db.client().await;
    let user = Uuid::new_v4();
    let id = api
        .submit_accepted(&json!({"user_id": user, "query": "what did I say about Lisbon?"}))
        .await;
    let hook = receiver().await;
    let insert = "INSERT INTO pipeline_runs (user_id, user_query, callback_url) VALUES ($1, $2, $3) RETURNING id";
    let called: Uuid = value(&c, insert, &[&user, &"call me back", &hook]).await;
    let dead: Uuid = value(&c, insert, &[&Uuid::new_v4(), &"nobody listens", &dead_url().await]).await;
    let failing: Uuid = value(&c, insert, &[&Uuid::new_v4(), &"boom", &None::<String>]).await;
    for (id, want) in [
        (id, "COMPLETED"),
        (called, "COMPLETED"),
        (dead, "COMPLETED"),
        (failing, "FAILED"),
    ] {
        wait_status(&c, id, want).await;
    }
    wait_until(GENEROUS, "one callback delivered and one dead", || async {
        count(&c, "SELECT count(*) FROM callback_outbox WHERE state = 'delivered'").await == 1
            && count(&c, "SELECT count(*) FROM callback_outbox WHERE state = 'dead'").await == 1
    })
    .await;
    let scrape = || async { api.get("/metrics").await.text().await.unwrap() };
    wait_until(
        GENEROUS,
        "the series of the request, callbacks and archive run",
        || async {
            let page = scrape().await;
            total(&page, "maas_archivist_records_total", &[]) >= 1.0
                && metric(&page, "maas_callbacks_dead") == Some(1.0)
                && metric(&page, "maas_callback_deliveries_total{outcome=\"delivered\"}") == Some(1.0)
                && metric(&page, "maas_archivist_last_run_timestamp_seconds").is_some()
                && total(&page, "maas_table_rows", &["table=\"lsm_storage\""]) >= 1.0
                && total(&page, "maas_requests_failed_total", &[]) >= 1.0
        },
    )
    .await;
    scrape().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_daemon_exports_every_on_call_series_and_all_the_dashboard_and_rules_query() {
    let db = TestDb::new().await;
    let api = busy_daemon(&db).await;
    let page = drive(&db, &api).await;
    every_on_call_series_is_exported(&page);
    the_dashboard_queries_only_exported_series(&page);
    the_alert_rules_use_only_exported_series(&page);
}

/// Whether `page` exports a series named `name` (any labels).
fn exports(page: &str, name: &str) -> bool {
    samples(page).keys().any(|s| name_of(s) == name)
}

/// The series an on-call engineer reads, each named, with the figures of
/// the driven requests, callbacks and archive run.
fn every_on_call_series_is_exported(page: &str) {
    let page = page.to_owned();
    let has = |n: &str| exports(&page, n);
    for table in ["pipeline_runs", "raw_logs", "lsm_storage"] {
        for g in ["maas_table_rows", "maas_table_bytes"] {
            let s = format!("{g}{{table=\"{table}\"}}");
            assert!(metric(&page, &s).is_some(), "{s} missing:\n{page}");
        }
    }
    assert!(total(&page, "maas_table_bytes", &["table=\"pipeline_runs\""]) > 0.0);
    assert!(
        total(&page, "maas_analyses_total", &["needs_context="]) >= 3.0,
        "{page}"
    );
    assert!(total(&page, "maas_contexts_total", &[]) >= 3.0, "{page}");
    assert!(
        total(&page, "maas_context_tokens_count", &["part=\"total\""]) >= 3.0,
        "{page}"
    );
    assert!(has("maas_context_tokens_bucket") && has("maas_context_tokens_sum"));
    // Retries per stage: the failing request's analyze attempts.
    assert!(
        metric(&page, "maas_stage_retries_total{stage=\"analyze\"}").unwrap_or(0.0) >= 1.0,
        "{page}"
    );
    assert!(metric(&page, "maas_stage_retries_total{stage=\"respond\"}").is_some());
    assert!(
        total(
            &page,
            "maas_stage_failures_total",
            &["stage=\"analyze\"", "outcome=\"failed\""]
        ) >= 1.0,
        "{page}"
    );
    // The claim loop's polls: processed, empty, error (at zero), and their duration.
    for result in ["processed", "empty", "error"] {
        assert!(has("maas_claim_polls_total") && page.contains(&format!("result=\"{result}\"")));
    }
    assert!(total(&page, "maas_claim_polls_total", &["result=\"processed\""]) >= 1.0);
    assert!(total(&page, "maas_claim_poll_duration_seconds_count", &[]) >= 1.0);
    // The memory the assemble stages read, timed.
    assert!(
        total(&page, "maas_memory_search_duration_seconds_count", &["result=\"ok\""]) >= 1.0,
        "{page}"
    );
    assert!(
        metric(
            &page,
            "maas_memory_search_duration_seconds_bucket{result=\"ok\",le=\"0.001\"}"
        )
        .is_some(),
        "millisecond buckets: {page}"
    );
    // Callbacks: delivered, dead, the dead-letter gauge.
    assert_eq!(
        metric(&page, "maas_callback_deliveries_total{outcome=\"dead\"}"),
        Some(1.0)
    );
    assert!(has("maas_callback_delivery_duration_seconds_bucket"));
    assert!(has("maas_callbacks_pending") && has("maas_callbacks_oldest_pending_seconds"));
    // Archivist runs: duration, users, logs, records, failures.
    // (The failing request's user fails to archive too: the fault marker is in its turn.)
    assert!(
        total(&page, "maas_archivist_runs_total", &["trigger=\"cron\""]) >= 1.0,
        "{page}"
    );
    assert!(total(&page, "maas_archivist_run_duration_seconds_count", &[]) >= 1.0);
    assert!(total(&page, "maas_archivist_users_total", &["outcome=\"archived\""]) >= 1.0);
    assert!(total(&page, "maas_archivist_logs_total", &[]) >= 2.0);
    assert!(metric(&page, "maas_archivist_failures_total").is_some());
    assert!(metric(&page, "maas_archivist_last_run_failures").is_some());
    assert_eq!(metric(&page, "maas_archivist_enabled"), Some(1.0));
    // The gauges the alert rules use.
    for s in [
        "maas_backlog_oldest_due_seconds{status=\"NEW\"}",
        "maas_leases_expired",
        "maas_notification_queue_usage",
    ] {
        assert!(metric(&page, s).is_some(), "{s} missing:\n{page}");
    }
}

/// Every series the dashboard queries exists.
fn the_dashboard_queries_only_exported_series(page: &str) {
    let text = std::fs::read_to_string(root().join("docs/grafana/maas.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut queries = Vec::new();
    exprs(&dashboard, &mut queries);
    assert!(queries.len() >= 15, "the dashboard has its panels: {}", queries.len());
    let mut queried = Vec::new();
    for q in &queries {
        let found = series_names(q);
        assert!(!found.is_empty(), "a query that names no maas series: {q}");
        queried.extend(found);
    }
    let missing: Vec<&String> = queried.iter().filter(|n| !exports(page, n)).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries series /metrics lacks: {missing:?}\n{page}"
    );
}

/// Every series the alert rules use exists.
fn the_alert_rules_use_only_exported_series(page: &str) {
    let rules = std::fs::read_to_string(root().join("docs/prometheus/alerts.yml")).unwrap();
    let used = series_names(&rules);
    assert!(used.len() >= 10, "{used:?}");
    let missing: Vec<&String> = used.iter().filter(|n| !exports(page, n)).collect();
    assert!(
        missing.is_empty(),
        "the alert rules use series /metrics lacks: {missing:?}\n{page}"
    );
}

/// `promtool`, or `None` where the `prometheus` package is not installed
/// (bin/test installs it and sets `MAAS_REQUIRE_PROMTOOL`, so there it must
/// be found, as under CI).
fn promtool() -> Option<&'static str> {
    let found = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some("promtool");
    }
    crate::support::missing(
        Some("MAAS_REQUIRE_PROMTOOL"),
        "promtool not found (install Debian's `prometheus` package to check the alert rules)",
    );
    None
}

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let Some(promtool) = promtool() else { return };
    let dir = root().join("docs/prometheus");
    for args in [["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]] {
        let out = std::process::Command::new(promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}:\n{}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every rule says what it means and what to do, naming a maasctl command.
    let rules = std::fs::read_to_string(dir.join("alerts.yml")).unwrap();
    let alerts = rules.matches("- alert:").count();
    assert!(alerts >= 12, "{alerts} alerts");
    assert_eq!(rules.matches("summary:").count(), alerts, "a summary per alert");
    assert_eq!(rules.matches("action:").count(), alerts, "an action per alert");
    for block in rules.split("- alert:").skip(1) {
        assert!(block.contains("maasctl "), "an alert names no maasctl command:{block}");
    }
    // And its unit tests cover every alert.
    let tests = std::fs::read_to_string(dir.join("alerts_test.yml")).unwrap();
    for name in rules
        .split("- alert:")
        .skip(1)
        .filter_map(|b| b.split_whitespace().next())
    {
        assert!(
            tests.contains(&format!("alertname: {name}")),
            "no unit test fires {name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_of_a_requests_path_carries_its_request_id_in_json_logs() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let opts = Opts::default()
        .env("MAAS_LOG_FORMAT", "json")
        .env("RUST_LOG", "info,maas=debug")
        .env("MAAS_CALLBACKS__SECRET", "traces")
        .env("MAAS_CALLBACKS__ALLOW_NETWORKS", "127.0.0.0/8, ::1")
        .env("MAAS_CALLBACKS__POLL_SECS", 1);
    let mut d = Maasd::spawn(&db.url, opts);
    let addr = d.http_addr(GENEROUS).await;
    let mut ids = submit_over_http(addr, 3).await;
    let hook = receiver().await;
    let called: Uuid = value(
        &c,
        "INSERT INTO pipeline_runs (user_id, user_query, callback_url) VALUES (gen_random_uuid(), 'trace my callback', $1) RETURNING id",
        &[&hook],
    )
    .await;
    ids.push(called);
    for id in &ids {
        wait_status(&c, *id, "COMPLETED").await;
    }
    wait_until(GENEROUS, "the callback is delivered and logged", || async {
        d.log_text().contains("callback delivered")
    })
    .await;
    let log = d.log_text();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    for id in &ids {
        the_requests_lines_carry_its_id(&lines, *id);
    }
    let callback = called.to_string();
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "callback delivered" && l["request_id"] == callback.as_str()),
        "the callback's line carries its request_id"
    );
    d.kill();
}

/// Submits `n` requests over HTTP to `addr`; their ids.
async fn submit_over_http(addr: std::net::SocketAddr, n: usize) -> Vec<Uuid> {
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..n {
        let resp = http
            .post(format!("http://{addr}/api/query"))
            .json(&json!({"user_id": Uuid::new_v4(), "query": format!("trace me {i}")}))
            .send()
            .await
            .unwrap();
        ids.push(accepted(resp).await);
    }
    ids
}

/// Every line that mentions request `id` names it as request_id, and its
/// stages and model calls (through their span) each logged a line.
fn the_requests_lines_carry_its_id(lines: &[Value], id: Uuid) {
    let id = id.to_string();
    let mine: Vec<&Value> = lines.iter().filter(|l| l["request_id"] == id.as_str()).collect();
    for l in lines {
        if l.to_string().contains(&id) {
            assert_eq!(
                l["request_id"],
                id.as_str(),
                "a line about {id} without its request_id: {l}"
            );
        }
    }
    for stage in ["analyze", "assemble", "respond"] {
        assert!(
            mine.iter().any(|l| l["stage"] == stage),
            "no {stage} line for {id}:\n{}",
            mine.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
        );
    }
    // The model calls inside the stages carry it through their span.
    for role in ["analyzer", "responder"] {
        assert!(
            mine.iter()
                .any(|l| l["message"] == "llm call completed" && l["role"] == role),
            "no {role} call logged for {id}"
        );
    }
}

/// The unauthenticated `/metrics` names no tenant: the per-tenant token
/// series is left out unless `metrics.public_tenants` is set, and then it
/// is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_name_no_tenant_unless_public_tenants_is_set() {
    let db = TestDb::new().await;
    let c = db.client().await;
    for public in [false, true] {
        let opts = Opts::default().env("MAAS_METRICS__PUBLIC_TENANTS", public);
        let api = Api::start(&db, opts).await;
        let id = api
            .submit_accepted(&json!({"user_id": Uuid::new_v4(), "query": "count my tokens"}))
            .await;
        wait_status(&c, id, "COMPLETED").await;
        let scrape = || async {
            api.http
                .get(api.url("/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        };
        if public {
            wait_until(GENEROUS, "the tenant's tokens are shown", || async {
                scrape().await.contains("tenant=\"default\"")
            })
            .await;
        } else {
            wait_until(GENEROUS, "the request's tokens are counted", || async {
                total(&scrape().await, "maas_llm_tokens_total", &[]) > 0.0
            })
            .await;
            // The per-tenant count is made off the attempt's path: give it time.
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            let page = scrape().await;
            assert!(
                !page.contains("tenant=") && !page.contains("maas_llm_tenant_tokens_total"),
                "{page}"
            );
        }
    }
}

/// The statuses a request passes inside one statement are announced with
/// `"passed": true`, and no daemon claims on them: requests that each went
/// from ANALYZING to COMPLETED in one statement (the offline provider
/// answers within the fused respond's wait) wake neither the assemble nor
/// the respond stage. Woken, each would run an empty claim per request.
/// The sweep is far away; the start-up pass and the listener's catch-up
/// sweep may each land after the first reading, one poll per stage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_passed_inside_one_statement_wake_no_idle_stage() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = Api::start(
        &db,
        Opts {
            sweep_secs: 600,
            ..Opts::default()
        },
    )
    .await;
    let polls = |page: &str, stage: &str, result: &str| {
        total(
            page,
            "maas_claim_polls_total",
            &[&format!("stage=\"{stage}\""), &format!("result=\"{result}\"")],
        )
    };
    wait_until(GENEROUS, "every stage's first pass", || async {
        let page = api.metrics().await;
        ["analyze", "assemble", "respond"]
            .iter()
            .all(|s| polls(&page, s, "empty") >= 1.0)
    })
    .await;
    let before = api.metrics().await;
    let n = 20;
    for i in 0..n {
        let id: Uuid = value(
            &c,
            "INSERT INTO pipeline_runs (user_id, user_query) VALUES (gen_random_uuid(), $1) RETURNING id",
            &[&format!("one at a time #{i}")],
        )
        .await;
        wait_status(&c, id, "COMPLETED").await;
    }
    let page = api.metrics().await;
    // Fused: the assemble and respond stages claimed nothing, and every
    // request has its three steps.
    for stage in ["assemble", "respond"] {
        assert_eq!(polls(&page, stage, "processed"), 0.0, "{stage}: {page}");
        let more = polls(&page, stage, "empty") - polls(&before, stage, "empty");
        assert!(more <= 1.0, "{stage} polled {more} times for {n} requests:\n{page}");
    }
    assert_eq!(count(&c, "SELECT count(*) FROM pipeline_steps").await, 3 * n);
}
