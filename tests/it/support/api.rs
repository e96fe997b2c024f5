//! A running `maasd` with its HTTP address and a client for it, for the
//! tests that talk to the API.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use super::daemon::{Maasd, Opts};
use super::db::TestDb;
use super::metrics::metric;
use super::{GENEROUS, wait_until};

/// A running daemon and a client for it.
pub struct Api {
    pub d: Maasd,
    pub addr: SocketAddr,
    pub http: reqwest::Client,
    /// Sent as a bearer token when set.
    pub token: Option<String>,
}

impl Api {
    pub async fn start(db: &TestDb, opts: Opts) -> Api {
        let mut d = Maasd::spawn(&db.url, opts);
        let mut addr = d.http_addr(GENEROUS).await;
        if addr.ip().is_unspecified() {
            addr.set_ip([127, 0, 0, 1].into());
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let api = Api {
            d,
            addr,
            http,
            token: None,
        };
        wait_until(GENEROUS, "the daemon is ready", || async {
            api.get("/readyz").await.status() == StatusCode::OK
        })
        .await;
        api
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn authed(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.authed(self.http.get(self.url(path))).send().await.unwrap()
    }

    pub async fn submit(&self, body: &Value) -> reqwest::Response {
        self.authed(self.http.post(self.url("/api/query")).json(body))
            .send()
            .await
            .unwrap()
    }

    /// Submits `body`; asserts it was accepted and returns the request's id.
    pub async fn submit_accepted(&self, body: &Value) -> Uuid {
        accepted(self.submit(body).await).await
    }

    /// Submits a request of `user` (in `thread`, or none) and follows it
    /// to its end; asserts it completed and returns its id.
    pub async fn ask(&self, user: Uuid, thread: Option<Uuid>, query: &str) -> Uuid {
        let id = self
            .submit_accepted(&json!({ "user_id": user, "thread_id": thread, "query": query }))
            .await;
        let state = self.status_with(id, "wait=60s").await;
        assert_eq!(state["status"], "completed", "{state}");
        id
    }

    /// The request's status with the query string `query` (`wait=…`,
    /// `include=context`); asserts 200.
    pub async fn status_with(&self, id: Uuid, query: &str) -> Value {
        let resp = self.get(&format!("/api/query/{id}/status?{query}")).await;
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json().await.unwrap()
    }

    /// The `/metrics` page.
    pub async fn metrics(&self) -> String {
        let resp = self.get("/metrics").await;
        assert_eq!(resp.status(), StatusCode::OK);
        resp.text().await.unwrap()
    }

    /// Waits until the metrics show `series` at `value`.
    pub async fn wait_metric(&self, series: &str, value: f64) {
        wait_until(GENEROUS, &format!("{series} = {value}"), || async {
            metric(&self.metrics().await, series) == Some(value)
        })
        .await;
    }
}

/// The request id of a 202 answer to a submission; panics with the body on
/// another status.
pub async fn accepted(resp: reqwest::Response) -> Uuid {
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    body["request_id"].as_str().unwrap().parse().unwrap()
}
