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
//! - Budgets: recall (all / any, overall and per category, with the memory
//!   block's size) at long-term budgets of 1,000, 2,000 and 4,000 tokens
//!   (`budgets`, each with its `source`). 2,000 is maasd's own
//!   (`memory.budget_tokens`), scored from the pipeline's contexts as
//!   above; the others are rebuilt after the run, maasd stopped, through
//!   the library: for each completed request, newest first, the turns
//!   that requests logged and the embeddings committed since its search
//!   are deleted (by commit time: the cluster runs with
//!   `track_commit_timestamp` on) and the user's logged count set back, so
//!   the memory is the one it searched; its plan comes from its stored
//!   analysis at that time
//!   (`stage::memory::plan_for`), its query's embedding from the one the
//!   analysis kept, its items from the one search of a plan
//!   (`users::retrieve`, whose hit count follows the budget:
//!   `stage::memory::hits`), its context from the assemble stage of a
//!   pipeline built as maasd builds it (`daemon::pipeline`) with that
//!   budget. The same rebuild at 2,000 is compared with the pipeline's own
//!   context: `rebuilt` counts the identical ones (and those that score
//!   the same); `budgets_ordered` says whether recall never falls as the
//!   budget grows (printed, not asserted). `MAAS_EVAL_MEMORY_SHOW_GAPS=1`
//!   prints where each differing context first differs (stderr).
//! - The memory search's latency (`search_ms_p50`, `search_ms_p99`, over
//!   `search_statements` questions): each question's search at 2,000
//!   tokens (the pipeline's: the query's statement and any sub-query's),
//!   timed around `users::retrieve` in the rebuild: one at a time on an
//!   idle database, not under the run's concurrency (maasd keeps no
//!   histogram of its searches).
//!
//! - `MAAS_EVAL_MEMORY_APPROXIMATE=P` (a measurement of what the lists of
//!   large users cost in recall, nothing else sets it): every user is
//!   searched as a large one (`maas.memory_exact_turns` 0 for the
//!   database), with lists trained and assigned for every user once its
//!   turns are embedded (`maas::embedder::lists`), and `P` lists probed
//!   (`maas.memory_lists_probed`).
//!
//! - `MAAS_EVAL_MEMORY_FIRST_PERSON=named|first` (a measurement of
//!   questions a user asks about themself; nothing else sets it): only the
//!   questions that name the user's speaker (`speaker_a`, logged as
//!   `user_query`) and not the other are asked, as LoCoMo writes them
//!   (`named`) or put in the first person (`first`: "What did Caroline
//!   paint?" → "What did I paint?", see [`in_first_person`]), so the two
//!   runs score the same questions.
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
    let first_person = std::env::var("MAAS_EVAL_MEMORY_FIRST_PERSON").ok();
    let second = conv["speaker_b"].as_str().unwrap_or_default();
    for q in conv["qa"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let category = q["category"].as_u64().unwrap_or(0);
        if !(1..=4).contains(&category) {
            continue;
        }
        let ids = evidence_ids(q["evidence"].as_array().map(Vec::as_slice).unwrap_or_default());
        let evidence: Option<Vec<String>> = ids.iter().map(|id| by_dia.get(id).map(|t| norm(t))).collect();
        match evidence {
            Some(evidence) if !evidence.is_empty() => {
                let text = q["question"].as_str().unwrap_or_default().to_owned();
                let text = match first_person.as_deref() {
                    None => Some(text),
                    Some(mode) => {
                        let names = |who: &str| text.to_lowercase().contains(&who.to_lowercase());
                        let about_user = names(first) && (second.is_empty() || !names(second));
                        match mode {
                            _ if !about_user => None,
                            "first" => Some(in_first_person(&text, first)),
                            "named" => Some(text),
                            other => panic!("MAAS_EVAL_MEMORY_FIRST_PERSON={other}: named or first"),
                        }
                    }
                };
                if let Some(text) = text {
                    questions.push(Question {
                        user,
                        text,
                        category,
                        evidence,
                    });
                }
            }
            _ => dropped += 1,
        }
    }
    (Conversation { user, turns }, questions, dropped)
}

/// `question` about `me` put in the first person, word by word: `me`'s →
/// my, `me` → I, his / her → my, he / she → I, then the verb next to "I"
/// agrees (is → am, has → have, does → do).
fn in_first_person(question: &str, me: &str) -> String {
    let mut words: Vec<String> = Vec::new();
    for raw in question.split_whitespace() {
        let cut = raw.trim_end_matches(|c: char| !c.is_alphanumeric());
        let (word, tail) = raw.split_at(cut.len());
        let lower = word.to_lowercase();
        let me_lower = me.to_lowercase();
        let new = if lower == me_lower {
            "I"
        } else if lower == format!("{me_lower}'s") || lower == format!("{me_lower}\u{2019}s") {
            "my"
        } else {
            match lower.as_str() {
                "his" | "her" => "my",
                "he" | "she" => "I",
                _ => word,
            }
        };
        words.push(format!("{new}{tail}"));
    }
    for i in 0..words.len() {
        let bare = |w: &str| w.trim_end_matches(|c: char| !c.is_alphanumeric()).to_owned();
        let next_is_i = words.get(i + 1).is_some_and(|w| bare(w) == "I");
        let prev_is_i = i > 0 && bare(&words[i - 1]) == "I";
        if !(next_is_i || prev_is_i) {
            continue;
        }
        let w = bare(&words[i]);
        let agreed = match w.to_lowercase().as_str() {
            "is" => "am",
            "has" => "have",
            "does" => "do",
            _ => continue,
        };
        let agreed = if w.starts_with(char::is_uppercase) {
            let mut c = agreed.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect())
                .unwrap_or_default()
        } else {
            agreed.to_owned()
        };
        let tail = words[i][w.len()..].to_owned();
        words[i] = format!("{agreed}{tail}");
    }
    words.join(" ")
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

// ----------------------------------------- the contexts at other budgets

/// The long-term memory budgets (tokens) the recall is measured at: the
/// pipeline's own contexts give [`PIPELINE_BUDGET`]'s, the others are
/// rebuilt ([`rebuild`]).
const BUDGETS: [usize; 3] = [1000, 2000, 4000];

/// The budget maasd ran with (`memory.budget_tokens`'s default).
const PIPELINE_BUDGET: usize = 2000;

/// Recall of a set of contexts, overall and per category, and their memory
/// blocks' sizes.
#[derive(Default)]
struct Tally {
    all: usize,
    any: usize,
    questions: usize,
    /// Per category: (all, any, questions).
    per_cat: BTreeMap<u64, (usize, usize, usize)>,
    /// Memory block tokens (one per three bytes), unsorted.
    memory: Vec<usize>,
}

impl Tally {
    /// Scores `context` for `q`.
    fn add(&mut self, q: &Question, context: &str) {
        let text = norm(context);
        let found = q.evidence.iter().filter(|e| text.contains(e.as_str())).count();
        let c = self.per_cat.entry(q.category).or_default();
        c.2 += 1;
        self.questions += 1;
        if found == q.evidence.len() {
            self.all += 1;
            c.0 += 1;
        }
        if found > 0 {
            self.any += 1;
            c.1 += 1;
        }
        self.memory.push(tokens(&memory_block(context)));
    }

    fn json(&self) -> Value {
        let mut memory = self.memory.clone();
        memory.sort_unstable();
        json!({
            "questions": self.questions,
            "recall_all": ratio(self.all, self.questions),
            "recall_any": ratio(self.any, self.questions),
            "per_category": self.per_cat.iter().map(|(k, (a, y, t))| (k.to_string(), json!({
                "questions": t, "recall_all": ratio(*a, *t), "recall_any": ratio(*y, *t)
            }))).collect::<serde_json::Map<_, _>>(),
            "memory_tokens_p50": pct(&memory, 0.5),
            "memory_tokens_max": memory.last().copied().unwrap_or(0),
        })
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    ((a as f64 / b.max(1) as f64) * 1000.0).round() / 1000.0
}

/// One scored request, as the pipeline left it.
struct Asked {
    /// Index into the questions.
    question: usize,
    id: Uuid,
    user: Uuid,
    thread: Option<Uuid>,
    query: String,
    analysis: Value,
    context: String,
    /// When its search ran: the end of its analyze attempt (a fused
    /// assemble searches then, once the analysis and the query's embedding
    /// are made), or the claim of its own assemble attempt, whichever is
    /// later. What was committed from then on (turns, embeddings) is left
    /// out of its rebuild.
    searched_at: DateTime<Utc>,
}

/// What the rebuild found.
struct Rebuilt {
    /// Per budget, the rebuilt contexts' tally (the pipeline budget's is
    /// only compared, never reported as recall).
    tallies: BTreeMap<usize, Tally>,
    /// Requests rebuilt, and those whose rebuilt context at the pipeline's
    /// budget is the pipeline's own, byte for byte.
    rebuilt: usize,
    identical: usize,
    /// Of the others: how many score the same (all and any) as the
    /// pipeline's own context.
    same_score: usize,
    /// Each question's search at the pipeline's budget (µs), sorted.
    search_us: Vec<u128>,
}

/// Rebuilds each completed request's context at every budget of
/// [`BUDGETS`] through the library's own code, after the run (maasd
/// stopped): the request's plan from its stored analysis and time
/// ([`maas::stage::memory::plan_for`]), its query's embedding as the
/// analysis kept it (its sub-queries', if any, made again), the one
/// search of a plan ([`maas::users::retrieve`], whose hit count follows
/// the budget), and the assemble stage of a
/// pipeline built as maasd builds it ([`maas::daemon::pipeline`]) with
/// `memory.budget_tokens` set to the budget. The memory is first put back
/// as the request saw it: requests are taken newest search first, and
/// before each the turns that requests logged, and the embeddings the
/// embedder stored, since its search are deleted (by commit time: the
/// cluster tracks commit timestamps), and the user's logged count, which
/// the ranking's document frequencies use, is set back.
#[allow(clippy::too_many_lines, reason = "one pass, read top to bottom")]
async fn rebuild(url: &str, questions: &[Question], ids: &[Option<Uuid>]) -> Rebuilt {
    // maasd's configuration: the defaults and the same environment, with
    // this database (a file names it: `DATABASE_URL` is not set here).
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("eval-memory-rebuild.toml");
    std::fs::write(&file, format!("database_url = {}\n", Value::from(url))).unwrap();
    let mut cfg = maas::config::Config::load(Some(&file)).expect("the configuration maasd loads");
    cfg.database_url = maas::config::Secret(url.to_owned());
    let pool = maas::db::connect_pool(&cfg, "eval-memory").unwrap();
    let client = pool.get().await.unwrap();
    let prompts = Arc::new(maas::repo::prompts::active_prompts(&client).await.unwrap());
    let pipelines: Vec<(usize, maas::config::Config, Arc<dyn maas::stage::Pipeline>)> = BUDGETS
        .iter()
        .map(|&b| {
            let mut c = cfg.clone();
            c.memory.budget_tokens = b;
            let (p, _) = maas::daemon::pipeline(&c).expect("the pipeline maasd builds");
            (b, c, p)
        })
        .collect();
    let asked = asked(&client, ids).await;
    let mut embedder: Option<Option<maas::llm::embed::Embedder>> = None;
    let mut out = Rebuilt {
        tallies: BUDGETS.iter().map(|&b| (b, Tally::default())).collect(),
        rebuilt: 0,
        identical: 0,
        same_score: 0,
        search_us: Vec::new(),
    };
    for a in &asked {
        client
            .execute(
                "DELETE FROM raw_logs WHERE user_id = $1 AND request_id IS NOT NULL \
                 AND pg_xact_commit_timestamp(xmin) >= $2",
                &[&a.user, &a.searched_at],
            )
            .await
            .unwrap();
        client
            .execute(
                "DELETE FROM turn_embeddings WHERE user_id = $1 AND pg_xact_commit_timestamp(xmin) >= $2",
                &[&a.user, &a.searched_at],
            )
            .await
            .unwrap();
        client
            .execute(
                "UPDATE archive_marks SET logged_seq = \
                 (SELECT coalesce(max(user_seq), 0) FROM raw_logs WHERE user_id = $1) WHERE user_id = $1",
                &[&a.user],
            )
            .await
            .unwrap();
        let memory: Option<Value> = client
            .query_one("SELECT assembler_memory($1, $2)", &[&a.user, &a.analysis])
            .await
            .unwrap()
            .get(0);
        let mut input = maas::stage::StageInput {
            request_id: a.id,
            user_id: a.user,
            thread_id: a.thread,
            user_query: a.query.clone(),
            attempt: 1,
            analysis: Some(a.analysis.clone()),
            context: None,
            memory: memory.and_then(|m| serde_json::from_value(m).ok()).unwrap_or_default(),
            earlier_turns: 0,
            clarify: maas::model::Clarify::Off,
            query_embedding: None,
            retrieved: Vec::new(),
            prompts: Arc::clone(&prompts),
            deltas: None,
        };
        let plan = maas::stage::memory::plan_for(&input, a.searched_at);
        let kept = maas::stage::analysis::kept_query_embedding(&a.analysis);
        // The sub-queries' embeddings are not kept: made again, by maasd's
        // embedder (loaded the first time a plan has sub-queries).
        let mut more = Vec::new();
        if !plan.sub_queries.is_empty() && kept.is_some() {
            let e = embedder.get_or_insert_with(|| maas::daemon::embedder(&cfg).expect("maasd's embedder"));
            for sub in &plan.sub_queries {
                let found = maas::llm::embed::Embedder::for_search(e.as_ref(), sub).await;
                more.push(found.map(|(v, model)| (v, model.to_owned())));
            }
        }
        let who = maas::users::Searcher {
            user_id: a.user,
            request_id: a.id,
        };
        let q = &questions[a.question];
        let mut gap = None;
        for (budget, c, pipeline) in &pipelines {
            input.retrieved = Vec::new();
            if plan.needs_statement() {
                let t = Instant::now();
                input.retrieved = maas::users::retrieve(&client, &c.memory, &plan, who, &kept, &more)
                    .await
                    .unwrap();
                if *budget == PIPELINE_BUDGET {
                    out.search_us.push(t.elapsed().as_micros());
                }
            }
            let built = pipeline
                .run(maas::model::StageKind::Assemble, &input)
                .await
                .unwrap_or_else(|e| panic!("rebuilding {} at {budget}: {e:?}", a.id));
            let maas::stage::StageOutput::Context(context) = built.output else {
                panic!("the assemble stage gave no context");
            };
            if *budget == PIPELINE_BUDGET {
                let (mut mine, mut theirs) = (Tally::default(), Tally::default());
                mine.add(q, &context);
                theirs.add(q, &a.context);
                if context == a.context {
                    out.identical += 1;
                } else {
                    gap = Some((mine.all, mine.any) == (theirs.all, theirs.any));
                    if std::env::var_os("MAAS_EVAL_MEMORY_SHOW_GAPS").is_some() {
                        show_gap(a, &context);
                    }
                }
            }
            out.tallies.get_mut(budget).unwrap().add(q, &context);
        }
        out.rebuilt += 1;
        out.same_score += usize::from(gap == Some(true));
    }
    out.search_us.sort_unstable();
    out
}

/// Recall per budget: the pipeline's own contexts at [`PIPELINE_BUDGET`],
/// the rebuilt ones at the others; each with where it came from.
fn budgets_json(pipeline: &Tally, rebuilt: &Rebuilt) -> Value {
    BUDGETS
        .iter()
        .map(|&b| {
            let (tally, source) = if b == PIPELINE_BUDGET {
                (pipeline, "pipeline")
            } else {
                (&rebuilt.tallies[&b], "rebuilt")
            };
            let mut v = tally.json();
            v["source"] = json!(source);
            (b.to_string(), v)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Whether recall (all and any) never falls as the budget grows.
fn budgets_ordered(budgets: &Value) -> bool {
    let at = |b: usize, k: &str| budgets[b.to_string()][k].as_f64().unwrap_or(0.0);
    BUDGETS
        .windows(2)
        .all(|w| ["recall_all", "recall_any"].iter().all(|k| at(w[0], k) <= at(w[1], k)))
}

/// The completed requests of `ids` (one per question, `None` for a
/// question not submitted), newest search first.
async fn asked(client: &Client, ids: &[Option<Uuid>]) -> Vec<Asked> {
    let all: Vec<Uuid> = ids.iter().flatten().copied().collect();
    let rows = client
        .query(
            "SELECT r.id, r.user_id, r.thread_id, r.user_query, r.analysis_result, r.final_context_payload,
                    greatest(
                        (SELECT max(s.started_at) FROM pipeline_steps s
                         WHERE s.run_id = r.id AND s.stage = 'assemble' AND s.outcome = 'succeeded'),
                        (SELECT max(s.started_at + s.latency_ms * interval '1 millisecond') FROM pipeline_steps s
                         WHERE s.run_id = r.id AND s.stage = 'analyze' AND s.outcome = 'succeeded')
                    ) AS searched_at
             FROM pipeline_runs r
             WHERE r.id = ANY($1) AND r.status = 'COMPLETED'",
            &[&all],
        )
        .await
        .unwrap();
    let mut asked: Vec<Asked> = rows
        .iter()
        .filter_map(|r| {
            let id: Uuid = r.get(0);
            Some(Asked {
                question: ids.iter().position(|i| *i == Some(id))?,
                id,
                user: r.get(1),
                thread: r.get(2),
                query: r.get(3),
                analysis: r.get::<_, Option<Value>>(4)?,
                context: r.get::<_, Option<String>>(5)?,
                searched_at: r.get::<_, Option<DateTime<Utc>>>(6)?,
            })
        })
        .collect();
    asked.sort_by_key(|a| std::cmp::Reverse(a.searched_at));
    asked
}

/// Prints (stderr) where a rebuilt context first differs from the
/// pipeline's (`MAAS_EVAL_MEMORY_SHOW_GAPS`).
fn show_gap(a: &Asked, rebuilt: &str) {
    let line = a
        .context
        .lines()
        .zip(rebuilt.lines())
        .position(|(x, y)| x != y)
        .unwrap_or_else(|| a.context.lines().count().min(rebuilt.lines().count()));
    eprintln!(
        "eval-memory: {} ({:?}) rebuilt differs at line {line}:\n  pipeline: {:?}\n  rebuilt:  {:?}",
        a.id,
        a.query,
        a.context.lines().nth(line),
        rebuilt.lines().nth(line)
    );
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
    if let Ok(mode) = std::env::var("MAAS_EVAL_MEMORY_FIRST_PERSON") {
        let shown: Vec<&str> = questions.iter().take(3).map(|q| q.text.as_str()).collect();
        eprintln!(
            "MAAS_EVAL_MEMORY_FIRST_PERSON={mode}: {} questions, e.g. {shown:?}",
            questions.len()
        );
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
    // Commit times, for the rebuild to put each user's memory back as a
    // request saw it ([`rebuild`]); a restart turns them on (once: the
    // setting stays with the cluster).
    let tracked: String = admin
        .query_one("SHOW track_commit_timestamp", &[])
        .await
        .unwrap()
        .get(0);
    drop(admin);
    if tracked != "on" {
        let (admin, conn) = tokio_postgres::connect(&admin_url, NoTls).await.unwrap();
        tokio::spawn(conn);
        admin
            .batch_execute("ALTER SYSTEM SET track_commit_timestamp = on")
            .await
            .unwrap();
        drop(admin);
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || c.restart(false))
            .await
            .unwrap()
            .unwrap();
    }
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
    maasd.kill();

    // Score the pipeline's own contexts.
    let ids: Vec<Uuid> = outcomes.iter().filter_map(|o| o.id).collect();
    let rows = db
        .query(
            "SELECT id, status, final_context_payload FROM pipeline_runs WHERE id = ANY($1)",
            &[&ids],
        )
        .await
        .unwrap();
    let runs: HashMap<Uuid, (String, Option<String>)> = rows.iter().map(|r| (r.get(0), (r.get(1), r.get(2)))).collect();
    let mut completed = 0usize;
    let mut scored = Tally::default();
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
        scored.add(q, context);
        memory_o200k.push(bpe.encode_ordinary(&memory_block(context)).len());
        context_tokens.push(tokens(context));
    }
    let (all, any) = (scored.all, scored.any);
    let per_cat = scored.per_cat.clone();
    let mut memory = scored.memory.clone();

    // The other budgets, rebuilt (and the pipeline's, to compare).
    let t_rebuild = Instant::now();
    let asked: Vec<Option<Uuid>> = outcomes.iter().map(|o| o.id).collect();
    let rebuilt = rebuild(&url, &questions, &asked).await;
    let rebuild_ms = t_rebuild.elapsed().as_millis();
    memory.sort_unstable();
    memory_o200k.sort_unstable();
    context_tokens.sort_unstable();
    let mut latencies: Vec<u128> = outcomes.iter().map(|o| o.latency.as_micros()).collect();
    latencies.sort_unstable();
    let n = questions.len().max(1) as f64;
    let ms = |us: u128| (us as f64 / 100.0).round() / 10.0;
    let budgets = budgets_json(&scored, &rebuilt);
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
        "budgets": budgets,
        "budgets_ordered": budgets_ordered(&budgets),
        "rebuilt": {
            "questions": rebuilt.rebuilt,
            "identical_at_2000": rebuilt.identical,
            "same_score_at_2000": rebuilt.identical + rebuilt.same_score,
        },
        "search_statements": rebuilt.search_us.len(),
        "search_ms_p50": ms(pct(&rebuilt.search_us, 0.5)),
        "search_ms_p99": ms(pct(&rebuilt.search_us, 0.99)),
        "rebuild_ms": rebuild_ms,
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
        for b in BUDGETS {
            let v = &report["budgets"][b.to_string()];
            let cats: Vec<String> = v["per_category"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, c)| format!("{k}: {}/{}", c["recall_all"], c["recall_any"]))
                        .collect()
                })
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "  at {b:>4} tokens ({}): all {:.3}  any {:.3}  memory block p50 {} max {}   per category all/any {}",
                v["source"].as_str().unwrap_or_default(),
                v["recall_all"].as_f64().unwrap_or(0.0),
                v["recall_any"].as_f64().unwrap_or(0.0),
                v["memory_tokens_p50"],
                v["memory_tokens_max"],
                cats.join("  ")
            );
        }
        let _ = writeln!(
            s,
            "  recall never falls as the budget grows: {}   rebuilt at {PIPELINE_BUDGET}: {}/{} identical to the pipeline's context, {}/{} scoring the same",
            if report["budgets_ordered"] == true { "yes" } else { "NO" },
            rebuilt.identical,
            rebuilt.rebuilt,
            rebuilt.identical + rebuilt.same_score,
            rebuilt.rebuilt
        );
        let _ = writeln!(
            s,
            "memory search p50 {} ms p99 {} ms ({} questions' searches at {PIPELINE_BUDGET} tokens, timed in the rebuild: one at a time, maasd stopped)",
            report["search_ms_p50"], report["search_ms_p99"], report["search_statements"]
        );
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
            "load {load_ms} ms, archivist {archive_ms} ms, embeddings {embed_ms} ms, questions {ask_ms} ms, rebuild {rebuild_ms} ms, total {} s",
            report["total_secs"]
        );
        if !errors.is_empty() {
            let _ = writeln!(s, "errors: {errors:?}");
        }
        print!("{s}");
    }
    completed == questions.len()
}
