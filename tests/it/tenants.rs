//! Tenants: database tokens with a tenant and a scope,
//! each tenant's users a namespace of their own, per-tenant limits, the
//! per-tenant token metric and callback secret, `maasctl tenants|tokens`.
//! Real daemon, real PostgreSQL, real `maasctl`.
//!
//! Size: one file per subject, as the other modules here; each test
//! stands alone (its own database and daemon) and shares the few helpers
//! at the top.

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::api::Api;
use crate::support::console::{csrf_of, login as console_login, plain_client};
use crate::support::daemon::Opts;
use crate::support::db::{TestDb, by_name};
use crate::support::tenants::{ADMIN, get, send, start, submit, submit_ok, token, with_tenants};

/// Another tenant's request `id` is refused as no request at all: 404 with
/// the code `not_found` naming the id (a missing route says `no_route`).
fn assert_not_found(status: StatusCode, body: &Value, id: Uuid, what: &str) {
    assert_eq!(status, StatusCode::NOT_FOUND, "{what}: {body}");
    assert_eq!(body["code"], "not_found", "{what}: {body}");
    assert_eq!(body["error"], format!("no request {id}"), "{what}: {body}");
}

async fn finished_context(api: &Api, tok: &str, id: Uuid) -> String {
    let (s, state) = get(api, tok, &format!("/api/query/{id}/status?wait=60s&include=context")).await;
    assert_eq!(s, StatusCode::OK, "{state}");
    assert_eq!(state["status"], "completed", "{state}");
    state["context"].as_str().unwrap_or_default().to_owned()
}

/// Two tenants name the same user (one UUID): each sees only its own
/// requests (another's id is 404, in status, context, stream and the
/// operator routes), its own memory and export, and one tenant's turns
/// never reach the other's assembled context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_with_the_same_user_id_never_see_each_other() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = start(&db, Opts::default()).await;
    let a = token(&c, "acme", "acme-app", "admin").await;
    let b = token(&c, "bravo", "bravo-app", "admin").await;
    let (user, thread) = (Uuid::new_v4(), Uuid::new_v4());

    let a1 = submit_ok(&api, &a, user, thread, "My locker code is ALPHA-7781; remember it.").await;
    finished_context(&api, &a, a1).await;
    let b1 = submit_ok(&api, &b, user, thread, "What is my locker code?").await;
    let b_context = finished_context(&api, &b, b1).await;
    assert!(
        !b_context.contains("ALPHA-7781"),
        "tenant bravo's context holds acme's turn: {b_context}"
    );
    // The control: acme's own follow-up in the thread does see it.
    let a2 = submit_ok(&api, &a, user, thread, "What is my locker code?").await;
    let a_context = finished_context(&api, &a, a2).await;
    assert!(a_context.contains("ALPHA-7781"), "{a_context}");

    // The stored users differ, and each request keeps the tenant's own id.
    let rows: Vec<(Uuid, Option<Uuid>, String)> = c
        .query(
            "SELECT r.user_id, r.tenant_user_id, t.name FROM pipeline_runs r JOIN tenants t ON t.id = r.tenant_id WHERE r.id = ANY($1) ORDER BY t.name",
            &[&vec![a1, b1]],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| by_name!(r, "user_id", "tenant_user_id", "name"))
        .collect();
    assert_eq!(rows.len(), 2);
    assert_ne!(rows[0].0, rows[1].0, "two tenants' users share a stored id");
    assert!(rows.iter().all(|r| r.1 == Some(user) && r.0 != user), "{rows:?}");

    // Another tenant's request is 404 everywhere; the default tenant
    // (a configured token) does not see tenants' requests either.
    for (tok, other) in [(&b, a1), (&a, b1), (&ADMIN.to_owned(), a1)] {
        for path in [
            format!("/api/query/{other}/status"),
            format!("/api/query/{other}/status?include=context"),
            format!("/api/query/{other}/events"),
        ] {
            let (s, body) = get(&api, tok, &path).await;
            assert_not_found(s, &body, other, &path);
        }
        for action in ["cancel", "retry", "continue"] {
            let (s, body, _) = send(
                tok,
                api.http
                    .post(api.url(&format!("/api/query/{other}/{action}")))
                    .header("origin", api.url(""))
                    .json(&json!({ "reason": "not mine" })),
            )
            .await;
            assert_not_found(s, &body, other, action);
        }
    }
    // Its own stream works.
    let resp = api
        .http
        .get(api.url(&format!("/api/query/{b1}/events")))
        .bearer_auth(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let text = resp.text().await.unwrap();
    assert!(text.contains(&b1.to_string()) && text.contains("completed"), "{text}");

    // Memory and export: each tenant's own, shown under the tenant's id.
    let (s, mem_a) = get(&api, &a, &format!("/api/users/{user}/memory")).await;
    assert_eq!(s, StatusCode::OK, "{mem_a}");
    assert_eq!(mem_a["user_id"], user.to_string());
    let (s, mem_b) = get(&api, &b, &format!("/api/users/{user}/memory")).await;
    assert_eq!(s, StatusCode::OK, "{mem_b}");
    assert!(mem_a.to_string().contains("ALPHA-7781"), "{mem_a}");
    assert!(!mem_b.to_string().contains("ALPHA-7781"), "{mem_b}");
    let (s, export_b) = get(&api, &b, &format!("/api/users/{user}/export")).await;
    assert_eq!(s, StatusCode::OK, "{export_b}");
    assert_eq!(export_b["user_id"], user.to_string());
    let text = export_b.to_string();
    assert!(
        !text.contains("ALPHA-7781") && !text.contains(&a1.to_string()),
        "{text}"
    );
    assert!(text.contains(&b1.to_string()), "{text}");
    for r in export_b["requests"].as_array().unwrap() {
        assert_eq!(r["user_id"], user.to_string(), "{r}");
    }
    // The default tenant knows no such user, and cannot name another
    // tenant's stored user either (a version-8 id is mapped for it too).
    let (s, body) = get(&api, ADMIN, &format!("/api/users/{user}/memory")).await;
    assert_eq!(
        (s, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_user")),
        "{body}"
    );
    let acme_stored = rows.iter().find(|r| r.2 == "acme").unwrap().0;
    assert_eq!(acme_stored.get_version_num(), 8);
    let (s, body) = get(&api, ADMIN, &format!("/api/users/{acme_stored}/memory")).await;
    assert_eq!(
        (s, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_user")),
        "{body}"
    );
    let d1 = submit_ok(&api, ADMIN, acme_stored, thread, "What is my locker code?").await;
    let d_context = finished_context(&api, ADMIN, d1).await;
    assert!(!d_context.contains("ALPHA-7781"), "{d_context}");
    let (stored, shown): (Uuid, Option<Uuid>) = c
        .query_one(
            "SELECT user_id, tenant_user_id FROM pipeline_runs WHERE id = $1",
            &[&d1],
        )
        .await
        .map(|r| by_name!(r, "user_id", "tenant_user_id"))
        .unwrap();
    assert!(
        stored != acme_stored && shown == Some(acme_stored),
        "{stored} {shown:?}"
    );
    // A plain id of the default tenant is stored as it is.
    let d2 = submit_ok(&api, ADMIN, user, thread, "hello").await;
    let (stored, shown): (Uuid, Option<Uuid>) = c
        .query_one(
            "SELECT user_id, tenant_user_id FROM pipeline_runs WHERE id = $1",
            &[&d2],
        )
        .await
        .map(|r| by_name!(r, "user_id", "tenant_user_id"))
        .unwrap();
    assert_eq!((stored, shown), (user, None));
}

/// Scopes: a route refuses a token whose scope does not allow it with 403
/// naming the scope needed; a revoked or unknown token is 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_are_enforced_and_a_revoked_token_is_refused() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = start(&db, Opts::default()).await;
    let submit_tok = token(&c, "acme", "acme-submit", "submit").await;
    let read_tok = token(&c, "acme", "acme-read", "read").await;
    let operate_tok = token(&c, "acme", "acme-operate", "operate").await;
    let user = Uuid::new_v4();

    let id = submit_ok(&api, &submit_tok, user, Uuid::new_v4(), "hello").await;
    let (s, body) = get(&api, &submit_tok, &format!("/api/query/{id}/status?wait=60s")).await;
    assert_eq!(
        (s, body["status"].as_str()),
        (StatusCode::OK, Some("completed")),
        "{body}"
    );

    let (s, body) = get(&api, &submit_tok, &format!("/api/users/{user}/memory")).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["code"], "scope_required");
    assert!(body["error"].as_str().unwrap().contains("scope read"), "{body}");

    let (s, body, _) = submit(&api, &read_tok, json!({ "user_id": user, "query": "x" })).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    assert!(body["error"].as_str().unwrap().contains("scope submit"), "{body}");
    let (s, body) = get(&api, &read_tok, &format!("/api/users/{user}/memory")).await;
    assert_eq!(s, StatusCode::OK, "{body}");

    for tok in [&submit_tok, &read_tok] {
        let (s, body, _) = send(
            tok,
            api.http
                .post(api.url(&format!("/api/query/{id}/cancel")))
                .header("origin", api.url(""))
                .json(&json!({ "reason": "x" })),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
        assert!(body["error"].as_str().unwrap().contains("scope operate"), "{body}");
    }
    let (s, body, _) = send(&operate_tok, api.http.delete(api.url(&format!("/api/users/{user}")))).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    assert!(body["error"].as_str().unwrap().contains("scope admin"), "{body}");
    let (s, body, _) = send(
        &operate_tok,
        api.http
            .post(api.url(&format!("/api/query/{id}/cancel")))
            .header("origin", api.url(""))
            .json(&json!({ "reason": "x" })),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "operate may cancel (already finished): {body}");

    // Revoked: refused once the cache period (5 s) has passed, not later.
    c.execute("UPDATE api_tokens SET revoked_at = now() WHERE name = 'acme-read'", &[])
        .await
        .unwrap();
    let revoked_at = std::time::Instant::now();
    crate::support::wait_until(
        std::time::Duration::from_secs(15),
        "the revoked token is refused",
        || async { get(&api, &read_tok, &format!("/api/query/{id}/status")).await.0 == StatusCode::UNAUTHORIZED },
    )
    .await;
    assert!(
        revoked_at.elapsed() < std::time::Duration::from_secs(7),
        "{:?}",
        revoked_at.elapsed()
    );
    let (s, _) = get(&api, "maas_not-a-token", &format!("/api/query/{id}/status")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

/// `maasctl tenants add|list|set` and `maasctl tokens create|list|rotate|revoke`
/// through the real CLI: a created token works at once, is never listed,
/// a revoked one is refused, a rotated one is replaced; each is audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maasctl_manages_tenants_and_tokens() {
    use crate::support::cli::maasctl_async;
    const NO: &[(&str, &str)] = &[];
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = start(&db, Opts::default()).await;

    let (code, out, err) = maasctl_async(&db.url, &["tenants", "add", "acme", "--max-in-flight", "50"], NO).await;
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = maasctl_async(&db.url, &["tenants", "add", "Bad Name"], NO).await;
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("tenants_name_form"), "{err}");
    let (code, out, err) = maasctl_async(
        &db.url,
        &[
            "tenants",
            "set",
            "acme",
            "--requests-per-minute",
            "100",
            "--max-in-flight",
            "none",
        ],
        NO,
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = maasctl_async(&db.url, &["--json", "tenants", "list"], NO).await;
    assert_eq!(code, 0);
    let list: Value = serde_json::from_str(&out).unwrap();
    let acme = list.as_array().unwrap().iter().find(|t| t["name"] == "acme").unwrap();
    assert_eq!(
        (acme["requests_per_minute"].as_i64(), acme["max_in_flight"].as_i64()),
        (Some(100), None)
    );

    let (code, out, err) = maasctl_async(
        &db.url,
        &["tokens", "create", "acme-app", "--tenant", "acme", "--scope", "submit"],
        NO,
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let tok = out.trim().to_owned();
    assert!(tok.starts_with("maas_") && tok.len() == 69, "{tok}");
    let (code, _, err) = maasctl_async(
        &db.url,
        &["tokens", "create", "x", "--tenant", "acme", "--scope", "root"],
        NO,
    )
    .await;
    assert_eq!(code, 2);
    assert!(err.contains("--scope") && err.contains("operate"), "{err}");

    let (s, body, _) = submit(&api, &tok, json!({ "user_id": Uuid::new_v4(), "query": "hi" })).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");

    let (code, out, _) = maasctl_async(&db.url, &["tokens", "list"], NO).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("acme-app") && out.contains("submit") && !out.contains(&tok[5..]),
        "{out}"
    );

    // Rotate: the old token stops, the new one works, same scope.
    let (code, out, err) = maasctl_async(&db.url, &["tokens", "rotate", "acme-app", "--tenant", "acme"], NO).await;
    assert_eq!(code, 0, "{out}{err}");
    let rotated = out.trim().to_owned();
    assert!(rotated.starts_with("maas_") && rotated != tok);
    let (s, body, _) = submit(&api, &rotated, json!({ "user_id": Uuid::new_v4(), "query": "hi" })).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");
    crate::support::wait_until(
        std::time::Duration::from_secs(15),
        "the rotated-out token is refused",
        || async {
            submit(&api, &tok, json!({ "user_id": Uuid::new_v4(), "query": "hi" }))
                .await
                .0
                == StatusCode::UNAUTHORIZED
        },
    )
    .await;

    let (code, out, err) = maasctl_async(
        &db.url,
        &["tokens", "revoke", "acme-app", "--tenant", "acme", "--reason", "leaked"],
        NO,
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    crate::support::wait_until(
        std::time::Duration::from_secs(15),
        "the revoked token is refused",
        || async {
            submit(&api, &rotated, json!({ "user_id": Uuid::new_v4(), "query": "hi" }))
                .await
                .0
                == StatusCode::UNAUTHORIZED
        },
    )
    .await;
    let (code, _, _) = maasctl_async(&db.url, &["tokens", "revoke", "acme-app", "--tenant", "acme"], NO).await;
    assert_eq!(code, 1, "nothing live to revoke");
    let (_, out, _) = maasctl_async(&db.url, &["tokens", "list", "--all"], NO).await;
    assert_eq!(out.matches("revoked").count(), 2, "{out}");

    let actions: Vec<(String, String)> = c
        .query(
            "SELECT action, actor FROM operator_actions WHERE action LIKE 'tenant_%' OR action LIKE 'token_%' ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| by_name!(r, "action", "actor"))
        .collect();
    let names: Vec<&str> = actions.iter().map(|a| a.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "tenant_add",
            "tenant_set",
            "token_create",
            "token_revoke",
            "token_create",
            "token_revoke"
        ]
    );
    assert!(actions.iter().all(|a| a.1 == "night-shift"), "{actions:?}");
    let detail: String = c
        .query_one("SELECT string_agg(detail::text, ' ') FROM operator_actions", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        !detail.contains(&tok[5..]) && !detail.contains(&rotated[5..]),
        "{detail}"
    );
}

/// Per-tenant limits: over `requests_per_minute` or `max_in_flight` a
/// submission is 429 with `Retry-After` and names the limit; the count is
/// exact across two daemons submitting at once; another tenant is not
/// affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_give_429_with_retry_after_across_daemons() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let slow = || Opts::default().env("MAAS_LLM__OFFLINE__LATENCY_MS", 60_000);
    let one = start(&db, slow()).await;
    let two = start(&db, slow()).await;
    let rpm = token(&c, "per-minute", "app", "submit").await;
    let flight = token(&c, "in-flight", "app", "submit").await;
    let free = token(&c, "free", "app", "submit").await;
    c.execute(
        "UPDATE tenants SET requests_per_minute = 5 WHERE name = 'per-minute'",
        &[],
    )
    .await
    .unwrap();
    c.execute("UPDATE tenants SET max_in_flight = 2 WHERE name = 'in-flight'", &[])
        .await
        .unwrap();

    // Sixteen submissions at once through two daemons: exactly five pass.
    let mut tries = Vec::new();
    for i in 0..16 {
        let api = if i % 2 == 0 { &one } else { &two };
        tries.push(submit(
            api,
            &rpm,
            json!({ "user_id": Uuid::new_v4(), "query": format!("q{i}") }),
        ));
    }
    let results = futures_util::future::join_all(tries).await;
    let accepted = results.iter().filter(|r| r.0 == StatusCode::ACCEPTED).count();
    assert_eq!(
        accepted,
        5,
        "{:?}",
        results.iter().map(|r| (r.0, r.1.clone())).collect::<Vec<_>>()
    );
    let refused = results.iter().find(|r| r.0 == StatusCode::TOO_MANY_REQUESTS).unwrap();
    assert_eq!(refused.1["code"], "requests_per_minute", "{}", refused.1);
    assert!(
        refused.1["error"].as_str().unwrap().contains("5 requests per minute"),
        "{}",
        refused.1
    );
    let after: u64 = refused.2["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&after), "{after}");

    // In flight: two running requests (a model call takes 60 s) hold the limit.
    for i in 0..2 {
        let (s, body, _) = submit(
            &one,
            &flight,
            json!({ "user_id": Uuid::new_v4(), "query": format!("f{i}") }),
        )
        .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{body}");
    }
    let (s, body, headers) = submit(&two, &flight, json!({ "user_id": Uuid::new_v4(), "query": "f2" })).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["code"], "max_in_flight");
    assert!(body["error"].as_str().unwrap().contains("max_in_flight"), "{body}");
    assert!(headers.contains_key("retry-after"));
    // A finished one frees a place.
    c.execute(
        "UPDATE pipeline_runs SET status = 'CANCELLED', lease_owner = NULL, lease_expires_at = NULL WHERE tenant_id = (SELECT id FROM tenants WHERE name = 'in-flight') AND user_query = 'f0'",
        &[],
    )
    .await
    .unwrap();
    let (s, body, _) = submit(&two, &flight, json!({ "user_id": Uuid::new_v4(), "query": "f3" })).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");

    // A tenant without limits is not limited.
    for i in 0..8 {
        let (s, body, _) = submit(
            &one,
            &free,
            json!({ "user_id": Uuid::new_v4(), "query": format!("x{i}") }),
        )
        .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{body}");
    }
}

/// The tenant's LLM tokens, `maas_llm_tenant_tokens_total{tenant, kind}`,
/// from the attempts' usage: it rises for the tenant that spent them and
/// for no other.
fn tenant_tokens(text: &str, tenant: &str, kind: &str) -> f64 {
    let series = format!("maas_llm_tenant_tokens_total{{tenant=\"{tenant}\",kind=\"{kind}\"}} ");
    let alt = format!("maas_llm_tenant_tokens_total{{kind=\"{kind}\",tenant=\"{tenant}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series).or_else(|| l.strip_prefix(&alt)))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_metric_counts_per_tenant() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let public = Opts::default().env("MAAS_METRICS__PUBLIC_TENANTS", "true");
    let (api, tokens) = with_tenants(&db, public, &["acme", "bravo"]).await;
    let [a, b]: [String; 2] = tokens.try_into().unwrap();
    let metrics = || async { api.get("/metrics").await.text().await.unwrap() };

    for i in 0..2 {
        let id = submit_ok(&api, &a, Uuid::new_v4(), Uuid::new_v4(), &format!("acme question {i}")).await;
        let (_, st) = get(&api, &a, &format!("/api/query/{id}/status?wait=60s")).await;
        assert_eq!(st["status"], "completed", "{st}");
    }
    let spent: i64 = c
        .query_one(
            "SELECT coalesce(sum(s.prompt_tokens), 0)::int8 FROM pipeline_steps s JOIN pipeline_runs r ON r.id = s.run_id JOIN tenants t ON t.id = r.tenant_id WHERE t.name = 'acme' AND s.model IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(spent > 0, "the offline provider reports usage");
    crate::support::wait_until(
        std::time::Duration::from_secs(30),
        "acme's tokens are counted",
        || async { tenant_tokens(&metrics().await, "acme", "prompt") > 0.0 },
    )
    .await;
    let text = metrics().await;
    let counted: Vec<&str> = text.lines().filter(|l| l.contains("tenant_tokens")).collect();
    assert_eq!(tenant_tokens(&text, "acme", "prompt"), spent as f64, "{counted:?}");
    let acme = tenant_tokens(&text, "acme", "prompt");
    assert!(tenant_tokens(&text, "acme", "completion") > 0.0, "{text}");
    assert_eq!(tenant_tokens(&text, "bravo", "prompt"), 0.0, "{text}");

    let id = submit_ok(&api, &b, Uuid::new_v4(), Uuid::new_v4(), "bravo question").await;
    let (_, st) = get(&api, &b, &format!("/api/query/{id}/status?wait=60s")).await;
    assert_eq!(st["status"], "completed", "{st}");
    crate::support::wait_until(
        std::time::Duration::from_secs(30),
        "bravo's tokens are counted",
        || async { tenant_tokens(&metrics().await, "bravo", "prompt") > 0.0 },
    )
    .await;
    let text = metrics().await;
    assert_eq!(
        tenant_tokens(&text, "acme", "prompt"),
        acme,
        "acme's count moved: {text}"
    );
}

/// Callbacks of a tenant with its own `callback_secret` are signed with it
/// (and not with `callbacks.secret`, which still signs the default
/// tenant's); the body names the user by the tenant's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_are_signed_with_the_tenants_secret() {
    use axum::extract::State;
    use std::sync::{Arc, Mutex};
    type Got = Arc<Mutex<Vec<(String, String, axum::body::Bytes)>>>;
    async fn hook(State(got): State<Got>, headers: axum::http::HeaderMap, body: axum::body::Bytes) -> StatusCode {
        let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        got.lock()
            .unwrap()
            .push((h("x-maas-timestamp"), h("x-maas-signature"), body));
        StatusCode::NO_CONTENT
    }
    let got: Got = Arc::default();
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(hook))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    const CONFIG_SECRET: &str = "cb-config-secret-for-tests";
    const ACME_SECRET: &str = "acme-own-callback-secret";
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = start(
        &db,
        Opts::default()
            .env("MAAS_CALLBACKS__SECRET", CONFIG_SECRET)
            .env("MAAS_CALLBACKS__POLL_SECS", 1)
            .env("MAAS_CALLBACKS__ALLOW_NETWORKS", "127.0.0.0/8"),
    )
    .await;
    let (code, out, err) = crate::support::cli::maasctl_async(
        &db.url,
        &["tenants", "add", "acme", "--callback-secret", ACME_SECRET],
        &[] as &[(&str, &str)],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let a = token(&c, "acme", "app", "submit").await;
    let user = Uuid::new_v4();
    let (s, body, _) = submit(
        &api,
        &a,
        json!({ "user_id": user, "query": "acme", "callback_url": url }),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");
    let (s, body, _) = submit(
        &api,
        ADMIN,
        json!({ "user_id": user, "query": "default", "callback_url": url }),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");
    crate::support::wait_until(crate::support::GENEROUS, "both callbacks arrive", || async {
        got.lock().unwrap().len() >= 2
    })
    .await;
    let got = got.lock().unwrap().clone();
    for (ts, sig, body) in &got {
        let ts: i64 = ts.parse().unwrap();
        let v: Value = serde_json::from_slice(body).unwrap();
        let id: Uuid = v["id"].as_str().unwrap().parse().unwrap();
        let tenant: String = c
            .query_one(
                "SELECT t.name FROM pipeline_runs r JOIN tenants t ON t.id = r.tenant_id WHERE r.id = $1",
                &[&id],
            )
            .await
            .unwrap()
            .get(0);
        let (own, other) = if tenant == "acme" {
            (ACME_SECRET, CONFIG_SECRET)
        } else {
            (CONFIG_SECRET, ACME_SECRET)
        };
        assert!(maas::callbacks::verify(own.as_bytes(), ts, body, sig), "{v}");
        assert!(!maas::callbacks::verify(other.as_bytes(), ts, body, sig), "{v}");
        assert_eq!(v["user_id"], user.to_string(), "{v}");
    }
    let signed_by_acme = got
        .iter()
        .filter(|(ts, sig, body)| maas::callbacks::verify(ACME_SECRET.as_bytes(), ts.parse().unwrap(), body, sig))
        .count();
    assert_eq!(signed_by_acme, 1);
}

/// The console logs in with the same tokens: `read` views but may not act,
/// `operate` acts, `submit` and another tenant's token are refused at the
/// login (403, naming why), a revoked token's session ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_takes_database_tokens_by_scope() {
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = start(&db, Opts::default().env("MAAS_LLM__OFFLINE__LATENCY_MS", 60_000)).await;
    let read = token(&c, "default", "viewer", "read").await;
    let operate = token(&c, "default", "oncall", "operate").await;
    let submit_only = token(&c, "default", "app", "submit").await;
    let other = token(&c, "acme", "acme-admin", "admin").await;
    let http = plain_client();
    let login = |tok: String| {
        let api = &api;
        async move {
            let l = console_login(api, &tok).await;
            (l.status, l.cookie, l.body)
        }
    };
    let id = submit_ok(&api, ADMIN, Uuid::new_v4(), Uuid::new_v4(), "slow one").await;

    let (status, cookie, body) = login(submit_only).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(cookie.is_none());
    assert!(body.contains("scope submit"), "{body}");

    // Another tenant's admin logs in, but sees only its tenant: the default
    // tenant's request is 404 to it, and the overview sends it to its list.
    let (status, cookie, body) = login(other).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let acme = cookie.unwrap();
    let get_as = |cookie: String, path: String| {
        let (http, api) = (&http, &api);
        async move {
            let r = http.get(api.url(&path)).header("cookie", cookie).send().await.unwrap();
            (
                r.status(),
                r.headers().get("location").map(|l| l.to_str().unwrap().to_owned()),
                r.text().await.unwrap(),
            )
        }
    };
    let (s, _, page) = get_as(acme.clone(), format!("/console/requests/{id}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(page.contains(&format!("console: no request {id}")), "{page}");
    let (s, _, list) = get_as(acme.clone(), "/console/requests".to_owned()).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        !list.contains(&id.to_string()),
        "another tenant's request is not listed"
    );
    let (s, at, _) = get_as(acme.clone(), "/console".to_owned()).await;
    assert_eq!((s, at.as_deref()), (StatusCode::SEE_OTHER, Some("/console/requests")));

    // Read: the pages, but no action.
    let (status, cookie, _) = login(read).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let viewer = cookie.unwrap();
    let page = http
        .get(api.url(&format!("/console/requests/{id}")))
        .header("cookie", &viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let csrf = csrf_of(&page.text().await.unwrap());
    let r = http
        .post(api.url(&format!("/console/requests/{id}/cancel")))
        .header("origin", api.url(""))
        .header("cookie", &viewer)
        .form(&[("reason", "viewer"), ("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.text().await.unwrap().contains("scope operate"));

    // Operate: acts.
    let (status, cookie, _) = login(operate).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let oncall = cookie.unwrap();
    let page = http
        .get(api.url(&format!("/console/requests/{id}")))
        .header("cookie", &oncall)
        .send()
        .await
        .unwrap();
    let csrf = csrf_of(&page.text().await.unwrap());
    let r = http
        .post(api.url(&format!("/console/requests/{id}/cancel")))
        .header("origin", api.url(""))
        .header("cookie", &oncall)
        .form(&[("reason", "oncall"), ("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success() || r.status().is_redirection(), "{}", r.status());
    crate::support::ops::wait_status(&c, id, "CANCELLED").await;

    // Revoked: the session ends within the cache period.
    c.execute("UPDATE api_tokens SET revoked_at = now() WHERE name = 'viewer'", &[])
        .await
        .unwrap();
    crate::support::wait_until(
        std::time::Duration::from_secs(15),
        "the revoked token's session ends",
        || async {
            let r = http
                .get(api.url("/console/requests"))
                .header("cookie", &viewer)
                .send()
                .await
                .unwrap();
            r.status() == StatusCode::SEE_OTHER
        },
    )
    .await;
}

/// A WebSocket that follows a user follows the tenant's user: it never
/// sees another tenant's request for the same user id; another tenant's
/// request id is refused (404), and a `submit` token may not follow a user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_websocket_shows_only_the_tenants_requests() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let db = TestDb::new().await;
    let c = db.client().await;
    let api = start(&db, Opts::default()).await;
    let a = token(&c, "acme", "app", "admin").await;
    let b = token(&c, "bravo", "app", "admin").await;
    let b_submit = token(&c, "bravo", "submitter", "submit").await;
    let user = Uuid::new_v4();
    let connect = |query: String, tok: &str| {
        let mut req = format!("ws://{}/api/ws?{query}", api.addr)
            .into_client_request()
            .unwrap();
        req.headers_mut()
            .insert("authorization", format!("Bearer {tok}").parse().unwrap());
        tokio_tungstenite::connect_async(req)
    };

    let (mut ws, _) = connect(format!("user_id={user}"), &b).await.unwrap();
    let a1 = submit_ok(&api, &a, user, Uuid::new_v4(), "acme's question").await;
    let (_, st) = get(&api, &a, &format!("/api/query/{a1}/status?wait=60s")).await;
    assert_eq!(st["status"], "completed", "{st}");
    let b1 = submit_ok(&api, &b, user, Uuid::new_v4(), "bravo's question").await;
    let mut seen = Vec::new();
    tokio::time::timeout(crate::support::GENEROUS, async {
        while let Some(Ok(msg)) = ws.next().await {
            if let Message::Text(t) = msg {
                let v: Value = serde_json::from_str(&t).unwrap();
                seen.push(v["request_id"].as_str().unwrap_or_default().to_owned());
                if v["request_id"] == b1.to_string() && v["status"] == "completed" {
                    return;
                }
            }
        }
    })
    .await
    .expect("bravo's request completes on bravo's socket");
    assert!(!seen.contains(&a1.to_string()), "{seen:?}");
    assert!(seen.iter().all(|id| *id == b1.to_string()), "{seen:?}");

    match connect(format!("request_id={a1}"), &b).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), StatusCode::NOT_FOUND),
        other => panic!("another tenant's request over WebSocket: {:?}", other.map(|_| ())),
    }
    match connect(format!("user_id={user}"), &b_submit).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), StatusCode::FORBIDDEN),
        other => panic!("a submit token followed a user: {:?}", other.map(|_| ())),
    }
}
