//! The streaming section of `bin/bench` (`--only=streaming`): how much
//! time maas adds between the provider's first token and the first piece
//! of the answer at a client whose SSE connection is on another `maasd`
//! than the one running the responder (the must line: ≤ 50 ms at p50),
//! and 1,000 streams at once.
//!
//! Two daemons share one database and the fake provider, which answers
//! every call after [`FIRST_TOKEN`] and then writes the answer in pieces
//! [`PIECE_PACE`] apart; the provider's first token is the responder
//! call's arrival plus that wait. Each request is followed on both daemons
//! (`GET /api/query/{id}/events`); the figure is taken from the client of
//! the daemon that did not run the respond stage (`pipeline_steps.worker`).
//! Every client must end with text equal to the final answer.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use serde_json::Value;
use tokio::time::Instant;
use uuid::Uuid;

use super::support::daemon::{Maasd, Opts};
use super::support::fake_llm::{FakeLlm, Reply};
use super::support::{analysis_provider, on_provider, percentile};
use super::{Bench, connect, round, start_daemon};

/// The provider's wait before its first token (analyzer and responder).
const FIRST_TOKEN: Duration = Duration::from_millis(200);
/// The provider's pause between two pieces of a streamed answer.
const PIECE_PACE: Duration = Duration::from_millis(10);
/// Streams followed at once in the load run.
const LOAD: usize = 1_000;

/// What one client saw of one request's stream.
struct Followed {
    /// When the first `delta` event arrived.
    first_delta: Option<Instant>,
    /// The text since the last `restart`.
    text: String,
    /// The terminal state's answer, when it completed.
    answer: Option<String>,
}

/// Follows `/api/query/{id}/events` on `base` to its terminal state.
async fn follow(http: reqwest::Client, base: String, id: Uuid) -> Followed {
    let mut seen = Followed {
        first_delta: None,
        text: String::new(),
        answer: None,
    };
    let Ok(mut resp) = http.get(format!("{base}/api/query/{id}/events")).send().await else {
        return seen;
    };
    let mut buf = String::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        let now = Instant::now();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let raw: String = buf.drain(..end + 2).collect();
            let (mut name, mut data) = ("message", String::new());
            for line in raw.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = if v.trim() == "delta" {
                        "delta"
                    } else if v.trim() == "restart" {
                        "restart"
                    } else {
                        "other"
                    };
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
            match name {
                "delta" => {
                    seen.first_delta.get_or_insert(now);
                    seen.text.push_str(v["text"].as_str().unwrap_or_default());
                }
                "restart" => seen.text.clear(),
                _ if v["status"].is_string() && v["status"] != "processing" => {
                    seen.answer = v["answer"].as_str().map(str::to_owned);
                    return seen;
                }
                _ => {}
            }
        }
    }
    seen
}

/// The query text of request `i`: a marker the provider's calls can be
/// matched by.
fn query(i: usize) -> String {
    format!("streambench{i}x tell me about streaming")
}

/// When the provider sent each request's first token, by query number
/// (the streamed responder call's arrival plus [`FIRST_TOKEN`]).
fn first_tokens(fake: &FakeLlm) -> HashMap<usize, Instant> {
    fake.requests()
        .into_iter()
        .filter(|r| r.body.get("stream").and_then(Value::as_bool) == Some(true))
        .filter_map(|r| {
            let text = r.body.to_string();
            let at = text.find("streambench")? + "streambench".len();
            let digits: String = text[at..].chars().take_while(char::is_ascii_digit).collect();
            Some((digits.parse().ok()?, r.received_at + FIRST_TOKEN))
        })
        .collect()
}

/// The pid of the daemon whose respond stage succeeded for `id`.
async fn responder_pid(c: &tokio_postgres::Client, id: Uuid) -> Option<i32> {
    let row = c
        .query_opt(
            "SELECT worker FROM pipeline_steps WHERE run_id = $1 AND stage = 'respond' AND outcome = 'succeeded'",
            &[&id],
        )
        .await
        .ok()??;
    row.get::<_, String>(0).split(':').nth(1)?.parse().ok()
}

/// Inserts streaming requests `from..to` in one statement; their ids in order.
async fn insert(c: &tokio_postgres::Client, from: usize, to: usize) -> Vec<Uuid> {
    let texts: Vec<String> = (from..to).map(query).collect();
    c.query(
        "INSERT INTO pipeline_runs (user_id, user_query, stream)
         SELECT gen_random_uuid(), q, true FROM unnest($1::text[]) WITH ORDINALITY AS t(q, n)
         ORDER BY n RETURNING id",
        &[&texts],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// Checks that a client ended with the answer (the terminal event's) and
/// held only a prefix of it before.
fn check_text(id: Uuid, f: &Followed) {
    let answer = f
        .answer
        .as_deref()
        .unwrap_or_else(|| panic!("{id}: no terminal answer"));
    assert!(
        answer.starts_with(&f.text),
        "{id}: the client held {:?}, not a prefix of the answer {answer:?}",
        f.text
    );
}

/// Milliseconds from the provider's first token to the first delta at the
/// client on the daemon that did not respond; checks each client's text.
async fn added_ms(
    c: &tokio_postgres::Client,
    daemons: &[(i32, String)],
    fake: &FakeLlm,
    runs: &[(usize, Uuid, Vec<Followed>)],
) -> Vec<f64> {
    let tokens = first_tokens(fake);
    let mut added = Vec::new();
    for (i, id, seen) in runs {
        for f in seen {
            check_text(*id, f);
        }
        let responder = responder_pid(c, *id).await;
        let other = daemons.iter().position(|(pid, _)| Some(*pid) != responder);
        let first = other.and_then(|k| seen.get(k)?.first_delta);
        if let (Some(first), Some(token)) = (first, tokens.get(i)) {
            added.push(first.saturating_duration_since(*token).as_secs_f64() * 1000.0);
        }
    }
    added.sort_by(f64::total_cmp);
    added
}

/// The streaming section: first-delta latency across daemons, then
/// [`LOAD`] streams at once.
pub async fn streaming(b: &mut Bench) {
    let url = b.fresh_db("streaming").await;
    let fake = analysis_provider(Some(FIRST_TOKEN)).await;
    // The bench's requests: a valid analysis (the analyzer's reply, and the
    // responder's answer), pretty-printed so that it streams in pieces,
    // PIECE_PACE apart, the first after FIRST_TOKEN.
    let reply =
        serde_json::to_string_pretty(&serde_json::from_str::<Value>(&maas::llm::offline::analysis_example()).unwrap())
            .unwrap();
    let pieces: Vec<&str> = reply.split_inclusive(char::is_whitespace).collect();
    fake.answer_when(
        &["streambench"],
        Reply::stream(&pieces).paced(PIECE_PACE).after(FIRST_TOKEN),
    );
    let conc = LOAD * 2;
    let opts = || {
        on_provider(Opts::default(), &fake.openai_base_url(), "bench")
            .env("MAAS_CONCURRENCY__ANALYZE", conc)
            .env("MAAS_CONCURRENCY__RESPOND", conc)
            .env("MAAS_LLM__ANALYZER__MAX_CONCURRENCY", conc)
            .env("MAAS_LLM__RESPONDER__MAX_CONCURRENCY", conc)
    };
    let mut ds: Vec<Maasd> = vec![start_daemon(&url, opts()).await, start_daemon(&url, opts()).await];
    let mut daemons = Vec::new();
    for d in &mut ds {
        let addr = d.http_addr(Duration::from_secs(60)).await;
        daemons.push((d.pid().as_raw(), format!("http://{addr}")));
    }
    let c = connect(&url).await;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(LOAD)
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();

    // First-delta latency: waves of 10 requests, each followed on both daemons.
    let n = if b.quick { 100 } else { 300 };
    let mut runs = Vec::new();
    for wave in (0..n).step_by(10) {
        let ids = insert(&c, wave, wave + 10).await;
        let follows = ids
            .iter()
            .map(|&id| join_all(daemons.iter().map(|(_, base)| follow(http.clone(), base.clone(), id))));
        for (k, seen) in join_all(follows).await.into_iter().enumerate() {
            runs.push((wave + k, ids[k], seen));
        }
    }
    let added = added_ms(&c, &daemons, &fake, &runs).await;
    let p50 = percentile(&added, 0.5).unwrap_or(f64::NAN);
    b.record(
        "stream_added_p50_ms",
        round(p50, 1),
        &format!(
            "{} streams: provider's first token → first delta at a client on the other maasd (must ≤ 50)",
            added.len()
        ),
    );
    b.record(
        "stream_added_p99_ms",
        round(percentile(&added, 0.99).unwrap_or(f64::NAN), 1),
        "the same, p99",
    );

    // Load: LOAD streams at once, each followed on one daemon (alternating).
    let t0 = Instant::now();
    let ids = insert(&c, n, n + LOAD).await;
    let follows = ids.iter().enumerate().map(|(k, &id)| {
        let base = daemons[k % 2].1.clone();
        let http = http.clone();
        async move { vec![follow(http, base, id).await] }
    });
    let seen = join_all(follows).await;
    let wall = t0.elapsed().as_secs_f64();
    let runs: Vec<_> = ids
        .iter()
        .zip(seen)
        .enumerate()
        .map(|(k, (&id, s))| (n + k, id, s))
        .collect();
    let complete = runs.iter().filter(|(_, _, s)| s[0].answer.is_some()).count();
    assert_eq!(complete, LOAD, "every stream of the load run completes");
    // The load's clients: one per request, on either daemon.
    let mut load_added = Vec::new();
    let tokens = first_tokens(&fake);
    let whole = runs
        .iter()
        .filter(|(_, _, s)| s[0].answer.as_deref() == Some(s[0].text.as_str()))
        .count();
    for (i, id, s) in &runs {
        check_text(*id, &s[0]);
        if let (Some(first), Some(token)) = (s[0].first_delta, tokens.get(i)) {
            load_added.push(first.saturating_duration_since(*token).as_secs_f64() * 1000.0);
        }
    }
    load_added.sort_by(f64::total_cmp);
    b.record(
        "stream_load_added_p50_ms",
        round(percentile(&load_added, 0.5).unwrap_or(f64::NAN), 1),
        &format!(
            "{LOAD} concurrent streams, all complete ({whole} clients' pieces made the whole answer, the rest ended with the terminal event's): first token → first delta"
        ),
    );
    b.record(
        "stream_load_added_p99_ms",
        round(percentile(&load_added, 0.99).unwrap_or(f64::NAN), 1),
        "the same, p99",
    );
    b.record(
        "stream_load_wall_s",
        round(wall, 2),
        &format!("{LOAD} concurrent streams: insert → last client's terminal event"),
    );
    for d in &mut ds {
        d.kill();
    }
}
