//! The benchmark behind `bin/bench`: throughput, latency, LLM-bound
//! concurrency and crash recovery of real `maasd` processes, measured against
//! the limit of the same PostgreSQL cluster (pgbench) in the same run.
//!
//! `cargo bench --bench maas -- [--quick] [--json] [--tls] [--console-rows=N]`; `bin/bench` provisions
//! nothing else: the cluster is made here (durable: fsync and
//! synchronous_commit on) under the target directory.
//!
//! `--tls`: the cluster serves TLS (a CA and server certificate made here)
//! and every connection of the daemons and of the bench uses
//! `sslmode=verify-full`; the throughput and latency runs are repeated
//! without TLS in the same run (lines ending `_no_tls`) and
//! `tls_throughput_ratio` is with ÷ without. pgbench runs plain (the
//! reference lines) and once more with TLS (`pgbench_tps_c16_tls`), so the
//! must lines are reported both ways: `stage_exec_per_pgbench_tps_tls`
//! (maasd and pgbench both on TLS), `stage_exec_per_pgbench_tps_no_tls`
//! (both plain), `pickup_p50_ms_tls` / `pickup_p50_ms_no_tls` (and p99).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark harness fails loudly"
)]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "statistics over small counts"
)]

#[path = "support/assembler.rs"]
mod assembler;
#[path = "support/console.rs"]
mod console;
#[path = "support/cpu.rs"]
mod cpu;
#[path = "support/mcp.rs"]
mod mcp;
#[path = "support/memory_scale.rs"]
mod memory_scale;
#[path = "support/openai.rs"]
mod openai;
#[path = "support/streaming.rs"]
mod streaming;
#[allow(
    dead_code,
    reason = "shared with the chaos bench and the tests, which use more of it"
)]
mod support;
#[path = "support/writes.rs"]
mod writes;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use maas::db::devdb::Cluster;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use support::daemon::{Maasd, Opts};
use support::{analysis_provider, count, fresh_database, on_provider, percentile, poll_until};
use tokio_postgres::{AsyncMessage, Client};
use uuid::Uuid;

struct Bench {
    cluster: Cluster,
    quick: bool,
    /// `--tls`: the parameters every database URL gets.
    tls: Option<String>,
    results: Vec<(String, Value, String)>,
}

impl Bench {
    fn record(&mut self, key: &str, value: impl Into<Value>, note: &str) {
        self.results.push((key.to_owned(), value.into(), note.to_owned()));
    }

    async fn fresh_db(&self, name: &str) -> String {
        let url = fresh_database(&self.cluster, &format!("bench_{name}")).await;
        match &self.tls {
            Some(params) => format!("{url}?{params}"),
            // Plain even where the cluster serves TLS (`prefer` would take it).
            None => format!("{url}?sslmode=disable"),
        }
    }
}

/// A connection for measuring and watching (30 s to connect).
async fn connect(url: &str) -> Client {
    support::connect(url, Duration::from_secs(30)).await
}

/// Waits (polling every 10 ms) until `sql` returns at least `n`.
async fn wait_count(c: &Client, sql: &str, n: i64, within: Duration) -> bool {
    poll_until(within, Duration::from_millis(10), || async { count(c, sql).await >= n }).await
}

/// Waits until no request is left to work on: none due, none in flight.
/// Two probes of the partial indexes every 20 ms, so that watching costs
/// the measured system next to nothing (a `count(*)` over the table would
/// scan it, every time).
async fn wait_drained(c: &Client, within: Duration) -> bool {
    poll_until(within, Duration::from_millis(20), || async {
        let busy: bool = c
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pipeline_runs WHERE status IN ('NEW', 'ANALYZED', 'READY'))
                     OR EXISTS (SELECT 1 FROM pipeline_runs WHERE lease_expires_at IS NOT NULL)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        !busy
    })
    .await
}

/// Inserts `n` requests in one statement, as another application would;
/// query texts `{prefix}1` to `{prefix}{n}`.
async fn insert_requests(c: &Client, n: i64, prefix: &str) {
    c.execute(
        "INSERT INTO pipeline_runs (user_id, user_query)
         SELECT gen_random_uuid(), $2::text || g FROM generate_series(1, $1::int8) g",
        &[&n, &prefix],
    )
    .await
    .unwrap();
}

/// Seconds from now until nothing is left to work on (10 minutes at most);
/// asserts that all `n` requests of the `what` run COMPLETED.
async fn wait_all_completed(c: &Client, d: &Maasd, n: i64, what: &str) -> f64 {
    let t0 = Instant::now();
    let drained = wait_drained(c, Duration::from_secs(600)).await;
    let secs = t0.elapsed().as_secs_f64();
    let completed = count(c, "SELECT count(*) FROM pipeline_runs WHERE status = 'COMPLETED'").await;
    assert!(
        drained && completed == n,
        "{what} run did not finish ({completed} of {n} completed): {}",
        d.log_text()
    );
    secs
}

/// A daemon that is migrated and listening.
async fn start_daemon(url: &str, opts: Opts) -> Maasd {
    let d = Maasd::spawn(url, opts);
    let c = connect(url).await;
    let ok = wait_count(
        &c,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'maasd-listener'",
        1,
        Duration::from_secs(60),
    )
    .await;
    assert!(ok, "maasd did not start: {}", d.log_text());
    d
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

// ---------------------------------------------------------------- scenarios

async fn pgbench(b: &mut Bench) {
    let url = b.fresh_db("pgbench").await;
    let c = connect(&url).await;
    c.batch_execute(
        "CREATE TABLE bench_kv (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0);
         INSERT INTO bench_kv (id) SELECT g FROM generate_series(1, 100000) g;",
    )
    .await
    .unwrap();
    c.batch_execute("VACUUM ANALYZE bench_kv").await.unwrap();
    let script = std::env::temp_dir().join(format!("maas-bench-{}.sql", std::process::id()));
    std::fs::write(
        &script,
        "\\set id random(1, 100000)\nUPDATE bench_kv SET v = v + 1 WHERE id = :id;\n",
    )
    .unwrap();
    let secs = if b.quick { "5" } else { "15" };
    let run = |clients: &str| run_pgbench(b, &url, &script, secs, clients, "prepared", None);
    let c1 = run("1");
    let c16 = run("16");
    // The series before the prepared protocol, for comparison with older entries.
    let c16_simple = run_pgbench(b, &url, &script, secs, "16", "simple", None);
    // With --tls, the same 16 clients on TLS (before the trigger below).
    let c16_tls = b
        .tls
        .as_deref()
        .map(|params| run_pgbench(b, &url, &script, secs, "16", "prepared", Some(params)));
    c.batch_execute(
        "CREATE FUNCTION bench_notify() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_notify('bench_events', json_build_object('id', NEW.id, 'v', NEW.v)::text); RETURN NULL; END $$;
         CREATE TRIGGER bench_notify AFTER UPDATE ON bench_kv FOR EACH ROW EXECUTE FUNCTION bench_notify();",
    )
    .await
    .unwrap();
    let n16 = run("16");
    let _ = std::fs::remove_file(&script);
    b.record("pgbench_tps_c1", round(c1, 0), "single-row UPDATE by key, 1 client");
    b.record("pgbench_tps_c16", round(c16, 0), "single-row UPDATE by key, 16 clients");
    b.record(
        "pgbench_tps_c16_simple",
        round(c16_simple, 0),
        "the same with the simple query protocol (the figure before 2026-11-27)",
    );
    if let Some(tls) = c16_tls {
        b.record(
            "pgbench_tps_c16_tls",
            round(tls, 0),
            "single-row UPDATE by key, 16 clients, TLS (verify-full)",
        );
    }
    b.record(
        "pgbench_notify_tps_c16",
        round(n16, 0),
        "the same with a pg_notify trigger, 16 clients",
    );
}

/// TPS of one pgbench run of `script` with `clients` clients, over the
/// query `protocol` (pgbench's `-M`). The yardstick is `prepared`: maasd's
/// statements are prepared too, and the peers' harness
/// (`../shared/peers/pgbench.sh`) measures its yardstick so, which makes the
/// ratios comparable; `simple` costs pgbench about a fifth of its rate
/// here. Plain
/// without `tls`, even where the cluster serves TLS (libpq would prefer
/// it); with it, its parameters (the bench's URL parameters,
/// `sslmode=…&sslrootcert=…`) as libpq's environment.
fn run_pgbench(
    b: &Bench,
    url: &str,
    script: &std::path::Path,
    secs: &str,
    clients: &str,
    protocol: &str,
    tls: Option<&str>,
) -> f64 {
    let mut cmd = Command::new(b.cluster.binary("pgbench"));
    match tls {
        None => {
            cmd.env("PGSSLMODE", "disable");
        }
        Some(params) => {
            for (k, v) in params.split('&').filter_map(|kv| kv.split_once('=')) {
                match k {
                    "sslmode" => cmd.env("PGSSLMODE", v),
                    "sslrootcert" => cmd.env("PGSSLROOTCERT", v),
                    _ => &mut cmd,
                };
            }
        }
    }
    let out = cmd
        .args([
            "-n",
            "-h",
            "127.0.0.1",
            "-p",
            &b.cluster.port.to_string(),
            "-U",
            "postgres",
        ])
        .args([
            "-M",
            protocol,
            "-c",
            clients,
            "-j",
            if clients == "1" { "1" } else { "2" },
            "-T",
            secs,
        ])
        .arg("-f")
        .arg(script)
        // The database's name, without the URL's parameters (--tls).
        .arg(url.split('?').next().unwrap().rsplit('/').next().unwrap())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("pgbench said: {text}{}", String::from_utf8_lossy(&out.stderr)))
}

/// Records `line` = `top ÷ bottom` (two decimals) when both were measured.
fn record_ratio(b: &mut Bench, num: &dyn Fn(&str) -> Option<f64>, line: &str, (top, bottom): (&str, &str), note: &str) {
    if let (Some(x), Some(y)) = (num(top), num(bottom)) {
        b.record(line, round(x / y, 2), note);
    }
}

/// With `--tls`: the must lines both ways, from the runs with and without
/// TLS of this run.
fn tls_must_lines(b: &mut Bench, num: &dyn Fn(&str) -> Option<f64>) {
    record_ratio(
        b,
        num,
        "stage_exec_per_pgbench_tps_tls",
        ("stage_exec_per_s", "pgbench_tps_c16_tls"),
        "stage executions/s ÷ pgbench TPS, maasd and pgbench both on TLS (verify-full)",
    );
    record_ratio(
        b,
        num,
        "stage_exec_per_pgbench_tps_no_tls",
        ("stage_exec_per_s_no_tls_mean", "pgbench_tps_c16"),
        "the same, both without TLS (maasd: mean of the runs before and after)",
    );
    for (line, from) in [
        ("pickup_p50_ms_tls", "pickup_p50_ms"),
        ("pickup_p99_ms_tls", "pickup_p99_ms"),
    ] {
        if let Some(v) = num(from) {
            b.record(line, v, "insert commit → claim committed, every connection on TLS");
        }
    }
}

/// Rows a daemon may hold per stage in the throughput runs. With an
/// instant provider nothing else bounds the work in flight, and larger
/// batches cost the database less per row; the default (256) is measured
/// too, as `stage_exec_per_s_default_concurrency`.
const THROUGHPUT_CONCURRENCY: usize = 1024;

/// Bulk insert, then time until every request is COMPLETED. `concurrency`:
/// per stage, else the default.
async fn throughput(b: &mut Bench, http: bool, concurrency: Option<usize>) -> f64 {
    let n: i64 = if http && b.quick { 10_000 } else { 20_000 };
    let url = b.fresh_db(if http { "throughput_http" } else { "throughput" }).await;
    let fake = if http {
        Some(analysis_provider(None).await)
    } else {
        None
    };
    let mut opts = Opts::default().env("RUST_LOG", "warn");
    if let Some(conc) = concurrency {
        opts = opts
            .env("MAAS_CONCURRENCY__ANALYZE", conc)
            .env("MAAS_CONCURRENCY__ASSEMBLE", conc)
            .env("MAAS_CONCURRENCY__RESPOND", conc);
    }
    if let Some(f) = &fake {
        opts = on_provider(opts, &f.openai_base_url(), "bench")
            .env("MAAS_LLM__ANALYZER__MAX_CONCURRENCY", 256)
            .env("MAAS_LLM__RESPONDER__MAX_CONCURRENCY", 256);
    }
    let mut d = start_daemon(&url, opts).await;
    let c = connect(&url).await;
    // What a part of the schema costs: statements run on the migrated
    // database before the run (e.g. a trigger dropped), for attribution
    // only (docs/benchmarks.md).
    if let Ok(sql) = std::env::var("MAAS_BENCH_PROBE_SQL") {
        c.batch_execute(&sql).await.unwrap();
    }
    let writes_before = writes::rows_written(&c).await;
    insert_requests(&c, n, "benchmark query number ").await;
    let postmaster = cpu::postmaster(&b.cluster.data_dir);
    let daemon = d.pid().as_raw() as u32;
    let cpu_before = (cpu::seconds(postmaster), cpu::seconds(daemon));
    let elapsed = wait_all_completed(&c, &d, n, "throughput").await;
    let cpu_after = (cpu::seconds(postmaster), cpu::seconds(daemon));
    let writes_after = writes::rows_written(&c).await;
    d.kill();
    let per_request = (writes_after - writes_before) as f64 / n as f64;
    let stage_execs = 3.0 * n as f64 / elapsed;
    if concurrency.is_none() {
        b.record(
            "stage_exec_per_s_default_concurrency",
            round(stage_execs, 0),
            &format!("{n} requests, concurrency 256 per stage (the default)"),
        );
    } else if http {
        b.record(
            "stage_exec_per_s_http",
            round(stage_execs, 0),
            &format!("{n} requests, fake provider over HTTP (analyzer and responder calls)"),
        );
    } else {
        b.record(
            "requests_per_s",
            round(n as f64 / elapsed, 0),
            &format!("{n} requests inserted in one statement"),
        );
        b.record(
            "pg_cpu_us_per_request",
            round((cpu_after.0 - cpu_before.0) * 1e6 / n as f64, 0),
            "PostgreSQL's CPU per request while the daemon works (all its processes; /proc)",
        );
        b.record(
            "maasd_cpu_us_per_request",
            round((cpu_after.1 - cpu_before.1) * 1e6 / n as f64, 0),
            "maasd's CPU per request",
        );
        b.record(
            "stage_exec_per_s",
            round(stage_execs, 0),
            &format!("three stage executions per request, concurrency {THROUGHPUT_CONCURRENCY} per stage"),
        );
        b.record(
            "writes_per_request",
            round(per_request, 1),
            "row inserts + updates per request (pg_stat_user_tables), insert included",
        );
    }
    stage_execs
}

/// One request at a time: insert commit → claim, insert commit → COMPLETED,
/// both as seen by a LISTEN session.
/// Words of everyday topics, placed at ranks 50–113 of the generated
/// vocabulary (each in about 2–3 % of a user's turns); the memory request's
/// query asks about some of them.
const MEMORY_WORDS: &str = "garden travel budget sister lisbon march paint pottery dog hiking \
    concert piano school exam doctor recipe soup train flight hotel beach museum novel movie \
    birthday gift wedding camera bicycle marathon yoga coffee office meeting project deadline \
    salary rent apartment neighbour kitchen window winter summer autumn spring river mountain \
    lake forest island friend brother mother father cousin nephew daughter son teacher library";

/// The vocabulary the generated turns are written in: `size` words, the
/// everyday ones of [`MEMORY_WORDS`] at ranks 50–113, made-up words of two
/// syllables elsewhere. Turns draw from it log-uniformly (the word of rank
/// r with a probability ∝ 1/r, Zipf's law of natural text), so a few words
/// are in most turns and most words in few — as in a chat history, where a
/// query's topic words are rare and the speakers' names are everywhere.
fn memory_vocabulary(size: usize) -> String {
    const CONSONANTS: &[u8] = b"bcdfghjklmnprstvz";
    const VOWELS: &[u8] = b"aeiou";
    let syllable = |i: usize| {
        let c = CONSONANTS[i % CONSONANTS.len()] as char;
        let v = VOWELS[(i / CONSONANTS.len()) % VOWELS.len()] as char;
        format!("{c}{v}")
    };
    let everyday: Vec<&str> = MEMORY_WORDS.split_whitespace().collect();
    let per = CONSONANTS.len() * VOWELS.len();
    (1..=size)
        .map(|rank| match rank.checked_sub(50).and_then(|i| everyday.get(i)) {
            Some(w) => (*w).to_owned(),
            None => format!(
                "{}{}{}",
                syllable(rank),
                syllable(rank / per),
                syllable(rank / per / per)
            ),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Users with memory for the latency scenario: `users` users, each with
/// `turns` turns over 20 threads and `records` records, inserted with SQL
/// (the generated search columns and the archive trigger pay as for any
/// producer). Returns the user ids and one thread of each.
async fn load_memory(c: &Client, users: i64, turns: i64, records: i64) -> Vec<(Uuid, Uuid)> {
    let started = Instant::now();
    let words = memory_vocabulary(4_000);
    c.execute(
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content, created_at)
         SELECT ('00000000-0000-4000-a000-' || lpad(to_hex(u), 12, '0'))::uuid,
                ('00000000-0000-4000-b000-' || lpad(to_hex(u * 20 + t % 20), 12, '0'))::uuid,
                CASE WHEN t % 2 = 0 THEN 'user_query' ELSE 'assistant_response' END,
                CASE WHEN t % 2 = 0 THEN 'Alex: ' ELSE 'Sam: ' END ||
                (SELECT string_agg(w[least(array_length(w, 1), floor(exp((hashint8(u * 1000003 + t * 1009 + k)::int8 & 2147483647) / 2147483648.0 * ln(array_length(w, 1) + 1)))::int)], ' ')
                 FROM generate_series(1, 14) k, (SELECT string_to_array($3, ' ') AS w) words),
                now() - make_interval(mins => (turns.n - t)::int)
         FROM generate_series(0, $1::int8 - 1) u, generate_series(0, $2::int8 - 1) t,
              (SELECT $2::int8 AS n) turns",
        &[&users, &turns, &words],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO lsm_storage (user_id, time_bucket_start, time_bucket_end, tags, summary)
         SELECT ('00000000-0000-4000-a000-' || lpad(to_hex(u), 12, '0'))::uuid,
                now() - make_interval(days => r::int + 1), now() - make_interval(days => r::int),
                ARRAY['bench'],
                'The user talked about ' ||
                (SELECT string_agg(w[least(array_length(w, 1), floor(exp((hashint8(u * 1000003 + r * 1009 + k + 500)::int8 & 2147483647) / 2147483648.0 * ln(array_length(w, 1) + 1)))::int)], ', ')
                 FROM generate_series(1, 20) k, (SELECT string_to_array($3, ' ') AS w) words)
         FROM generate_series(0, $1::int8 - 1) u, generate_series(0, $2::int8 - 1) r",
        &[&users, &records, &words],
    )
    .await
    .unwrap();
    c.batch_execute("ANALYZE raw_logs; ANALYZE lsm_storage").await.unwrap();
    eprintln!(
        "latency: memory of {users} users ({} turns, {} records) loaded in {:.1} s",
        users * turns,
        users * records,
        started.elapsed().as_secs_f64()
    );
    (0..users)
        .map(|u| {
            let user = Uuid::parse_str(&format!("00000000-0000-4000-a000-{u:012x}")).unwrap();
            let thread = Uuid::parse_str(&format!("00000000-0000-4000-b000-{:012x}", u * 20)).unwrap();
            (user, thread)
        })
        .collect()
}

/// Pickup and end-to-end latency of sequential requests; one in three is
/// of a user with memory (in one of that user's threads, with words its
/// turns contain) and one in three the same request of a new user, so
/// retrieval's cost shows as the difference of those two.
async fn latency(b: &mut Bench) {
    let samples = if b.quick { 300 } else { 1000 };
    let (users, turns, records) = if b.quick {
        (100, 2_000, 200)
    } else {
        (1_000, 2_000, 200)
    };
    let url = b.fresh_db("latency").await;
    {
        let mut c = connect(&url).await;
        maas::db::migrate::migrate(&mut c, false).await.unwrap();
    }
    let with_memory = load_memory(&connect(&url).await, users, turns, records).await;
    // The `[memory]` settings of the caller's environment reach this daemon
    // (`MAAS_MEMORY__HITS=8 bin/bench --only=latency`), so a retrieval
    // setting's cost can be measured as it would run.
    let mut opts = Opts::default().env("RUST_LOG", "warn");
    for (k, v) in std::env::vars().filter(|(k, _)| k.starts_with("MAAS_MEMORY__")) {
        opts = opts.env(&k, v);
    }
    let mut d = start_daemon(&url, opts).await;
    let (_listener, mut rx) = listen(&url).await;
    let c = connect(&url).await;
    let insert = c.prepare(PROBE).await.unwrap();
    let insert_memory = c
        .prepare(
            "INSERT INTO pipeline_runs (user_id, thread_id, user_query)
             VALUES ($1, $2, 'What did my sister say about the pottery class and the trip to Lisbon?') RETURNING id",
        )
        .await
        .unwrap();
    // Three kinds, interleaved: a probe (a new user, no thread: pickup and
    // e2e), the memory request of a user with memory, and the same request
    // (same text, a thread of its own) of a new user without memory, so the
    // difference of the last two is what the memory costs and nothing else.
    let (mut pickup, mut e2e, mut e2e_memory, mut e2e_same) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut split = Vec::new();
    for i in 0..3 * (samples + 20) {
        let kind = i % 3;
        let memory = kind == 1;
        let id: Uuid = match kind {
            1 => {
                let (user, thread) = with_memory[(i / 3) % with_memory.len()];
                c.query_one(&insert_memory, &[&user, &thread]).await.unwrap().get(0)
            }
            2 => c
                .query_one(&insert_memory, &[&Uuid::new_v4(), &Uuid::new_v4()])
                .await
                .unwrap()
                .get(0),
            _ => c.query_one(&insert, &[&Uuid::new_v4()]).await.unwrap().get(0),
        };
        let t0 = Instant::now();
        let w0 = std::time::SystemTime::now();
        let (claimed, at) = claimed_and_completed(&mut rx, id).await;
        // The first 20 of each kind warm up connections and caches.
        if i >= 60 {
            let ms = (at - t0).as_secs_f64() * 1000.0;
            if memory {
                e2e_memory.push(ms);
            } else if kind == 2 {
                e2e_same.push(ms);
            } else {
                pickup.push(claimed.map_or(f64::NAN, |c| (c - t0).as_secs_f64() * 1000.0));
                if let Some(c) = claimed {
                    split.push((id, w0, w0 + (c - t0)));
                }
                e2e.push(ms);
            }
        }
    }
    d.kill();
    // Where a pickup's time goes: the claim statement's start by the
    // database's clock (its analyze step's `started_at`), against the
    // wall clock of this process when the insert returned and when the
    // claim's notification arrived (one machine, one clock).
    let (mut to_claim, mut claim_to_seen) = (Vec::new(), Vec::new());
    let epoch = |t: &std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    for (id, inserted, seen) in &split {
        let started: f64 = c
            .query_one(
                "SELECT extract(epoch FROM started_at)::float8 FROM pipeline_steps WHERE run_id = $1 AND stage = 'analyze'",
                &[id],
            )
            .await
            .unwrap()
            .get(0);
        to_claim.push((started - epoch(inserted)) * 1000.0);
        claim_to_seen.push((epoch(seen) - started) * 1000.0);
    }
    pickup.sort_by(f64::total_cmp);
    e2e.sort_by(f64::total_cmp);
    b.record(
        "pickup_p50_ms",
        round(percentile(&pickup, 0.5).unwrap_or(f64::NAN), 3),
        &format!("{samples} sequential requests"),
    );
    b.record(
        "pickup_p99_ms",
        round(percentile(&pickup, 0.99).unwrap_or(f64::NAN), 3),
        "insert commit → claim committed",
    );
    for (name, mut v, what) in [
        ("pickup_to_claim", to_claim, "insert commit → claim statement starts"),
        (
            "pickup_claim_to_seen",
            claim_to_seen,
            "claim statement starts → its notification seen",
        ),
    ] {
        v.sort_by(f64::total_cmp);
        b.record(
            &format!("{name}_p50_ms"),
            round(percentile(&v, 0.5).unwrap_or(f64::NAN), 3),
            what,
        );
        b.record(
            &format!("{name}_p99_ms"),
            round(percentile(&v, 0.99).unwrap_or(f64::NAN), 3),
            "",
        );
    }
    b.record(
        "e2e_p50_ms",
        round(percentile(&e2e, 0.5).unwrap_or(f64::NAN), 3),
        "insert commit → COMPLETED",
    );
    b.record("e2e_p99_ms", round(percentile(&e2e, 0.99).unwrap_or(f64::NAN), 3), "");
    e2e_memory.sort_by(f64::total_cmp);
    let memory_p50 = percentile(&e2e_memory, 0.5).unwrap_or(f64::NAN);
    b.record(
        "e2e_memory_p50_ms",
        round(memory_p50, 3),
        &format!("users with memory: {users} × {turns} turns, {records} records"),
    );
    b.record(
        "e2e_memory_p99_ms",
        round(percentile(&e2e_memory, 0.99).unwrap_or(f64::NAN), 3),
        "",
    );
    e2e_same.sort_by(f64::total_cmp);
    let same_p50 = percentile(&e2e_same, 0.5).unwrap_or(f64::NAN);
    b.record(
        "e2e_no_memory_p50_ms",
        round(same_p50, 3),
        "the same request (text, own thread) of new users without memory",
    );
    b.record(
        "e2e_memory_delta_p50_ms",
        round(memory_p50 - same_p50, 3),
        "with memory − the same request without, interleaved in one run (must < 1)",
    );
    b.record(
        "e2e_memory_delta_vs_probe_p50_ms",
        round(memory_p50 - percentile(&e2e, 0.5).unwrap_or(f64::NAN), 3),
        "with memory − the probe (sessions 4-6's difference: shorter text, no thread)",
    );
}

/// A session LISTENing on `pipeline_events` and the notifications it
/// receives, each with the instant it arrived.
async fn listen(url: &str) -> (Client, tokio::sync::mpsc::UnboundedReceiver<(Instant, String)>) {
    let (rest, tls) = maas::db::tls::split(url).unwrap();
    let (listener, mut conn) = rest
        .parse::<tokio_postgres::Config>()
        .unwrap()
        .connect(tls)
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, String)>();
    tokio::spawn(async move {
        let mut s = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = s.next().await {
            if let AsyncMessage::Notification(n) = m {
                let _ = tx.send((Instant::now(), n.payload().to_owned()));
            }
        }
    });
    listener.batch_execute("LISTEN pipeline_events").await.unwrap();
    (listener, rx)
}

/// A latency probe: a request of a new user (`$1`), no thread, a short text.
const PROBE: &str = "INSERT INTO pipeline_runs (user_id, user_query) VALUES ($1, 'latency probe') RETURNING id";

/// When request `id`'s claim (`ANALYZING`, if announced) and its
/// `COMPLETED` were received, from [`listen`]'s notifications (10 s at
/// most for each).
async fn claimed_and_completed(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(Instant, String)>,
    id: Uuid,
) -> (Option<Instant>, Instant) {
    let mut claimed = None;
    loop {
        let (at, payload) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("no notification within 10 s")
            .unwrap();
        let ev = maas::listener::parse_payload(&payload).unwrap();
        if ev.id != id {
            continue;
        }
        match ev.status.as_str() {
            "ANALYZING" => claimed = Some(at),
            "COMPLETED" => return (claimed, at),
            _ => {}
        }
    }
}

/// Pickup and end-to-end latency of new users' requests, one at a time,
/// with the semantic part of the memory as `bin/run` has it: the default
/// local model (found where maasd looks for it: `bin/run` and
/// `bin/eval-memory` fetch it), its embedder embedding every new turn in
/// the background. Skipped, with a line that says so, without the model.
async fn latency_default_embedder(b: &mut Bench) {
    let env = |k: &str| std::env::var(k).ok();
    let Some(dir) = maas::llm::embed::default_model_dir(&env).filter(|d| d.is_dir()) else {
        eprintln!("latency with the default embedder: skipped, no local model (bin/run fetches it)");
        return;
    };
    let samples = if b.quick { 300 } else { 1000 };
    let url = b.fresh_db("latency_embedder").await;
    let opts = Opts::default()
        .env("RUST_LOG", "warn")
        .env("MAAS_LLM__EMBEDDING__PROVIDER", "local")
        .env("MAAS_LLM__EMBEDDING__MODEL_DIR", dir.display());
    let mut d = start_daemon(&url, opts).await;
    let (_listener, mut rx) = listen(&url).await;
    let c = connect(&url).await;
    let insert = c.prepare(PROBE).await.unwrap();
    let (mut pickup, mut e2e) = (Vec::new(), Vec::new());
    for i in 0..samples + 20 {
        let id: Uuid = c.query_one(&insert, &[&Uuid::new_v4()]).await.unwrap().get(0);
        let t0 = Instant::now();
        let (claimed, at) = claimed_and_completed(&mut rx, id).await;
        // The first 20 warm up connections, caches and the model.
        if i >= 20 {
            pickup.push(claimed.map_or(f64::NAN, |c| (c - t0).as_secs_f64() * 1000.0));
            e2e.push((at - t0).as_secs_f64() * 1000.0);
        }
    }
    let embedded = count(&c, "SELECT count(*) FROM turn_embeddings").await;
    d.kill();
    pickup.sort_by(f64::total_cmp);
    e2e.sort_by(f64::total_cmp);
    let what =
        format!("{samples} new users' requests, the default local embedder on ({embedded} turns embedded meanwhile)");
    for (name, v, q, note) in [
        ("pickup_p50_ms_embedder", &pickup, 0.5, what.as_str()),
        ("pickup_p99_ms_embedder", &pickup, 0.99, ""),
        ("e2e_p50_ms_embedder", &e2e, 0.5, ""),
        ("e2e_p99_ms_embedder", &e2e, 0.99, ""),
    ] {
        b.record(name, round(percentile(v, q).unwrap_or(f64::NAN), 3), note);
    }
}

/// Requests against a provider that takes 1 s per call.
async fn llm_bound(b: &mut Bench) {
    // The LLM-bound scenario in both modes (12 s): with 2,000 requests the
    // ideal makespan is 5 s, and a few hundred milliseconds of start-up and
    // machine noise moved the ratio by 0.1 either way.
    let (n, conc) = (10_000i64, 1_000i64);
    let url = b.fresh_db("llm_bound").await;
    let fake = analysis_provider(Some(Duration::from_secs(1))).await;
    let opts = on_provider(Opts::default(), &fake.openai_base_url(), "bench")
        .env("RUST_LOG", "warn")
        .env("MAAS_CONCURRENCY__ANALYZE", conc)
        .env("MAAS_CONCURRENCY__RESPOND", conc)
        .env("MAAS_LLM__ANALYZER__MAX_CONCURRENCY", conc)
        .env("MAAS_LLM__RESPONDER__MAX_CONCURRENCY", conc);
    let mut d = start_daemon(&url, opts).await;
    let c = connect(&url).await;
    insert_requests(&c, n, "slow provider ").await;
    let pid = d.pid();
    let makespan = wait_all_completed(&c, &d, n, "LLM-bound").await;
    let rss = peak_rss_mb(pid.as_raw());
    d.kill();
    // Two sequential 1 s calls per request, `conc` at a time per stage,
    // pipelined: ceil(n / conc) waves plus one for the last responder wave.
    let ideal = ((n + conc - 1) / conc + 1) as f64;
    b.record(
        "llm_bound_makespan_ratio",
        round(makespan / ideal, 3),
        &format!("{n} requests, 1 s per call, concurrency {conc}: {makespan:.1} s vs ideal {ideal:.0} s"),
    );
    b.record(
        "maasd_peak_rss_mb",
        round(rss, 1),
        "VmHWM of maasd during the LLM-bound run",
    );
}

fn peak_rss_mb(pid: i32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Requests in flight, SIGKILL, a second daemon: how long until all complete,
/// and what was lost or written twice.
async fn recovery(b: &mut Bench) {
    let n: i64 = 1_000;
    let url = b.fresh_db("recovery").await;
    let fake = analysis_provider(Some(Duration::from_secs(2))).await;
    let opts = || {
        let opts = Opts {
            lease_secs: 3,
            sweep_secs: 1,
            ..Opts::default()
        };
        on_provider(opts, &fake.openai_base_url(), "bench")
            .env("RUST_LOG", "warn")
            .env("MAAS_CONCURRENCY__ANALYZE", n)
            .env("MAAS_CONCURRENCY__RESPOND", n)
            .env("MAAS_LLM__ANALYZER__MAX_CONCURRENCY", n)
            .env("MAAS_LLM__RESPONDER__MAX_CONCURRENCY", n)
    };
    let mut first = start_daemon(&url, opts()).await;
    let c = connect(&url).await;
    insert_requests(&c, n, "crash ").await;
    let in_flight = wait_count(
        &c,
        "SELECT count(*) FROM pipeline_runs WHERE status IN ('ANALYZING', 'RESPONDING')",
        n,
        Duration::from_secs(60),
    )
    .await;
    assert!(in_flight, "requests never all in flight");
    first.signal(Signal::SIGKILL);
    first.kill();
    let t0 = Instant::now();
    let mut second = start_daemon(&url, opts()).await;
    wait_count(
        &c,
        "SELECT count(*) FROM pipeline_runs WHERE status IN ('COMPLETED', 'FAILED')",
        n,
        Duration::from_secs(300),
    )
    .await;
    let secs = t0.elapsed().as_secs_f64();
    second.kill();
    let completed = count(&c, "SELECT count(*) FROM pipeline_runs WHERE status = 'COMPLETED'").await;
    let duplicates = count(
        &c,
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM pipeline_steps WHERE outcome = 'succeeded'
                                       GROUP BY run_id, stage HAVING count(*) > 1) s)
              + (SELECT count(*) FROM (SELECT 1 FROM raw_logs WHERE request_id IS NOT NULL
                                       GROUP BY request_id, message_type HAVING count(*) > 1) l)",
    )
    .await;
    b.record(
        "recovery_s",
        round(secs, 2),
        &format!("{n} in flight, SIGKILL, second daemon (lease 3 s)"),
    );
    b.record("recovery_lost", n - completed, "requests not COMPLETED afterwards");
    b.record(
        "recovery_duplicates",
        duplicates,
        "stages succeeded twice + log rows written twice",
    );
}

// ------------------------------------------------------------------- main

/// Runs `insert` (parameters: first and last row number, users) over rows
/// 1 to `logs` in slices of 50,000, one transaction each; the seconds it
/// took.
async fn insert_in_slices(c: &Client, insert: &str, logs: i64, users: i64) -> f64 {
    let started = Instant::now();
    let slice = 50_000i64;
    let mut from = 1i64;
    while from <= logs {
        let to = (from + slice - 1).min(logs);
        c.execute(insert, &[&from, &to, &users]).await.unwrap();
        from = to + 1;
    }
    started.elapsed().as_secs_f64()
}

/// The archivist at scale: raw logs over many users (1,000,000 over 10,000;
/// `--quick`: 100,000 over 1,000), each insert through the novelty trigger;
/// then candidate selection time (and its plan) and logs archived per second
/// with the instant offline provider, for a fixed time budget.
async fn archivist(b: &mut Bench) {
    use maas::archivist::{Archivist, Quiet, RunOptions, Trigger};
    use maas::repo::archive::select_candidates;
    let (logs, users): (i64, i64) = if b.quick { (100_000, 1_000) } else { (1_000_000, 10_000) };
    let url = b.fresh_db("archivist").await;
    let mut c = connect(&url).await;
    maas::db::migrate::migrate(&mut c, false).await.unwrap();
    // A third of the users were last active 40 days ago (outside A); the
    // rest within the last day. Inserted in slices so each transaction stays
    // reasonable; each row pays the trigger's UPSERT.
    let insert_s = insert_in_slices(
        &c,
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content, created_at)
             SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(g % $3), 12, '0'))::uuid,
                    ('00000000-0000-4000-9000-' || lpad(to_hex(g % ($3 * 4)), 12, '0'))::uuid,
                    CASE WHEN g % 2 = 0 THEN 'user_query' ELSE 'assistant_response' END,
                    'message ' || g || ' about gardening, travel plans and the weekly budget',
                    now() - CASE WHEN g % $3 % 3 = 0 THEN interval '40 days'
                                 ELSE make_interval(secs => (g % 86400)::float8) END
             FROM generate_series($1::int8, $2::int8) g",
        logs,
        users,
    )
    .await;
    // The same rows into a copy of raw_logs without the trigger (same
    // indexes and defaults, user_seq given): the trigger's cost on inserts.
    c.batch_execute("CREATE TABLE bench_plain_logs (LIKE raw_logs INCLUDING ALL)")
        .await
        .unwrap();
    let plain_s = insert_in_slices(
        &c,
        "INSERT INTO bench_plain_logs (user_id, thread_id, message_type, content, created_at, user_seq)
             SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(g % $3), 12, '0'))::uuid,
                    ('00000000-0000-4000-9000-' || lpad(to_hex(g % ($3 * 4)), 12, '0'))::uuid,
                    CASE WHEN g % 2 = 0 THEN 'user_query' ELSE 'assistant_response' END,
                    'message ' || g || ' about gardening, travel plans and the weekly budget',
                    now(), g
             FROM generate_series($1::int8, $2::int8) g",
        logs,
        users,
    )
    .await;
    c.batch_execute("DROP TABLE bench_plain_logs").await.unwrap();
    b.record(
        "archive_log_insert_plain_per_s",
        round(logs as f64 / plain_s, 0),
        "the same INSERTs into a copy of raw_logs without the trigger",
    );
    for table in ["raw_logs", "archive_marks"] {
        c.batch_execute(&format!("VACUUM ANALYZE {table}")).await.unwrap();
    }
    b.record(
        "archive_log_insert_per_s",
        round(logs as f64 / insert_s, 0),
        "raw_logs INSERT rate through the novelty trigger (one UPSERT per log)",
    );

    let cfg = maas::config::Config {
        database_url: maas::config::Secret(url.clone()),
        pool_size: 8,
        ..Default::default()
    };
    let thresholds = cfg.archivist.thresholds();
    let pool = maas::db::connect_pool(&cfg, "bench-archivist").unwrap();
    let client = pool.get().await.unwrap();
    let mut times = Vec::new();
    let mut selected = 0;
    for _ in 0..20 {
        let t = Instant::now();
        selected = select_candidates(&client, &thresholds, cfg.archivist.page_users)
            .await
            .unwrap()
            .len();
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    b.record(
        "archive_select_ms",
        round(percentile(&times, 0.5).unwrap_or(f64::NAN), 2),
        &format!("candidate selection, median of 20 ({selected} of {users} users selected, page limit)"),
    );
    let explain = maas::repo::statement("archive_candidates")
        .unwrap()
        .replace("$1", &cfg.archivist.min_pending.to_string())
        .replace("$2", &cfg.archivist.max_pending_age_secs.to_string())
        .replace("$3", &cfg.archivist.active_within_secs.to_string())
        .replace("$4", &cfg.archivist.cooldown_secs.to_string())
        .replace("$5", &cfg.archivist.page_users.to_string());
    let plan: Vec<String> = c
        .query(&format!("EXPLAIN (ANALYZE, COSTS OFF) {explain}"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let scan = plan
        .iter()
        .find(|l| l.contains("Scan"))
        .map(|l| l.trim().to_owned())
        .unwrap_or_default();
    b.record(
        "archive_select_plan",
        scan,
        "the selection's scan: archive_marks only, never raw_logs",
    );
    drop(client);

    let llm = std::sync::Arc::new(maas::llm::Llm::from_config(&cfg.llm, "offline").unwrap());
    let archivist = Archivist::new(pool, llm, std::sync::Arc::new(cfg.clone()), "bench".into());
    let budget = Duration::from_secs(if b.quick { 20 } else { 60 });
    let cancel = tokio_util::sync::CancellationToken::new();
    let stopper = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(budget).await;
        stopper.cancel();
    });
    let t = Instant::now();
    let opts = RunOptions {
        trigger: Trigger::Manual,
        user: None,
        dry_run: false,
        tick: None,
    };
    let report = archivist.run(opts, &Quiet, &cancel).await.unwrap();
    let secs = t.elapsed().as_secs_f64();
    let dup = count(
        &c,
        "SELECT count(*) FROM (SELECT u.lid FROM lsm_storage l, unnest(l.raw_log_ids) u(lid) GROUP BY u.lid HAVING count(*) > 1) d",
    )
    .await;
    assert_eq!(dup, 0, "a log archived twice");
    b.record(
        "archive_logs_per_s",
        round(report.logs as f64 / secs, 0),
        &format!(
            "logs archived per second, offline provider ({} logs, {} records, {} users in {:.0} s)",
            report.logs, report.records, report.users_archived, secs
        ),
    );
}

/// Turns TLS on for the cluster with a CA and a server certificate for
/// 127.0.0.1 made now; the URL parameters that verify it.
async fn serve_tls(cluster: &Cluster) -> String {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "maas bench CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let server = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server.signed_by(&server_key, &ca_cert, &ca_key).unwrap();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("maas-bench-tls");
    std::fs::create_dir_all(&dir).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    let c = cluster.clone();
    let (cert, key) = (server_cert.pem(), server_key.serialize_pem());
    tokio::task::spawn_blocking(move || {
        c.enable_tls(&cert, &key, None)?;
        c.restart(false)
    })
    .await
    .unwrap()
    .unwrap();
    format!("sslmode=verify-full&sslrootcert={}", ca_file.display())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --all-targets` runs bench binaries too, without `--bench`:
    // the benchmark only runs under `cargo bench` (bin/bench).
    if !args.iter().any(|a| a == "--bench") {
        println!("maas benchmark: run it with bin/bench (cargo bench --bench maas)");
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let json = args.iter().any(|a| a == "--json");
    let only: Option<String> = args.iter().find_map(|a| a.strip_prefix("--only=").map(str::to_owned));
    let tls = args.iter().any(|a| a == "--tls");
    let console_rows: Option<i64> = args
        .iter()
        .find_map(|a| a.strip_prefix("--console-rows=")?.parse().ok());
    support::runtime().block_on(async move {
        let cluster = support::start_cluster("maas-bench-pg", 300).await;
        let tls = if tls { Some(serve_tls(&cluster).await) } else { None };
        let mut b = Bench {
            cluster,
            quick,
            tls,
            results: Vec::new(),
        };
        let started = Instant::now();
        let want = |name: &str| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == name));
        if want("pgbench") {
            pgbench(&mut b).await;
        }
        if want("throughput") {
            // With --tls: without TLS first (a warm-up for the cluster), then
            // with, then without again; the ratio is against the mean of the
            // two, so the order of the runs does not make the difference.
            let mut without = Vec::new();
            if b.tls.is_some() {
                let first = b.results.len();
                let tls = b.tls.take();
                without.push(throughput(&mut b, false, Some(THROUGHPUT_CONCURRENCY)).await);
                b.tls = tls;
                b.results.truncate(first);
            }
            let with = throughput(&mut b, false, Some(THROUGHPUT_CONCURRENCY)).await;
            if b.tls.is_some() {
                let first = b.results.len();
                let tls = b.tls.take();
                without.push(throughput(&mut b, false, Some(THROUGHPUT_CONCURRENCY)).await);
                b.tls = tls;
                for r in &mut b.results[first..] {
                    r.0.push_str("_no_tls");
                }
                let mean = without.iter().sum::<f64>() / without.len() as f64;
                b.record(
                    "stage_exec_per_s_no_tls_mean",
                    round(mean, 0),
                    "mean of the runs without TLS before and after the TLS run",
                );
                b.record(
                    "tls_throughput_ratio",
                    round(with / mean, 2),
                    "stage executions/s with TLS (verify-full) ÷ without (mean of before and after), same run",
                );
            }
            throughput(&mut b, false, None).await;
            throughput(&mut b, true, Some(THROUGHPUT_CONCURRENCY)).await;
        }
        if want("writes") {
            writes::writes(&mut b).await;
        }
        if want("latency") {
            // With --tls: without TLS first (lines ending `_no_tls`), then with.
            if b.tls.is_some() {
                let first = b.results.len();
                let tls = b.tls.take();
                latency(&mut b).await;
                b.tls = tls;
                for r in &mut b.results[first..] {
                    r.0.push_str("_no_tls");
                }
            }
            latency(&mut b).await;
            latency_default_embedder(&mut b).await;
        }
        if want("llm") {
            llm_bound(&mut b).await;
        }
        if want("recovery") {
            recovery(&mut b).await;
        }
        if want("archivist") {
            archivist(&mut b).await;
        }
        if want("assembler") {
            assembler::assembler(&mut b).await;
        }
        if want("console") {
            console::console(&mut b, console_rows).await;
        }
        memory_scale::when_asked(&mut b, only.as_deref()).await;
        if want("mcp") {
            mcp::mcp(&mut b).await;
        }
        if want("streaming") {
            streaming::streaming(&mut b).await;
        }
        if want("openai") {
            openai::openai(&mut b).await;
        }
        let values: HashMap<String, f64> = b
            .results
            .iter()
            .filter_map(|(k, v, _)| v.as_f64().map(|f| (k.clone(), f)))
            .collect();
        let num = |k: &str| values.get(k).copied();
        record_ratio(
            &mut b,
            &num,
            "stage_exec_per_notify_tps",
            ("stage_exec_per_s", "pgbench_notify_tps_c16"),
            "stage executions per second ÷ pgbench TPS with a NOTIFY trigger",
        );
        record_ratio(
            &mut b,
            &num,
            "stage_exec_per_pgbench_tps",
            ("stage_exec_per_s", "pgbench_tps_c16"),
            "stage executions per second ÷ plain pgbench TPS",
        );
        if b.tls.is_some() {
            tls_must_lines(&mut b, &num);
        }
        let mut table = String::new();
        let _ = writeln!(table, "{:<28} {:>12}  note", "metric", "value");
        for (k, v, note) in &b.results {
            let _ = writeln!(table, "{k:<28} {:>12}  {note}", v.to_string());
        }
        let _ = writeln!(
            table,
            "(mode: {}{}, {:.0} s)",
            if quick { "quick" } else { "full" },
            if b.tls.is_some() { ", TLS" } else { "" },
            started.elapsed().as_secs_f64()
        );
        print!("{table}");
        if json {
            let mut obj = serde_json::Map::new();
            obj.insert("mode".into(), json!(if quick { "quick" } else { "full" }));
            for (k, v, _) in &b.results {
                obj.insert(k.clone(), v.clone());
            }
            println!("{}", Value::Object(obj));
        }
        // The cluster stays on disk for the next run, but not running.
        support::stop_cluster(b.cluster).await;
    });
}
