//! The assembler section of `bin/bench` (`--only=assembler`): the assemble
//! stage's time with and without the semantic part of the memory search.
//!
//! One database, `bench_assembler`: users with memory (turns as the latency
//! section loads them), then four runs, each with a `maasd` of its own on
//! the fake provider (an analyzer call of 30 ms):
//!
//! - embeddings off, and on (the provider `MAAS_LLM__EMBEDDING__PROVIDER`
//!   names, with `MAAS_LLM__EMBEDDING__MODEL_DIR` for the local one;
//!   default the offline provider's hashed embeddings, whose cost is the
//!   search's, not a model's); before the first run with embeddings, every
//!   turn has its embedding;
//! - the assemble stage claimed on its own (the analysis names a record
//!   the analyzer was not given, so it cannot be fused), and fused with
//!   the analyzer.
//!
//! Each run submits the same memory request of each user in turn, one at a
//! time, and reads the steps' durations (`pipeline_steps.latency_ms`):
//! p50/p99 of the assemble step and of the analyze step, in milliseconds.
//! With embeddings, the query is embedded during the analyze stage, while
//! its model call runs, and kept with the analysis: the assemble step's
//! time is the search's, with or without the semantic part.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio_postgres::Client;
use uuid::Uuid;

use super::support::daemon::Opts;
use super::support::fake_llm::{FakeConfig, FakeLlm};
use super::support::{on_provider, percentile};
use super::{Bench, connect, load_memory, round, start_daemon, wait_count};

const QUERY: &str = "What did my sister say about the pottery class and the trip to Lisbon?";

/// The analysis the fake analyzer gives: context asked for, and, for a
/// stage claimed on its own, a record no analyzer was given.
fn analysis(alone: bool) -> String {
    let found = if alone {
        json!({"lsm_record_id": i64::MAX, "relevance": 0.5})
    } else {
        serde_json::Value::Null
    };
    json!({
        "needs_context": true,
        "context_type": "topic",
        "time_scope": "none",
        "search_keywords": ["sister", "pottery", "Lisbon"],
        "context_found": found,
    })
    .to_string()
}

/// The embedding provider of the runs with the semantic part.
fn provider() -> String {
    std::env::var("MAAS_LLM__EMBEDDING__PROVIDER")
        .ok()
        .filter(|p| !p.trim().is_empty() && !p.eq_ignore_ascii_case("off"))
        .unwrap_or_else(|| "offline".into())
}

pub async fn assembler(b: &mut Bench) {
    let (users, turns, samples) = if b.quick { (10, 1_000, 100) } else { (20, 2_000, 300) };
    let url = b.fresh_db("assembler").await;
    {
        let mut c = connect(&url).await;
        maas::db::migrate::migrate(&mut c, false).await.unwrap();
    }
    let c = connect(&url).await;
    let with_memory = load_memory(&c, users, turns, 0).await;
    let embedding = provider();
    for (semantic, alone) in [(false, true), (false, false), (true, true), (true, false)] {
        let fake = FakeLlm::start_with(FakeConfig {
            default_text: analysis(alone),
            default_latency: Some(Duration::from_millis(30)),
            ..FakeConfig::default()
        })
        .await;
        let mut opts = on_provider(
            Opts::default().env("RUST_LOG", "warn"),
            &fake.openai_base_url(),
            "bench",
        )
        .env("MAAS_ARCHIVIST__ENABLED", "false")
        .env(
            "MAAS_LLM__EMBEDDING__PROVIDER",
            if semantic { embedding.as_str() } else { "off" },
        );
        if let Ok(dir) = std::env::var("MAAS_LLM__EMBEDDING__MODEL_DIR") {
            opts = opts.env("MAAS_LLM__EMBEDDING__MODEL_DIR", dir);
        }
        let mut d = start_daemon(&url, opts).await;
        if semantic {
            let all = users * turns;
            let t0 = Instant::now();
            let done = wait_count(
                &c,
                "SELECT count(*) FROM turn_embeddings",
                all,
                Duration::from_secs(1800),
            )
            .await;
            assert!(done, "turns still without an embedding: {}", d.log_text());
            eprintln!(
                "assembler: {all} turns embedded ({embedding}) in {:.1} s",
                t0.elapsed().as_secs_f64()
            );
        }
        let ids = submit(&c, &with_memory, samples).await;
        let (assemble, analyze) = step_latencies(&c, &ids).await;
        d.kill();
        let name = format!(
            "assembler_{}_{}",
            if semantic { "semantic" } else { "fulltext" },
            if alone { "alone" } else { "fused" }
        );
        let what = format!(
            "{} ms, the assemble stage {}, memory search {}, {users} users × {turns} turns",
            "p50/p99",
            if alone {
                "claimed on its own"
            } else {
                "fused with the analyzer"
            },
            if semantic {
                format!("full text + embeddings ({embedding})")
            } else {
                "full text alone".to_owned()
            }
        );
        for (stage, sorted) in [("assemble", &assemble), ("analyze", &analyze)] {
            for (p, q) in [("p50", 0.5), ("p99", 0.99)] {
                let v = percentile(sorted, q).map_or(serde_json::Value::Null, |v| json!(round(v, 1)));
                b.record(&format!("{name}_{stage}_ms_{p}"), v, &format!("{stage} step, {what}"));
            }
        }
    }
}

/// Submits `n` memory requests, one at a time, cycling over `users`, each
/// waited for; their ids.
async fn submit(c: &Client, users: &[(Uuid, Uuid)], n: usize) -> Vec<Uuid> {
    let insert = c
        .prepare("INSERT INTO pipeline_runs (user_id, thread_id, user_query) VALUES ($1, $2, $3) RETURNING id")
        .await
        .unwrap();
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let (user, thread) = users[i % users.len()];
        let id: Uuid = c.query_one(&insert, &[&user, &thread, &QUERY]).await.unwrap().get(0);
        let sql = format!("SELECT count(*) FROM pipeline_runs WHERE id = '{id}' AND status IN ('COMPLETED', 'FAILED')");
        assert!(
            wait_count(c, &sql, 1, Duration::from_secs(60)).await,
            "request {id} did not finish"
        );
        ids.push(id);
    }
    ids
}

/// The successful assemble and analyze steps' durations of `ids`, sorted.
async fn step_latencies(c: &Client, ids: &[Uuid]) -> (Vec<f64>, Vec<f64>) {
    let rows = c
        .query(
            "SELECT stage::text, latency_ms::float8 FROM pipeline_steps
             WHERE run_id = ANY($1) AND outcome = 'succeeded' AND latency_ms IS NOT NULL",
            &[&ids],
        )
        .await
        .unwrap();
    let (mut assemble, mut analyze) = (Vec::new(), Vec::new());
    for r in rows {
        let (stage, ms): (String, f64) = (r.get(0), r.get(1));
        match stage.as_str() {
            "assemble" => assemble.push(ms),
            "analyze" => analyze.push(ms),
            _ => {}
        }
    }
    assemble.sort_by(f64::total_cmp);
    analyze.sort_by(f64::total_cmp);
    (assemble, analyze)
}
