//! The MCP section of `bin/bench` (`--only=mcp`): the `recall` tool through
//! the MCP server at `/mcp` against the same search over HTTP
//! (`GET /api/users/{id}/memory/search`), from a real `maasd`.
//!
//! One user with 2,000 turns (20,000 without `--quick`) of a small
//! vocabulary, loaded with plain SQL; then the same queries, one at a time
//! over one keep-alive connection each, first over HTTP, then as MCP
//! `tools/call recall` in one session (plain JSON-RPC over reqwest: the
//! `initialize` handshake of the session revision, then one POST per call,
//! its answer read from the JSON or SSE body). p50/p99 in milliseconds,
//! measured by the client; the difference is the protocol's cost (JSON-RPC
//! framing, the tool's argument check and result shape, the session).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use super::support::daemon::Opts;
use super::support::percentile;
use super::{Bench, connect, round, start_daemon};

const TOKEN: &str = "bench-mcp-token";
const WORDS: [&str; 12] = [
    "lisbon",
    "sister",
    "invoice",
    "marathon",
    "guitar",
    "garden",
    "flight",
    "doctor",
    "birthday",
    "recipe",
    "promotion",
    "holiday",
];

/// The MCP section.
pub async fn mcp(b: &mut Bench) {
    let url = b.fresh_db("mcp").await;
    let mut d = start_daemon(
        &url,
        Opts::default()
            .env("MAAS_API_TOKENS", TOKEN)
            .env("MAAS_ARCHIVIST__ENABLED", "false"),
    )
    .await;
    let addr = d.http_addr(Duration::from_secs(60)).await;
    let base = format!("http://127.0.0.1:{}", addr.port());
    let user = Uuid::new_v4();
    let turns: i64 = if b.quick { 2_000 } else { 20_000 };
    let c = connect(&url).await;
    c.execute(
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content)
         SELECT $1, md5('t' || (g / 10))::uuid, 'user_query',
                'turn ' || g || ' about my ' || ($3::text[])[1 + g % 12] || ' and the ' || ($3::text[])[1 + (g / 12) % 12]
         FROM generate_series(1, $2::int8) g",
        &[&user, &turns, &WORDS.to_vec()],
    )
    .await
    .unwrap();
    c.batch_execute("VACUUM ANALYZE raw_logs").await.unwrap();
    let n = if b.quick { 200 } else { 1000 };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let query = |i: usize| format!("{} {}", WORDS[i % 12], WORDS[(i / 12 + 5) % 12]);
    let mut over_http = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        let resp = http
            .get(format!("{base}/api/users/{user}/memory/search"))
            .query(&[("q", query(i)), ("limit", "10".to_owned())])
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{}", resp.status());
        let _: Value = resp.json().await.unwrap();
        if i >= 20 {
            over_http.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let session = Session::open(&http, &base).await;
    let mut over_mcp = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        let args = json!({ "user_id": user, "query": query(i), "limit": 10 });
        let result = session.call(&http, i, "recall", args).await;
        assert!(result["isError"] != json!(true), "{result}");
        if i >= 20 {
            over_mcp.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    for (name, mut v) in [("http_memory_search", over_http), ("mcp_recall", over_mcp)] {
        v.sort_by(f64::total_cmp);
        for (p, q) in [("p50", 0.5), ("p99", 0.99)] {
            let ms = percentile(&v, q).unwrap_or(f64::NAN);
            b.record(
                &format!("{name}_{p}_ms"),
                round(ms, 2),
                &format!("{n} searches, one at a time, of one user with {turns} turns, limit 10"),
            );
        }
    }
    drop(d);
}

/// An MCP session of the revision with `initialize` and sessions.
struct Session {
    url: String,
    id: Option<String>,
}

impl Session {
    async fn open(http: &reqwest::Client, base: &str) -> Session {
        let mut s = Session {
            url: format!("{base}/mcp"),
            id: None,
        };
        let init = json!({
            "jsonrpc": "2.0", "id": "init", "method": "initialize",
            "params": { "protocolVersion": "2025-11-25", "capabilities": {},
                        "clientInfo": { "name": "maas-bench", "version": "1" } }
        });
        let resp = s.post(http, &init).send().await.unwrap();
        s.id = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let _ = body(resp).await;
        let done = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        s.post(http, &done).send().await.unwrap();
        s
    }

    fn post(&self, http: &reqwest::Client, msg: &Value) -> reqwest::RequestBuilder {
        let mut rb = http
            .post(&self.url)
            .bearer_auth(TOKEN)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .json(msg);
        if let Some(id) = &self.id {
            rb = rb.header("mcp-session-id", id);
        }
        rb
    }

    /// `tools/call` of `tool`: its result.
    async fn call(&self, http: &reqwest::Client, id: usize, tool: &str, args: Value) -> Value {
        let msg = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": tool, "arguments": args }
        });
        let resp = self.post(http, &msg).send().await.unwrap();
        assert!(resp.status().is_success(), "{}", resp.status());
        body(resp).await["result"].clone()
    }
}

/// The JSON-RPC message of a response: its JSON body, or the last `data:`
/// line of its event stream that holds one.
async fn body(resp: reqwest::Response) -> Value {
    let text = resp.text().await.unwrap();
    serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .next_back()
            .unwrap_or(Value::Null)
    })
}
