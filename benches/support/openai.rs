//! The OpenAI-compatible endpoint's section of `bin/bench`
//! (`--only=openai`): what `POST /v1/chat/completions` (not streamed) costs
//! over `POST /api/query` followed by its long-poll, end to end, from a
//! real `maasd` with the offline provider answering at once.
//!
//! The same questions, one at a time over one keep-alive connection, the
//! two doors taking turns (so drift of the machine falls on both alike):
//! `/api/query` + `GET /api/query/{id}/status?wait=30s` against one chat
//! completion of one user message. p50/p99 in milliseconds, measured by
//! the client; the overhead line is the difference of the p50s (the
//! endpoint's parsing, its user and thread, its usage read and its wait).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use super::support::daemon::Opts;
use super::support::percentile;
use super::{Bench, round, start_daemon};

const TOKEN: &str = "bench-openai-token";

/// The section.
pub async fn openai(b: &mut Bench) {
    let url = b.fresh_db("openai").await;
    let mut d = start_daemon(
        &url,
        Opts::default()
            .env("MAAS_API_TOKENS", TOKEN)
            .env("MAAS_ARCHIVIST__ENABLED", "false")
            .env("MAAS_LLM__OFFLINE__LATENCY_MS", 0),
    )
    .await;
    let addr = d.http_addr(Duration::from_secs(60)).await;
    let base = format!("http://127.0.0.1:{}", addr.port());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let models = json_of(http.get(format!("{base}/v1/models"))).await;
    let model = models["data"][0]["id"].as_str().unwrap().to_owned();
    let user = Uuid::new_v4();
    let n = if b.quick { 100 } else { 500 };
    let (mut api, mut chat) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + 10 {
        let query = format!("What did I say about the garden, question {i}?");
        let t = Instant::now();
        let body = json!({ "user_id": user, "thread_id": Uuid::new_v4(), "query": query });
        let sent = json_of(http.post(format!("{base}/api/query")).json(&body)).await;
        let id = sent["request_id"].as_str().unwrap();
        let done = json_of(http.get(format!("{base}/api/query/{id}/status?wait=30s"))).await;
        assert_eq!(done["status"], "completed", "{done}");
        let api_ms = t.elapsed().as_secs_f64() * 1000.0;
        let t = Instant::now();
        let body = json!({
            "model": model, "user": user.to_string(),
            "messages": [{ "role": "user", "content": query }],
        });
        let answer = json_of(http.post(format!("{base}/v1/chat/completions")).json(&body)).await;
        assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");
        let chat_ms = t.elapsed().as_secs_f64() * 1000.0;
        if i >= 10 {
            api.push(api_ms);
            chat.push(chat_ms);
        }
    }
    api.sort_by(f64::total_cmp);
    chat.sort_by(f64::total_cmp);
    let note = format!("{n} requests, one at a time, offline provider at once; the doors take turns");
    let mut p50 = [0.0; 2];
    for (k, (name, v)) in [("api_query_e2e", &api), ("openai_chat_e2e", &chat)]
        .into_iter()
        .enumerate()
    {
        for (p, q) in [("p50", 0.5), ("p99", 0.99)] {
            let ms = percentile(v, q).unwrap_or(f64::NAN);
            if p == "p50" {
                p50[k] = ms;
            }
            b.record(&format!("{name}_{p}_ms"), round(ms, 2), &note);
        }
    }
    b.record(
        "openai_overhead_p50_ms",
        round(p50[1] - p50[0], 2),
        "openai_chat_e2e_p50 − api_query_e2e_p50, same run",
    );
    drop(d);
}

/// The JSON answer of `rb` sent with the bench's token; a failure stops
/// the run, naming the status and body.
async fn json_of(rb: reqwest::RequestBuilder) -> Value {
    let resp = rb.bearer_auth(TOKEN).send().await.unwrap();
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{status}: {body}");
    body
}
