//! A daemon with tenants: a configured admin token, tenants and their
//! database tokens made with plain SQL (as `maasctl tokens create` would),
//! and requests sent with one of them.

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_postgres::Client;
use uuid::Uuid;

use super::api::Api;
use super::daemon::Opts;
use super::db::TestDb;

/// The token the daemon is configured with (`api_tokens`): no tenant, every
/// scope.
pub const ADMIN: &str = "tok-config-admin";

/// Adds tenant `name` and a token of it with `scope`; returns the token.
pub async fn token(c: &Client, tenant: &str, name: &str, scope: &str) -> String {
    c.execute(
        "INSERT INTO tenants (name) VALUES ($1) ON CONFLICT (name) DO NOTHING",
        &[&tenant],
    )
    .await
    .unwrap();
    let tok = format!("maas_{}", Uuid::new_v4().simple());
    let hash: Vec<u8> = Sha256::digest(tok.as_bytes()).to_vec();
    c.execute(
        "INSERT INTO api_tokens (name, tenant_id, scope, token_sha256) SELECT $1, id, $3, $4 FROM tenants WHERE name = $2",
        &[&name, &tenant, &scope, &hash],
    )
    .await
    .unwrap();
    tok
}

/// A daemon that takes [`ADMIN`] (the client sends it) and tenants' database
/// tokens, its archivist off.
pub async fn start(db: &TestDb, opts: Opts) -> Api {
    let mut api = Api::start(
        db,
        opts.env("MAAS_API_TOKENS", ADMIN)
            .env("MAAS_ARCHIVIST__ENABLED", "false"),
    )
    .await;
    api.token = Some(ADMIN.to_owned());
    api
}

/// A daemon with tenants ready to submit: [`start`], then one tenant per
/// name in `tenants`, each with a `submit` token named `app`; returns the
/// tokens in the order of `tenants`.
pub async fn with_tenants(db: &TestDb, opts: Opts, tenants: &[&str]) -> (Api, Vec<String>) {
    let api = start(db, opts).await;
    let c = db.client().await;
    let mut tokens = Vec::new();
    for tenant in tenants {
        tokens.push(token(&c, tenant, "app", "submit").await);
    }
    (api, tokens)
}

/// Sends `rb` with `tok`: (status, JSON body or null, headers).
pub async fn send(tok: &str, rb: reqwest::RequestBuilder) -> (StatusCode, Value, HeaderMap) {
    let resp = rb.bearer_auth(tok).send().await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    (status, resp.json().await.unwrap_or(Value::Null), headers)
}

/// GET `path` with `tok`: (status, JSON body or null).
pub async fn get(api: &Api, tok: &str, path: &str) -> (StatusCode, Value) {
    let (s, v, _) = send(tok, api.http.get(api.url(path))).await;
    (s, v)
}

/// Submits `body` with `tok`.
pub async fn submit(api: &Api, tok: &str, body: Value) -> (StatusCode, Value, HeaderMap) {
    send(tok, api.http.post(api.url("/api/query")).json(&body)).await
}

/// Submits `query` for `user` in `thread` with `tok`; asserts it was
/// accepted and returns the request's id.
pub async fn submit_ok(api: &Api, tok: &str, user: Uuid, thread: Uuid, query: &str) -> Uuid {
    let (s, body, _) = submit(
        api,
        tok,
        json!({ "user_id": user, "thread_id": thread, "query": query }),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");
    body["request_id"].as_str().unwrap().parse().unwrap()
}
