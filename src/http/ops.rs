//! Operator routes: `/healthz`, `/readyz`, `/metrics`, `/openapi.json`.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use crate::db::migrate;

/// How long `/readyz` waits for the database.
const READY_TIMEOUT: Duration = Duration::from_secs(3);

/// `GET /healthz`: the process is alive and serving HTTP.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "alive" }))
}

/// `GET /readyz`: database reachable, listener connected, migrations
/// current, not shutting down; 503 naming the reason otherwise.
pub async fn readyz(State(app): State<AppState>) -> Response {
    let mut failures: Vec<String> = Vec::new();
    let (database, migrations) = match tokio::time::timeout(READY_TIMEOUT, schema_state(&app)).await {
        Err(_) => (
            format!("no answer within {} s", READY_TIMEOUT.as_secs()),
            "unknown".to_owned(),
        ),
        Ok(Err(e)) => (crate::error::chain(&e), "unknown".to_owned()),
        Ok(Ok(state)) => {
            let m = if state.current_version != state.latest_version {
                format!(
                    "the schema is at version {}, this binary expects {}",
                    state.current_version, state.latest_version
                )
            } else if !state.missing_triggers.is_empty() {
                format!("missing triggers: {}", state.missing_triggers.join(", "))
            } else {
                "ok".to_owned()
            };
            ("ok".to_owned(), m)
        }
    };
    if database != "ok" {
        failures.push(format!("database: {database}"));
    }
    if migrations != "ok" && database == "ok" {
        failures.push(format!("migrations: {migrations}"));
    }
    let listener = if app.notifier.is_listening() {
        "ok"
    } else {
        failures.push("listener: not connected".into());
        "not connected"
    };
    if app.shutdown.is_cancelled() {
        failures.push("shutting down".into());
    }
    let checks = json!({ "database": database, "listener": listener, "migrations": migrations });
    if failures.is_empty() {
        (StatusCode::OK, Json(json!({ "status": "ready", "checks": checks }))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "unavailable", "reason": failures.join("; "), "checks": checks })),
        )
            .into_response()
    }
}

async fn schema_state(app: &AppState) -> Result<migrate::SchemaState, crate::db::Error> {
    let client = app.pool.get().await?;
    migrate::state(&client).await
}

/// `GET /metrics`: Prometheus text format 0.0.4.
pub async fn metrics(State(app): State<AppState>) -> Response {
    crate::metrics::observe_engine(&app.stats, app.notifier.is_listening());
    let mut body = app.metrics.render();
    if !app.cfg.metrics.public_tenants {
        body = crate::metrics::without_tenants(&body);
    }
    let mut resp = body.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
    );
    resp
}

/// `GET /openapi.json`.
pub async fn openapi() -> Json<serde_json::Value> {
    Json(super::openapi::document())
}
