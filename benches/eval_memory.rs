//! The memory benchmark behind `bin/eval-memory`: evidence recall of the
//! assembled context on conversations in the LoCoMo format, through the real
//! pipeline.
//!
//! `cargo bench --bench eval_memory -- [--json] [--concurrency N] [--wait-secs S] FILE...`
//!
//! - PostgreSQL: a private cluster under the target directory, a fresh
//!   database `eval_memory` each run (stopped at the end).
//! - One real `maasd`; its provider is what the environment configures
//!   (`MAAS_*`, `OPENAI_*`, `ANTHROPIC_*`, `GEMINI_*` are passed through),
//!   the offline provider when nothing is set. Its archivist schedule is off:
//!   the benchmark runs the archivist itself.
//! - Loading: each conversation is one user; each session one thread; every
//!   turn one `raw_logs` row (request_id NULL): the conversation's first
//!   speaker (`speaker_a`) `user_query`, the second `assistant_response`,
//!   content `Name: text`, created_at = the session's date (read as UTC) plus
//!   one minute per turn. A turn pair is not merged into one row: LoCoMo's
//!   evidence names single turns, and a row per utterance is what the
//!   logger writes for a request's query and its answer alike.
//! - `maasctl archivist run --user U` for every user (thresholds do not
//!   apply; the dates are in the past).
//! - When `MAAS_LLM__EMBEDDING__PROVIDER` names a provider (`bin/eval-memory`
//!   sets the local one unless told otherwise), the run waits until maasd's
//!   embedder has embedded every loaded turn.
//! - Every question of categories 1–4 whose evidence names existing turns is
//!   submitted by `POST /api/query` as a request of its user in a new thread,
//!   `N` at a time (default 8), each followed to its end by the long-poll
//!   `GET /api/query/{id}/status?wait=…` (one deadline for the whole run).
//!   The latency is that of the client: from the POST to the terminal status.
//! - Score: a question scores when the text of every evidence turn (letters
//!   and digits only, lowercased) appears in the request's assembled context
//!   (`pipeline_runs.final_context_payload`); "any" when at least one does.
//! - The memory block: the context without its `<system>…</system>` and
//!   `<current_query>…</current_query>` sections, trimmed; its size is
//!   counted as the project counts for the offline provider and any model
//!   without a local tokenizer (one token per three bytes, rounded up), and
//!   with GPT-4o's tokenizer (o200k_base), which English fits about a third
//!   tighter.
//!
//! - The Russian paraphrase test (`tests/data/embeddings/paraphrase_ru.json`:
//!   Russian and mixed turns, and questions that share no word with their
//!   turn) runs beside: its turns are one more user's, embedded by the same
//!   maasd; each question goes to that maasd's memory search
//!   (`GET /api/users/{id}/memory/search`: the pipeline's retrieval, the
//!   question embedded by maasd's embedder, full text and embeddings fused
//!   with `memory.semantic_weight`), the daemon restarted for them with
//!   `memory.window` 0 (the turns are one thread a minute apart: a turn
//!   next to a better hit would come as its neighbour); it scores when its
//!   turn is among the first five hits. An English-only
//!   model finds few; full text alone finds none by design. (Asked as
//!   requests, the offline analyzer would decide first whether each
//!   question searches at all, and the figure would measure its Russian
//!   words instead of the model.)
//! - `embedding_model` is the model maasd stored with the turns'
//!   embeddings (`off` without any).
//!
//! - `MAAS_EVAL_MEMORY_APPROXIMATE=P` (a measurement of what the lists of
//!   large users cost in recall, nothing else sets it): every user is
//!   searched as a large one (`maas.memory_exact_turns` 0 for the
//!   database), with lists trained and assigned for every user once its
//!   turns are embedded (`maas::embedder::lists`), and `P` lists probed
//!   (`maas.memory_lists_probed`).
//!
//! Each question and its answer are logged as turns of the user, like any
//! request's; questions submitted later may find them in memory.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a benchmark fails loudly")]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "statistics over small counts"
)]

#[path = "../tests/it/support/daemon.rs"]
#[allow(dead_code, reason = "shared with the tests, which use more of it")]
mod daemon;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDateTime, TimeDelta, Utc};
use daemon::{Maasd, Opts};
use maas::db::devdb::{Cluster, ClusterSpec, ensure_database};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

const DB: &str = "eval_memory";

struct Args {
    json: bool,
    concurrency: usize,
    wait_secs: u64,
    files: Vec<String>,
}

fn usage() -> ! {
    eprintln!("usage: eval-memory [--json] [--concurrency N] [--wait-secs S] FILE...");
    std::process::exit(2);
}

fn parse_args() -> Args {
    let mut args = Args {
        json: false,
        concurrency: 8,
        wait_secs: 1800,
        files: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let (key, inline) = match a.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k.to_owned(), Some(v.to_owned())),
            _ => (a.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next()).unwrap_or_else(|| usage());
        match key.as_str() {
            "--json" => args.json = true,
            "--concurrency" => args.concurrency = value().parse().unwrap_or_else(|_| usage()),
            "--wait-secs" => args.wait_secs = value().parse().unwrap_or_else(|_| usage()),
            // `cargo bench` passes --bench to harness-less targets.
            "--bench" => {}
            f if !f.starts_with("--") => args.files.push(f.to_owned()),
            _ => usage(),
        }
    }
    if args.files.is_empty() || args.concurrency == 0 {
        usage();
    }
    args
}

// ------------------------------------------------------------- the data

struct Turn {
    thread: Uuid,
    kind: &'static str,
    content: String,
    at: DateTime<Utc>,
}

struct Question {
    user: Uuid,
    text: String,
    category: u64,
    /// The evidence turns' texts, normalised.
    evidence: Vec<String>,
}

struct Conversation {
    user: Uuid,
    turns: Vec<Turn>,
}

/// Letters and digits only, lowercased.
fn norm(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

/// "1:56 pm on 8 May, 2023", read as UTC.
fn session_date(s: &str) -> DateTime<Utc> {
    NaiveDateTime::parse_from_str(s.trim(), "%I:%M %p on %d %B, %Y")
        .unwrap_or_else(|e| panic!("session date {s:?}: {e}"))
        .and_utc()
}

/// Evidence entries as LoCoMo writes them: "D8:6; D9:17" is two ids,
/// "D:11:26" is D11:26, anything else that is no id ("D") is dropped.
fn evidence_ids(raw: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    for e in raw.iter().filter_map(Value::as_str) {
        for part in e.split([';', ',', ' ']).filter(|p| !p.is_empty()) {
            let rest = part.strip_prefix('D').unwrap_or("");
            let rest = rest.strip_prefix(':').unwrap_or(rest);
            if let Some((s, t)) = rest.split_once(':')
                && !s.is_empty()
                && !t.is_empty()
                && s.chars().chain(t.chars()).all(|c| c.is_ascii_digit())
            {
                out.push(format!("D{s}:{t}"));
            }
        }
    }
    out
}

/// One LoCoMo conversation: its turns and its scorable questions (category
/// 1–4, at least one evidence id, every one naming an existing turn).
fn load(path: &str) -> (Conversation, Vec<Question>, usize) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let conv: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON: {e}"));
    let first = conv["speaker_a"]
        .as_str()
        .unwrap_or_else(|| panic!("{path}: no speaker_a"));
    let user = Uuid::new_v4();
    let mut turns = Vec::new();
    let mut by_dia: HashMap<String, String> = HashMap::new();
    for n in 1.. {
        let Some(session) = conv.get(format!("session_{n}")).and_then(Value::as_array) else {
            break;
        };
        let date = conv[format!("session_{n}_date_time")]
            .as_str()
            .unwrap_or_else(|| panic!("{path}: session_{n} has no date"));
        let start = session_date(date);
        let thread = Uuid::new_v4();
        for (i, t) in session.iter().enumerate() {
            let speaker = t["speaker"].as_str().unwrap_or_default();
            let said = t["text"].as_str().unwrap_or_default();
            if let Some(dia) = t["dia_id"].as_str() {
                by_dia.insert(dia.to_owned(), said.to_owned());
            }
            turns.push(Turn {
                thread,
                kind: if speaker == first {
                    "user_query"
                } else {
                    "assistant_response"
                },
                content: format!("{speaker}: {said}"),
                at: start + TimeDelta::minutes(i64::try_from(i).unwrap()),
            });
        }
    }
    let mut questions = Vec::new();
    let mut dropped = 0;
    for q in conv["qa"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let category = q["category"].as_u64().unwrap_or(0);
        if !(1..=4).contains(&category) {
            continue;
        }
        let ids = evidence_ids(q["evidence"].as_array().map(Vec::as_slice).unwrap_or_default());
        let evidence: Option<Vec<String>> = ids.iter().map(|id| by_dia.get(id).map(|t| norm(t))).collect();
        match evidence {
            Some(evidence) if !evidence.is_empty() => questions.push(Question {
                user,
                text: q["question"].as_str().unwrap_or_default().to_owned(),
                category,
                evidence,
            }),
            _ => dropped += 1,
        }
    }
    (Conversation { user, turns }, questions, dropped)
}

async fn insert_turns(db: &Client, c: &Conversation) {
    let users: Vec<Uuid> = c.turns.iter().map(|_| c.user).collect();
    let threads: Vec<Uuid> = c.turns.iter().map(|t| t.thread).collect();
    let kinds: Vec<&str> = c.turns.iter().map(|t| t.kind).collect();
    let contents: Vec<&str> = c.turns.iter().map(|t| t.content.as_str()).collect();
    let ats: Vec<DateTime<Utc>> = c.turns.iter().map(|t| t.at).collect();
    db.execute(
        "INSERT INTO raw_logs (user_id, thread_id, message_type, content, created_at)
         SELECT u, th, k, c, at FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::timestamptz[])
             WITH ORDINALITY AS t(u, th, k, c, at, n)
         ORDER BY n",
        &[&users, &threads, &kinds, &contents, &ats],
    )
    .await
    .unwrap();
}

// ------------------------------------------- the Russian paraphrase test

/// Hits a paraphrase question's turn must be among.
const RUSSIAN_TOP: usize = 5;

#[derive(serde::Deserialize)]
struct Paraphrases {
    turns: Vec<ParaphraseTurn>,
    questions: Vec<ParaphraseQuestion>,
}

#[derive(serde::Deserialize)]
struct ParaphraseTurn {
    id: String,
    text: String,
}

#[derive(serde::Deserialize)]
struct ParaphraseQuestion {
    question: String,
    evidence: String,
}

/// The paraphrase test's turns as one conversation (one thread, a minute
/// apart), and its data.
fn russian_test() -> (Conversation, Paraphrases) {
    let p: Paraphrases =
        serde_json::from_str(include_str!("../tests/data/embeddings/paraphrase_ru.json")).expect("paraphrase_ru.json");
    let (user, thread) = (Uuid::new_v4(), Uuid::new_v4());
    let start = Utc::now() - TimeDelta::days(30);
    let turns = p
        .turns
        .iter()
        .enumerate()
        .map(|(i, t)| Turn {
            thread,
            kind: "user_query",
            content: t.text.clone(),
            at: start + TimeDelta::minutes(i64::try_from(i).unwrap()),
        })
        .collect();
    (Conversation { user, turns }, p)
}

/// How many of the paraphrase questions find their turn among the first
/// [`RUSSIAN_TOP`] hits of the memory search of the maasd at `base` (`GET
/// /api/users/{id}/memory/search`: the pipeline's retrieval, embedded by
/// maasd's embedder and weighted by its configuration, as the English
/// questions' contexts are), counting the items that matched the question
/// (`why` = `hit`), not a hit's neighbours.
async fn russian_recall(http: &reqwest::Client, base: &str, user: Uuid, p: &Paraphrases) -> usize {
    let mut found = 0;
    for q in &p.questions {
        let Some(turn) = p.turns.iter().find(|t| t.id == q.evidence) else {
            continue;
        };
        let resp = http
            .get(format!("{base}/api/users/{user}/memory/search"))
            .query(&[("q", q.question.as_str()), ("limit", &RUSSIAN_TOP.to_string())])
            .send()
            .await
            .expect("the memory search");
        let status = resp.status();
        let body: Value = resp.json().await.expect("the memory search's JSON");
        assert!(status.is_success(), "the memory search: HTTP {status}: {body}");
        let hits = body["hits"].as_array().map(Vec::as_slice).unwrap_or_default();
        found += usize::from(
            hits.iter()
                .filter(|h| h["why"] == "hit")
                .any(|h| h["content"] == turn.text.as_str()),
        );
    }
    found
}

/// The model maasd embedded the turns with (`off` when it embedded none).
async fn embedding_model(db: &Client) -> String {
    let models: Vec<String> = db
        .query("SELECT DISTINCT model FROM turn_embeddings ORDER BY 1", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    if models.is_empty() {
        "off".to_owned()
    } else {
        models.join(", ")
    }
}

// ------------------------------------------------------------- the runs

struct Outcome {
    latency: Duration,
    id: Option<Uuid>,
    error: Option<String>,
}

async fn ask(http: reqwest::Client, base: String, q: (Uuid, String), deadline: Instant) -> Outcome {
    let started = Instant::now();
    let fail = |e: String| Outcome {
        latency: started.elapsed(),
        id: None,
        error: Some(e),
    };
    let body = json!({"user_id": q.0, "thread_id": Uuid::new_v4(), "query": q.1});
    let resp = match http.post(format!("{base}/api/query")).json(&body).send().await {
        Ok(r) if r.status().as_u16() == 202 => r,
        Ok(r) => return fail(format!("submit: HTTP {}", r.status())),
        Err(e) => return fail(format!("submit: {e}")),
    };
    let Some(id) = resp
        .json::<Value>()
        .await
        .ok()
        .and_then(|v| v["request_id"].as_str().and_then(|s| s.parse::<Uuid>().ok()))
    else {
        return fail("submit: no request_id in the reply".into());
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Outcome {
                latency: started.elapsed(),
                id: Some(id),
                error: Some("not finished by the deadline".into()),
            };
        }
        let wait = left.min(Duration::from_secs(20)).as_millis();
        let url = format!("{base}/api/query/{id}/status?wait={wait}ms");
        let state = match http.get(url).send().await {
            Ok(r) => r.json::<Value>().await.ok(),
            Err(_) => None,
        };
        if let Some(s) = &state
            && s["status"].as_str().is_some_and(|s| s != "processing")
        {
            return Outcome {
                latency: started.elapsed(),
                id: Some(id),
                error: None,
            };
        }
        if state.is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The context without its system and query sections, trimmed.
fn memory_block(context: &str) -> String {
    let mut s = context.to_owned();
    if let Some(a) = s.find("<system>")
        && let Some(b) = s[a..].find("</system>")
    {
        s.replace_range(a..a + b + "</system>".len(), "");
    }
    if let Some(a) = s.rfind("<current_query>")
        && let Some(b) = s[a..].find("</current_query>")
    {
        s.replace_range(a..a + b + "</current_query>".len(), "");
    }
    s.trim().to_owned()
}

fn tokens(text: &str) -> usize {
    text.len().div_ceil(3)
}

fn pct<T: Copy + Ord + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn passthrough_env() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, _)| {
            (k.starts_with("MAAS_")
                || ["OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_"]
                    .iter()
                    .any(|p| k.starts_with(p)))
                && !matches!(k.as_str(), "MAAS_HTTP_ADDR" | "MAAS_CONFIG" | "MAAS_ROOT")
        })
        .collect()
}

/// Every user's lists, trained and assigned as the embedder does for a
/// large user (`MAAS_EVAL_MEMORY_APPROXIMATE`).
async fn train_lists(url: &str) {
    let cfg = maas::config::Config {
        database_url: maas::config::Secret(url.to_owned()),
        ..Default::default()
    };
    let pool = maas::db::connect_pool(&cfg, "eval-memory").unwrap();
    let client = pool.get().await.unwrap();
    let users = client
        .query("SELECT DISTINCT user_id, model, dims FROM turn_embeddings", &[])
        .await
        .unwrap();
    let mut lists = 0;
    for u in &users {
        let model: String = u.get(1);
        lists += maas::embedder::lists::train(&client, u.get(0), &model, u.get(2))
            .await
            .unwrap();
        maas::embedder::lists::assign_all(&client, &model).await.unwrap();
    }
    eprintln!("eval-memory: {lists} lists trained for {} users", users.len());
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs bench
    // targets without it, and a test run must not start an evaluation.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("eval_memory: not run under `cargo bench` (use bin/eval-memory); nothing to do");
        return;
    }
    let args = parse_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let ok = rt.block_on(run(args));
    rt.shutdown_timeout(Duration::from_secs(5));
    std::process::exit(i32::from(!ok));
}

#[allow(clippy::too_many_lines, reason = "one scenario, read top to bottom")]
async fn run(args: Args) -> bool {
    let t0 = Instant::now();
    let mut conversations = Vec::new();
    let mut questions = Vec::new();
    let mut dropped = 0;
    for f in &args.files {
        let (c, q, d) = load(f);
        conversations.push(c);
        questions.extend(q);
        dropped += d;
    }

    let spec = ClusterSpec {
        dir: std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("maas-eval-pg"),
        port: None,
        durable: false,
        max_connections: 100,
    };
    let cluster = tokio::task::spawn_blocking(move || Cluster::ensure(&spec))
        .await
        .unwrap()
        .unwrap();
    let admin_url = cluster.url("postgres");
    let (admin, conn) = tokio_postgres::connect(&admin_url, NoTls).await.unwrap();
    tokio::spawn(conn);
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)"))
        .await
        .unwrap();
    drop(admin);
    ensure_database(&admin_url, DB).await.unwrap();
    let url = cluster.url(DB);
    let approximate = std::env::var("MAAS_EVAL_MEMORY_APPROXIMATE")
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok());
    if let Some(probed) = approximate {
        let (admin, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
        tokio::spawn(conn);
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {DB} SET maas.memory_exact_turns = '0';
                 ALTER DATABASE {DB} SET maas.memory_lists_probed = '{probed}'"
            ))
            .await
            .unwrap();
    }

    let daemon = || {
        let mut opts = Opts::default()
            .env("RUST_LOG", "warn,maas::http=info")
            .env("MAAS_ARCHIVIST__ENABLED", "false");
        for (k, v) in passthrough_env() {
            opts = opts.env(&k, v);
        }
        opts
    };
    let provider = std::env::var("MAAS_LLM_PROVIDER").unwrap_or_else(|_| "offline".into());
    let mut maasd = Maasd::spawn(&url, daemon());
    let addr = maasd.http_addr(Duration::from_secs(120)).await;
    let base = format!("http://{addr}");
    let (db, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(conn);

    // Load.
    let t_load = Instant::now();
    for c in &conversations {
        insert_turns(&db, c).await;
    }
    let (russian, paraphrases) = russian_test();
    insert_turns(&db, &russian).await;
    let turns: usize = conversations.iter().map(|c| c.turns.len()).sum();
    let load_ms = t_load.elapsed().as_millis();

    // Archive every user.
    let t_arch = Instant::now();
    let mut jobs = Vec::new();
    for c in &conversations {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_maasctl"));
        cmd.args(["archivist", "run", "--user", &c.user.to_string()])
            .env("DATABASE_URL", &url)
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null());
        for (k, v) in passthrough_env() {
            cmd.env(k, v);
        }
        jobs.push(cmd.output());
    }
    for out in futures_util::future::join_all(jobs).await {
        let out = out.unwrap();
        assert!(
            out.status.success(),
            "maasctl archivist run failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let archive_ms = t_arch.elapsed().as_millis();
    let records: i64 = db
        .query_one("SELECT count(*) FROM lsm_storage", &[])
        .await
        .unwrap()
        .get(0);

    // Embeddings, when on: every loaded turn has its embedding before the
    // first question (the embedder service of maasd makes them).
    let embedding = std::env::var("MAAS_LLM__EMBEDDING__PROVIDER")
        .ok()
        .filter(|p| !p.trim().is_empty() && !p.trim().eq_ignore_ascii_case("off"));
    let t_embed = Instant::now();
    if embedding.is_some() {
        let until = Instant::now() + Duration::from_secs(args.wait_secs);
        loop {
            let left: i64 = db
                .query_one(
                    "SELECT count(*) FROM raw_logs r WHERE NOT EXISTS \
                     (SELECT 1 FROM turn_embeddings e WHERE e.turn_id = r.id)",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if left == 0 {
                break;
            }
            assert!(
                Instant::now() < until,
                "{left} turns still without an embedding after {} s (see maasd's log)",
                args.wait_secs
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    if embedding.is_some() && approximate.is_some() {
        train_lists(&url).await;
    }
    let embed_ms = t_embed.elapsed().as_millis();

    // Ask.
    let t_ask = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(args.wait_secs);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let gate = Arc::new(Semaphore::new(args.concurrency));
    let mut tasks = Vec::new();
    for q in &questions {
        let (http, base, gate) = (http.clone(), base.clone(), Arc::clone(&gate));
        let item = (q.user, q.text.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            ask(http, base, item, deadline).await
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    let ask_ms = t_ask.elapsed().as_millis();
    // The paraphrases are asked of the same daemon restarted with no
    // neighbours (`memory.window` 0): their turns are one thread a minute
    // apart, and a turn next to a better hit would come as its neighbour,
    // not as a hit of its own rank.
    maasd.kill();
    let mut maasd = Maasd::spawn(&url, daemon().env("MAAS_MEMORY__WINDOW", 0));
    let base = format!("http://{}", maasd.http_addr(Duration::from_secs(120)).await);
    let russian_found = russian_recall(&http, &base, russian.user, &paraphrases).await;
    let embedding_model = embedding_model(&db).await;
    let russian_n = paraphrases.questions.len();

    // Score.
    let ids: Vec<Uuid> = outcomes.iter().filter_map(|o| o.id).collect();
    let rows = db
        .query(
            "SELECT id, status, final_context_payload FROM pipeline_runs WHERE id = ANY($1)",
            &[&ids],
        )
        .await
        .unwrap();
    let runs: HashMap<Uuid, (String, Option<String>)> = rows.iter().map(|r| (r.get(0), (r.get(1), r.get(2)))).collect();
    let (mut all, mut any, mut completed) = (0usize, 0usize, 0usize);
    let mut per_cat: BTreeMap<u64, (usize, usize, usize)> = BTreeMap::new();
    let mut memory = Vec::new();
    let mut memory_o200k = Vec::new();
    let bpe = tiktoken_rs::o200k_base_singleton();
    let mut context_tokens = Vec::new();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for (q, o) in questions.iter().zip(&outcomes) {
        if let Some(e) = &o.error {
            *errors.entry(e.clone()).or_default() += 1;
        }
        let run = o.id.and_then(|id| runs.get(&id));
        let status = run.map_or("MISSING", |r| r.0.as_str());
        if status == "COMPLETED" {
            completed += 1;
        } else {
            *errors.entry(format!("status {status}")).or_default() += 1;
        }
        let context = run.and_then(|r| r.1.as_deref()).unwrap_or_default();
        let text = norm(context);
        let found = q.evidence.iter().filter(|e| text.contains(e.as_str())).count();
        let c = per_cat.entry(q.category).or_default();
        c.2 += 1;
        if found == q.evidence.len() {
            all += 1;
            c.0 += 1;
        }
        if found > 0 {
            any += 1;
            c.1 += 1;
        }
        let block = memory_block(context);
        memory.push(tokens(&block));
        memory_o200k.push(bpe.encode_ordinary(&block).len());
        context_tokens.push(tokens(context));
    }
    memory.sort_unstable();
    memory_o200k.sort_unstable();
    context_tokens.sort_unstable();
    let mut latencies: Vec<u128> = outcomes.iter().map(|o| o.latency.as_micros()).collect();
    latencies.sort_unstable();
    let n = questions.len().max(1) as f64;
    let ms = |us: u128| (us as f64 / 100.0).round() / 10.0;
    let ratio = |a: usize, b: usize| ((a as f64 / b.max(1) as f64) * 1000.0).round() / 1000.0;
    let report = json!({
        "files": args.files.len(),
        "provider": provider,
        "embedding": embedding.as_deref().unwrap_or("off"),
        "embedding_model": embedding_model,
        "users": conversations.len(),
        "turns": turns,
        "records": records,
        "questions": questions.len(),
        "questions_dropped": dropped,
        "recall_all": ratio(all, n as usize),
        "recall_any": ratio(any, n as usize),
        "russian_questions": russian_n,
        "russian_recall_top5": ratio(russian_found, russian_n),
        "per_category": per_cat.iter().map(|(k, (a, y, t))| (k.to_string(), json!({
            "questions": t, "recall_all": ratio(*a, *t), "recall_any": ratio(*y, *t)
        }))).collect::<serde_json::Map<_, _>>(),
        "memory_tokens_p50": pct(&memory, 0.5),
        "memory_tokens_max": memory.last().copied().unwrap_or(0),
        "memory_tokens_o200k_p50": pct(&memory_o200k, 0.5),
        "memory_tokens_o200k_max": memory_o200k.last().copied().unwrap_or(0),
        "context_tokens_p50": pct(&context_tokens, 0.5),
        "latency_ms_p50": ms(pct(&latencies, 0.5)),
        "latency_ms_p99": ms(pct(&latencies, 0.99)),
        "completed": completed,
        "errors": errors,
        "concurrency": args.concurrency,
        "load_ms": load_ms,
        "archive_ms": archive_ms,
        "embed_ms": embed_ms,
        "ask_ms": ask_ms,
        "total_secs": t0.elapsed().as_secs(),
    });
    maasd.kill();
    let stop = cluster.clone();
    let _ = tokio::task::spawn_blocking(move || stop.stop(false)).await;

    if args.json {
        println!("{report}");
    } else {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "eval-memory: {} users, {turns} turns, {records} records, {} questions ({} left out: no evidence, or evidence naming no turn), provider {provider}, embeddings {} ({embedding_model})",
            conversations.len(),
            questions.len(),
            dropped,
            embedding.as_deref().unwrap_or("off")
        );
        let _ = writeln!(
            s,
            "recall (all evidence) {:.3}   recall (any evidence) {:.3}   Russian paraphrases (top {RUSSIAN_TOP}) {:.3} ({russian_found}/{russian_n})",
            ratio(all, questions.len()),
            ratio(any, questions.len()),
            ratio(russian_found, russian_n)
        );
        for (k, (a, y, t)) in &per_cat {
            let name = match k {
                1 => "multi-hop",
                2 => "temporal",
                3 => "open-domain",
                4 => "single-hop",
                _ => "other",
            };
            let _ = writeln!(
                s,
                "  category {k} {name:<12} {t:>4} questions  all {:.3}  any {:.3}",
                ratio(*a, *t),
                ratio(*y, *t)
            );
        }
        let _ = writeln!(
            s,
            "memory block tokens p50 {} max {} (o200k: p50 {} max {})   context tokens p50 {}",
            report["memory_tokens_p50"],
            report["memory_tokens_max"],
            report["memory_tokens_o200k_p50"],
            report["memory_tokens_o200k_max"],
            report["context_tokens_p50"]
        );
        let _ = writeln!(
            s,
            "latency p50 {} ms p99 {} ms ({} at a time)   COMPLETED {completed}/{}",
            report["latency_ms_p50"],
            report["latency_ms_p99"],
            args.concurrency,
            questions.len()
        );
        let _ = writeln!(
            s,
            "load {load_ms} ms, archivist {archive_ms} ms, embeddings {embed_ms} ms, questions {ask_ms} ms, total {} s",
            report["total_secs"]
        );
        if !errors.is_empty() {
            let _ = writeln!(s, "errors: {errors:?}");
        }
        print!("{s}");
    }
    completed == questions.len()
}
