//! The chaos suite behind `bin/chaos`: three real `maasd` processes, a fake
//! LLM provider over HTTP that fails at random, a steady load of SQL inserts
//! and HTTP submissions, and process, database and network faults injected at
//! random moments. At the end the database (and the fake's own tally) must
//! show that nothing was lost, nothing was done twice and nothing is stuck.
//!
//! `cargo bench --bench chaos -- [--seconds N] [--json] [--rate R] [--drain-secs D]`
//!
//! - PostgreSQL: a private durable cluster under the target directory (its own,
//!   not the benchmark's), `max_connections` 60 so that the connection limit
//!   can be filled; a fresh database each run; stopped at the end.
//! - Daemons: lease 3 s, sweep 1 s, LLM timeouts 2 s, pool 8.
//! - Provider: the default reply is a valid analysis (the same fake answers
//!   the analyzer and the responder); 3 % of calls get a 429 with
//!   `Retry-After: 1`, 3 % a 500, 2 % a hold beyond the client timeout and
//!   2 % a body that is not JSON; of the calls that ask to stream, 3 % are
//!   cut halfway and 3 % end halfway with the provider's error event. The
//!   reply is pretty-printed, so a streamed answer comes in many pieces.
//! - Load: `R` requests per second (default 20), half as plain
//!   `INSERT INTO pipeline_runs` statements (what psql sends) on the loader's
//!   own connections, half as `POST /api/query` to a random daemon with an
//!   `Idempotency-Key`, retried on another daemon when no answer came back.
//!   A request counts as submitted once its INSERT's commit or its 202 was
//!   acknowledged; every query text is unique. A third of the HTTP
//!   submissions ask to stream (`"stream": true`) and follow their SSE
//!   events (`GET /api/query/{id}/events`) from a random daemon, resuming
//!   on another with `Last-Event-ID` when the connection breaks.
//!   Of every twenty submissions, three ask their user (`clarify`) and
//!   three need review: two of each are answered by a replier and a
//!   reviewer through the faults, one is cancelled while it waits, and one
//!   (inserted for a tenant with 4 s limits) is left to expire (`waits`).
//! - Faults, each at least once, in random order at random moments, then
//!   more at random until the time is up: SIGKILL of a daemon and a restart;
//!   SIGSTOP for longer than the lease, then SIGCONT; `pg_terminate_backend`
//!   of every maasd connection; an immediate PostgreSQL restart; every free
//!   connection slot taken by idle connections for a while; the provider
//!   unreachable for a while; `poison`: requests inserted at
//!   the bounds of their counters (`attempt` 1000, `lease_token` 2^62) and
//!   one past them (`attempt` 2147483647, which must be refused by its
//!   constraint), requests whose provider replies carry NUL characters or
//!   oversized fields, and a producer transaction holding an
//!   `INSERT INTO raw_logs` for a busy user open for 2–3 s.
//!   `--kinds a,b` injects only the named kinds (default: all).
//! - Then: load stops, the run waits (deadline) until no request is in
//!   flight, and checks the invariants. Exit status 0 only when `lost`,
//!   `duplicates` and `stuck` are 0 and every other check holds, including
//!   `harmed`: every request not touched by a fault (its life overlaps no
//!   fault window other than poison's, it is not a poisoned request nor the
//!   held user's during the hold, and no provider fault made a step of it
//!   retry) completed with no `lease_expired` or `failed` step; and every
//!   streaming client held only prefixes of the request's answer, each since
//!   the last `restart` it was told about, never a piece of another attempt,
//!   and saw the terminal event with the stored answer. And the run must
//!   have done enough to count: each door acknowledged at least half of
//!   its share of the load, and at least half of the acknowledged
//!   requests completed (a run where every submission failed has nothing
//!   to lose). And every request that waited for a person got exactly one
//!   reply or review and ended `COMPLETED`, every cancelled wait ended
//!   `CANCELLED` and went no further, and every wait left to expire ended
//!   once, as its tenant chose, and not before its limit; no other wait
//!   expired.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a chaos harness fails loudly")]
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    clippy::cast_possible_wrap,
    reason = "statistics over small counts"
)]

#[allow(dead_code, reason = "shared with the maas bench and the tests, which use more of it")]
mod support;
#[path = "chaos/waits.rs"]
mod waits;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use maas::db::devdb::Cluster;
use nix::sys::signal::Signal;
use rand::Rng;
use rand::seq::SliceRandom;
use serde_json::{Value, json};
use support::daemon::{Maasd, Opts, strip_ansi};
use support::fake_llm::{FakeLlm, FaultRates, Reply};
use support::{analysis_provider, connect, count, on_provider, percentile, poll_until, try_connect};
use tokio::task::JoinSet;
use tokio_postgres::Client;
use uuid::Uuid;
use waits::{Plan, Wait};

const DAEMONS: usize = 3;
const LEASE_SECS: u64 = 3;
const SWEEP_SECS: u64 = 1;
const LLM_TIMEOUT_SECS: u64 = 2;
const POOL_SIZE: u32 = 8;
const MAX_CONNECTIONS: u32 = 60;
/// A fault's window, for the latency "during faults", lasts this long past
/// the fault's end: the time the system takes to notice and recover.
const RECOVERY: Duration = Duration::from_secs(2 * LEASE_SECS);
const USERS: usize = 50;
/// Queries the fake provider answers with NUL characters (in the analysis
/// JSON and the answer) and with oversized fields, for the poison fault.
const POISON_NUL: &str = "chaos poison nul";
const POISON_HUGE: &str = "chaos poison huge";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Kill,
    Stop,
    Terminate,
    PgRestart,
    FillConnections,
    ProviderDown,
    Poison,
}

impl Fault {
    const ALL: [Fault; 7] = [
        Fault::Kill,
        Fault::Stop,
        Fault::Terminate,
        Fault::PgRestart,
        Fault::FillConnections,
        Fault::ProviderDown,
        Fault::Poison,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "sigkill_restart",
            Fault::Stop => "sigstop_past_lease",
            Fault::Terminate => "terminate_backends",
            Fault::PgRestart => "postgres_restart",
            Fault::FillConnections => "connections_exhausted",
            Fault::ProviderDown => "provider_unreachable",
            Fault::Poison => "poison",
        }
    }

    /// About how long the fault takes, for planning.
    fn estimate(self) -> Duration {
        match self {
            Fault::Kill => Duration::from_secs(3),
            Fault::Stop => Duration::from_secs(LEASE_SECS + 2),
            Fault::Terminate => Duration::from_secs(1),
            Fault::PgRestart => Duration::from_secs(3),
            Fault::FillConnections | Fault::ProviderDown => Duration::from_secs(5),
            Fault::Poison => Duration::from_secs(4),
        }
    }
}

struct Injected {
    fault: Fault,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    note: String,
}

/// State the load tasks and the injector share.
struct Shared {
    /// Request ids acknowledged to a client (INSERT committed, or 202).
    acked: Mutex<Vec<Uuid>>,
    /// The HTTP address of each daemon slot, `None` while it is down.
    http: Mutex<Vec<Option<SocketAddr>>>,
    sql_acked: AtomicU64,
    sql_errors: AtomicU64,
    http_acked: AtomicU64,
    http_retries: AtomicU64,
    http_given_up: AtomicU64,
    seq: AtomicU64,
    users: Vec<Uuid>,
    /// The clients following streamed requests.
    followers: Mutex<Vec<tokio::task::JoinHandle<Followed>>>,
    /// What the replier and the reviewer did.
    waits: waits::Tally,
}

impl Shared {
    fn ack(&self, id: Uuid) {
        self.acked.lock().unwrap().push(id);
    }

    fn user(&self) -> Uuid {
        self.users[rand::rng().random_range(0..self.users.len())]
    }

    fn next(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// A daemon that is up, at random.
    fn random_up(&self) -> Option<SocketAddr> {
        let up: Vec<SocketAddr> = self.http.lock().unwrap().iter().flatten().copied().collect();
        (!up.is_empty()).then(|| up[rand::rng().random_range(0..up.len())])
    }
}

struct Args {
    seconds: u64,
    json: bool,
    rate: f64,
    drain_secs: u64,
    kinds: Vec<Fault>,
}

fn parse_args() -> Args {
    let mut args = Args {
        seconds: 120,
        json: false,
        rate: 20.0,
        drain_secs: 120,
        kinds: Fault::ALL.to_vec(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let (key, inline) = match argv[i].split_once('=') {
            Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
            None => (argv[i].clone(), None),
        };
        let mut value = || {
            inline.clone().unwrap_or_else(|| {
                i += 1;
                argv.get(i).cloned().unwrap_or_else(|| panic!("{key} needs a value"))
            })
        };
        match key.as_str() {
            "--json" => args.json = true,
            "--seconds" => args.seconds = value().parse().expect("--seconds N"),
            "--rate" => args.rate = value().parse().expect("--rate R (requests per second)"),
            "--drain-secs" => args.drain_secs = value().parse().expect("--drain-secs N"),
            "--kinds" => {
                args.kinds = value()
                    .split(',')
                    .map(|k| {
                        let k = k.trim();
                        *Fault::ALL.iter().find(|f| f.name() == k).unwrap_or_else(|| {
                            let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
                            panic!("--kinds: unknown kind {k:?}; kinds: {}", names.join(", "))
                        })
                    })
                    .collect();
            }
            // `cargo bench` passes --bench to harness-less targets.
            "--bench" => {}
            other => {
                panic!(
                    "unknown argument {other:?}; usage: chaos [--seconds N] [--json] [--rate R] [--drain-secs N] [--kinds a,b]"
                )
            }
        }
        i += 1;
    }
    assert!(args.seconds >= 30, "--seconds must be at least 30 to fit every fault");
    assert!(args.rate > 0.0, "--rate must be positive");
    args
}

// ---------------------------------------------------------------- daemons

struct Daemons {
    url: String,
    provider_url: String,
    slots: Vec<Maasd>,
    /// The log of every daemon started, restarted ones included.
    logs: Vec<std::path::PathBuf>,
    /// Daemons found dead that nobody killed.
    unexpected_exits: Vec<String>,
}

impl Daemons {
    fn opts(&self) -> Opts {
        let opts = Opts {
            lease_secs: LEASE_SECS,
            sweep_secs: SWEEP_SECS,
            ..Opts::default()
        };
        on_provider(opts, &self.provider_url, "chaos")
            .env("RUST_LOG", "warn,maas::http=info")
            .env("MAAS_LLM__ANALYZER__TIMEOUT_SECS", LLM_TIMEOUT_SECS)
            .env("MAAS_LLM__RESPONDER__TIMEOUT_SECS", LLM_TIMEOUT_SECS)
            // Three tries of a stage span about 1 + 2 s of backoff.
            .env("MAAS_RETRY_BASE_MS", 1000)
            .env("MAAS_POOL_SIZE", POOL_SIZE)
    }

    /// Starts a daemon and waits until its HTTP server listens.
    async fn start(&mut self) -> Result<(Maasd, SocketAddr), String> {
        let mut d = Maasd::spawn(&self.url, self.opts());
        self.logs.push(d.log.clone());
        match d.wait_http_addr(Duration::from_secs(60)).await {
            Ok(addr) => Ok((d, addr)),
            Err(_) => Err(tail(&d.plain_log(), 20)),
        }
    }

    /// Restarts slot `i` (after a kill or an exit), retrying a few times.
    async fn restart(&mut self, i: usize, shared: &Shared) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..3 {
            match self.start().await {
                Ok((d, addr)) => {
                    self.slots[i] = d;
                    shared.http.lock().unwrap()[i] = Some(addr);
                    return Ok(());
                }
                Err(log) => last = log,
            }
        }
        Err(last)
    }

    /// Restarts any daemon that died on its own, and says so.
    async fn check_alive(&mut self, shared: &Shared) {
        for i in 0..self.slots.len() {
            if !self.slots[i].is_running() {
                let log = tail(&self.slots[i].plain_log(), 20);
                self.unexpected_exits.push(format!("daemon {i} exited:\n{log}"));
                shared.http.lock().unwrap()[i] = None;
                if let Err(e) = self.restart(i, shared).await {
                    self.unexpected_exits
                        .push(format!("daemon {i} does not start again:\n{e}"));
                }
            }
        }
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ------------------------------------------------------------------- load

/// Plain INSERTs on one connection of its own, reconnecting when it breaks.
/// An INSERT whose commit was not acknowledged is not counted (and not
/// repeated: a psql user would not know whether it happened either).
async fn sql_loader(url: String, shared: Arc<Shared>, per_sec: f64, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_sec));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client: Option<Client> = None;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        if client.as_ref().is_none_or(Client::is_closed) {
            client = tokio::time::timeout(Duration::from_secs(5), try_connect(&url))
                .await
                .ok()
                .and_then(Result::ok);
            if client.is_none() {
                shared.sql_errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        }
        let Some(c) = client.as_ref() else { continue };
        let n = shared.next();
        let plan = Plan::of(n);
        let query = format!("{}sql query {n}", plan.prefix());
        let user = shared.user();
        let (clarify, review) = plan.flags();
        // The loader is trusted (the owner): it names the tenant and its
        // user as the HTTP path does.
        let tenant = plan.tenant().unwrap_or(Uuid::nil());
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [&user, &query, &clarify, &review, &tenant];
        let insert = c.query_one(
            "INSERT INTO pipeline_runs (user_id, tenant_user_id, tenant_id, user_query, clarify, review)
             VALUES (maas_tenant_user($5, $1), CASE WHEN $5 <> '00000000-0000-0000-0000-000000000000' THEN $1 END,
                     $5, $2, $3, $4) RETURNING id",
            &params,
        );
        match tokio::time::timeout(Duration::from_secs(10), insert).await {
            Ok(Ok(row)) => {
                shared.ack(row.get(0));
                shared.sql_acked.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                shared.sql_errors.fetch_add(1, Ordering::Relaxed);
                client = None;
            }
        }
    }
}

/// `POST /api/query` at a steady rate, each submission in its own task so a
/// frozen daemon does not slow the others.
async fn http_loader(shared: Arc<Shared>, per_sec: f64, mut stop: tokio::sync::watch::Receiver<bool>) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_sec));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = tick.tick() => {}
        }
        while tasks.try_join_next().is_some() {}
        tasks.spawn(submit(http.clone(), Arc::clone(&shared)));
    }
    while tasks.join_next().await.is_some() {}
}

/// One submission: up to 5 tries on random daemons with the same
/// `Idempotency-Key`, until one answers 202.
async fn submit(http: reqwest::Client, shared: Arc<Shared>) {
    let n = shared.next();
    let key = format!("chaos-{n}");
    let plan = Plan::of(n).over_http();
    // A request that waits for a person does not stream (its follower
    // would wait as long).
    let stream = n % 3 == 0 && plan.wait == Wait::None;
    let mut body =
        json!({"user_id": shared.user(), "query": format!("{}http query {n}", plan.prefix()), "stream": stream});
    match plan.flags() {
        (Some(clarify), _) => body["clarify"] = json!(clarify),
        (_, Some(review)) => body["review"] = json!(review),
        _ => {}
    }
    for attempt in 0..5 {
        if attempt > 0 {
            shared.http_retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let Some(addr) = shared.random_up() else { continue };
        let resp = http
            .post(format!("http://{addr}/api/query"))
            .header("idempotency-key", &key)
            .json(&body)
            .send()
            .await;
        let Ok(resp) = resp else { continue };
        if resp.status().as_u16() != 202 {
            continue;
        }
        let Ok(v) = resp.json::<Value>().await else { continue };
        if let Some(id) = v["request_id"].as_str().and_then(|s| s.parse().ok()) {
            shared.ack(id);
            shared.http_acked.fetch_add(1, Ordering::Relaxed);
            if stream {
                let follower = tokio::spawn(follow(Arc::clone(&shared), id));
                shared.followers.lock().unwrap().push(follower);
            }
            return;
        }
    }
    shared.http_given_up.fetch_add(1, Ordering::Relaxed);
}

/// What a client following a streamed request saw.
#[derive(Default)]
struct Followed {
    id: Uuid,
    /// The text held when each stretch ended (a `restart`, or the end).
    stretches: Vec<String>,
    /// Pieces of another attempt than the one the client was told about.
    foreign: u64,
    /// Whether the terminal event came, and its answer.
    terminal: bool,
    answer: Option<String>,
    reconnects: u64,
}

/// Follows request `id`'s SSE events from a random daemon until its
/// terminal event, resuming on another daemon (`Last-Event-ID`) when the
/// connection breaks or goes quiet for 10 s.
async fn follow(shared: Arc<Shared>, id: Uuid) -> Followed {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut f = Followed {
        id,
        ..Followed::default()
    };
    let (mut text, mut attempt, mut last_id) = (String::new(), None::<i64>, None::<String>);
    while !f.terminal {
        let Some(addr) = shared.random_up() else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            continue;
        };
        let mut rb = http.get(format!("http://{addr}/api/query/{id}/events"));
        if let Some(last) = &last_id {
            rb = rb.header("last-event-id", last);
        }
        let resp = tokio::time::timeout(Duration::from_secs(5), rb.send()).await;
        let Ok(Ok(mut resp)) = resp else {
            f.reconnects += 1;
            tokio::time::sleep(Duration::from_millis(300)).await;
            continue;
        };
        let mut buf = String::new();
        while let Ok(Ok(Some(chunk))) = tokio::time::timeout(Duration::from_secs(10), resp.chunk()).await {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let raw: String = buf.drain(..end + 2).collect();
                let (mut name, mut event_id, mut data) = (String::new(), None, String::new());
                for line in raw.lines() {
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match field {
                        "event" => name = value.to_owned(),
                        "id" => event_id = Some(value.to_owned()),
                        "data" => data.push_str(value),
                        _ => {}
                    }
                }
                let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                match name.as_str() {
                    "delta" => {
                        let of = v["attempt"].as_i64();
                        if attempt.is_some() && of != attempt {
                            f.foreign += 1;
                        }
                        attempt = attempt.or(of);
                        text.push_str(v["text"].as_str().unwrap_or_default());
                        last_id = event_id.or(last_id);
                    }
                    "restart" => {
                        f.stretches.push(std::mem::take(&mut text));
                        attempt = v["attempt"].as_i64();
                    }
                    _ if v["status"].is_string() && v["status"] != "processing" => {
                        f.terminal = true;
                        f.answer = v["answer"].as_str().map(str::to_owned);
                    }
                    _ => {}
                }
            }
            if f.terminal {
                break;
            }
        }
        if !f.terminal {
            f.reconnects += 1;
        }
    }
    f.stretches.push(text);
    f
}

/// What the streaming clients saw against what was stored.
#[derive(Default)]
struct StreamVerdict {
    followed: i64,
    /// Followers that never saw the terminal event.
    unfinished: i64,
    /// Text held that is not a prefix of the answer.
    not_prefix: i64,
    /// Pieces of an attempt the client was not told about.
    foreign: i64,
    /// A terminal event whose answer is not the stored one.
    wrong_answer: i64,
    restarts: i64,
    reconnects: i64,
}

impl StreamVerdict {
    fn violations(&self) -> i64 {
        self.unfinished + self.not_prefix + self.foreign + self.wrong_answer
    }
}

/// Waits (at most `within`) for every follower, then judges what each saw
/// against the stored answer (`reply`, the provider's text, for a request
/// without one: every attempt gets the same text).
async fn judge_streams(c: &Client, shared: &Shared, reply: &str, within: Duration) -> (StreamVerdict, Vec<String>) {
    let deadline = tokio::time::Instant::now() + within;
    let handles: Vec<_> = std::mem::take(&mut *shared.followers.lock().unwrap());
    let mut v = StreamVerdict::default();
    let mut details = Vec::new();
    for h in handles {
        v.followed += 1;
        let abort = h.abort_handle();
        let Ok(Ok(f)) = tokio::time::timeout_at(deadline, h).await else {
            abort.abort();
            v.unfinished += 1;
            continue;
        };
        let stored: Option<String> = c
            .query_one("SELECT final_answer FROM pipeline_runs WHERE id = $1", &[&f.id])
            .await
            .ok()
            .and_then(|r| r.get(0));
        let expected = stored.as_deref().unwrap_or(reply);
        v.restarts += f.stretches.len() as i64 - 1;
        v.reconnects += f.reconnects as i64;
        v.foreign += f.foreign as i64;
        if let Some(bad) = f.stretches.iter().find(|t| !expected.starts_with(t.as_str())) {
            v.not_prefix += 1;
            if details.len() < 5 {
                details.push(format!("{}: held {bad:?}, answer {expected:?}", f.id));
            }
        }
        if f.answer.is_some() && f.answer != stored {
            v.wrong_answer += 1;
        }
        if !f.terminal {
            v.unfinished += 1;
        }
    }
    (v, details)
}

// ----------------------------------------------------------------- faults

struct Injector {
    cluster: Cluster,
    url: String,
    daemons: Daemons,
    fake: FakeLlm,
    shared: Arc<Shared>,
    log: Vec<Injected>,
    started: Instant,
    kinds: Vec<Fault>,
    /// Requests the poison fault made bad on purpose.
    poisoned: Vec<Uuid>,
    /// (user, from, to): a producer held a raw_logs insert of this user open.
    held: Vec<(Uuid, DateTime<Utc>, DateTime<Utc>)>,
}

impl Injector {
    async fn inject(&mut self, fault: Fault) {
        self.daemons.check_alive(&self.shared).await;
        let start = Utc::now();
        let at = self.started.elapsed().as_secs_f64();
        let note = match fault {
            Fault::Kill => {
                let i = rand::rng().random_range(0..DAEMONS);
                self.shared.http.lock().unwrap()[i] = None;
                let pid = self.daemons.slots[i].pid();
                self.daemons.slots[i].kill();
                tokio::time::sleep(Duration::from_millis(rand::rng().random_range(200..2000))).await;
                match self.daemons.restart(i, &self.shared).await {
                    Ok(()) => format!("daemon {i} (pid {pid}) killed and restarted"),
                    Err(log) => {
                        self.daemons
                            .unexpected_exits
                            .push(format!("daemon {i} does not start again after SIGKILL:\n{log}"));
                        format!("daemon {i} killed; restart FAILED")
                    }
                }
            }
            Fault::Stop => {
                let i = rand::rng().random_range(0..DAEMONS);
                let hold = Duration::from_millis(LEASE_SECS * 1000 + rand::rng().random_range(1000..3000));
                self.daemons.slots[i].signal(Signal::SIGSTOP);
                tokio::time::sleep(hold).await;
                self.daemons.slots[i].signal(Signal::SIGCONT);
                format!("daemon {i} stopped for {:.1} s", hold.as_secs_f64())
            }
            Fault::Terminate => match try_connect(&self.url).await {
                Ok(c) => {
                    let n: i64 = c
                        .query_one(
                            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
                             WHERE application_name LIKE 'maasd%' AND pid <> pg_backend_pid()",
                            &[],
                        )
                        .await
                        .map_or(-1, |r| r.get(0));
                    format!("{n} maasd backends terminated")
                }
                Err(e) => format!("could not connect to terminate: {e}"),
            },
            Fault::PgRestart => {
                let cluster = self.cluster.clone();
                let t0 = Instant::now();
                let res = tokio::task::spawn_blocking(move || cluster.restart(true))
                    .await
                    .unwrap();
                match res {
                    Ok(()) => format!("immediate restart, down {:.1} s", t0.elapsed().as_secs_f64()),
                    Err(e) => panic!("PostgreSQL did not restart: {e}"),
                }
            }
            Fault::FillConnections => {
                let mut held = Vec::new();
                let mut refused = None;
                for _ in 0..MAX_CONNECTIONS * 2 {
                    match try_connect(&self.url).await {
                        Ok(c) => held.push(c),
                        Err(e) => {
                            refused = Some(
                                e.as_db_error()
                                    .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
                            );
                            break;
                        }
                    }
                }
                let hold = Duration::from_millis(rand::rng().random_range(3000..6000));
                tokio::time::sleep(hold).await;
                let n = held.len();
                drop(held);
                format!(
                    "{n} idle connections held {:.1} s; the next was refused: {}",
                    hold.as_secs_f64(),
                    refused.as_deref().unwrap_or("(never refused!)")
                )
            }
            Fault::Poison => self.poison().await,
            Fault::ProviderDown => {
                let hold = Duration::from_millis(rand::rng().random_range(2000..5000));
                self.fake.go_down().await;
                tokio::time::sleep(hold).await;
                self.fake.come_back().await;
                format!("provider unreachable for {:.1} s", hold.as_secs_f64())
            }
        };
        let end = Utc::now();
        eprintln!("chaos: {at:>6.1} s  {:<22} {note}", fault.name());
        self.log.push(Injected {
            fault,
            start,
            end,
            note,
        });
    }

    /// Bad neighbours: rows at their counters' bounds (and one past, which
    /// must be refused by name), requests the provider answers with NULs
    /// and oversized fields ([`POISON_NUL`], [`POISON_HUGE`]), and a
    /// producer transaction holding a busy user's `raw_logs` insert open.
    async fn poison(&mut self) -> String {
        let c = match try_connect(&self.url).await {
            Ok(c) => c,
            Err(e) => return format!("could not connect to poison: {e}"),
        };
        let n = self.shared.next();
        let mut notes = Vec::new();
        let at_bounds = c
            .query(
                "INSERT INTO pipeline_runs (user_id, user_query, attempt, lease_token)
                 VALUES ($1, 'chaos poison attempt at bound ' || $3::text, 1000, 0),
                        ($2, 'chaos poison token at bound ' || $3::text, 0, 4611686018427387904)
                 RETURNING id",
                &[&self.shared.user(), &self.shared.user(), &n.to_string()],
            )
            .await;
        match at_bounds {
            Ok(rows) => {
                self.poisoned.extend(rows.iter().map(|r| r.get::<_, Uuid>(0)));
                notes.push("2 rows at counter bounds".to_owned());
            }
            Err(e) => notes.push(format!("rows at bounds REFUSED: {}", maas::db::Error::from(e))),
        }
        let past = c
            .execute(
                "INSERT INTO pipeline_runs (user_id, user_query, attempt) VALUES ($1, 'chaos poison past bound ' || $2::text, 2147483647)",
                &[&self.shared.user(), &n.to_string()],
            )
            .await;
        match past {
            Ok(_) => notes.push("attempt 2147483647 ACCEPTED (must be refused)".to_owned()),
            Err(e) => notes.push(format!(
                "attempt 2147483647 refused by {}",
                e.as_db_error()
                    .and_then(|d| d.constraint())
                    .unwrap_or("(no constraint!)")
            )),
        }
        let replies = c
            .query(
                "INSERT INTO pipeline_runs (user_id, user_query)
                 VALUES ($1, $3 || ' ' || $5::text), ($2, $4 || ' ' || $5::text) RETURNING id",
                &[
                    &self.shared.user(),
                    &self.shared.user(),
                    &POISON_NUL,
                    &POISON_HUGE,
                    &n.to_string(),
                ],
            )
            .await;
        if let Ok(rows) = replies {
            self.poisoned.extend(rows.iter().map(|r| r.get::<_, Uuid>(0)));
            notes.push("2 requests with NUL / oversized replies".to_owned());
        }
        // A producer's open transaction on a busy user's turns.
        let user = self.shared.user();
        let hold = Duration::from_millis(rand::rng().random_range(2000..3000));
        let from = Utc::now();
        let held = async {
            c.batch_execute("BEGIN").await?;
            c.execute(
                "INSERT INTO raw_logs (user_id, message_type, content) VALUES ($1, 'user_query', 'chaos poison held turn')",
                &[&user],
            )
            .await?;
            tokio::time::sleep(hold).await;
            c.batch_execute("COMMIT").await
        }
        .await;
        self.held.push((user, from, Utc::now()));
        match held {
            Ok(()) => notes.push(format!(
                "raw_logs insert of a busy user held open {:.1} s",
                hold.as_secs_f64()
            )),
            Err(e) => notes.push(format!("held insert failed: {}", maas::db::Error::from(e))),
        }
        notes.join("; ")
    }

    /// Every kind once in random order, spread over the run, then random
    /// kinds at random gaps while there is time.
    async fn run(&mut self, seconds: u64) {
        let started = self.started;
        let total = Duration::from_secs(seconds);
        let warmup = Duration::from_secs(3);
        tokio::time::sleep(warmup.saturating_sub(started.elapsed())).await;
        let mut order = self.kinds.clone();
        order.shuffle(&mut rand::rng());
        // One slot per kind, at most 12 s: a long run goes on to random
        // faults every few seconds instead of spreading them over its length.
        let kinds = u32::try_from(order.len().max(1)).unwrap();
        let slot = ((total.saturating_sub(warmup + Duration::from_secs(3))) / kinds).min(Duration::from_secs(12));
        for (k, fault) in order.into_iter().enumerate() {
            let slot_start = warmup + slot * u32::try_from(k).unwrap();
            let slack = (slot.saturating_sub(fault.estimate())).as_millis() as u64;
            let at = slot_start + Duration::from_millis(rand::rng().random_range(0..=slack));
            tokio::time::sleep(at.saturating_sub(started.elapsed())).await;
            self.inject(fault).await;
        }
        loop {
            let gap = Duration::from_millis(rand::rng().random_range(1000..6000));
            if self.kinds.is_empty() {
                break;
            }
            let fault = self.kinds[rand::rng().random_range(0..self.kinds.len())];
            if started.elapsed() + gap + fault.estimate() + Duration::from_secs(2) > total {
                break;
            }
            tokio::time::sleep(gap).await;
            self.inject(fault).await;
        }
    }
}

// ----------------------------------------------------------------- checks

#[derive(Default)]
struct Verdict {
    requests: i64,
    acked: i64,
    completed: i64,
    failed: i64,
    cancelled: i64,
    lost: i64,
    duplicates: i64,
    stuck: i64,
    failed_without_reason: i64,
    inconsistent: i64,
    llm_steps_succeeded: i64,
    e2e_ms: Vec<f64>,
    e2e_ms_faults: Vec<f64>,
    failed_reasons: Vec<(String, i64)>,
    details: Vec<String>,
    /// Requests no fault touched, and those of them that were harmed.
    untouched: i64,
    harmed: i64,
    /// Violations of the waits' invariants (`waits::checks`).
    waits: i64,
    /// What the waits did (`waits::figures`).
    waited: Option<waits::Figures>,
}

/// Runs each (what, counting query) check and returns the sum of the
/// counts; each count above zero also becomes a line in `details`.
async fn violations(c: &Client, checks: &[(&str, &str)], details: &mut Vec<String>) -> i64 {
    let mut total = 0;
    for (what, sql) in checks {
        let n = count(c, sql).await;
        if n > 0 {
            details.push(format!("{n} × {what}"));
        }
        total += n;
    }
    total
}

/// Requests no fault touched (see the module doc) and how many of them
/// have a `lease_expired` or `failed` step or did not complete, with up to
/// five examples: each with its life and steps in seconds since `since`,
/// the worker of each step, and the daemons' log lines that name it.
async fn harmed(
    c: &Client,
    faults: &[Injected],
    poisoned: &[Uuid],
    held: &[(Uuid, DateTime<Utc>, DateTime<Utc>)],
    since: DateTime<Utc>,
    logs: &[std::path::PathBuf],
) -> (i64, i64, Vec<String>) {
    let recovery = chrono::Duration::from_std(RECOVERY).unwrap();
    let (starts, ends): (Vec<DateTime<Utc>>, Vec<DateTime<Utc>>) = faults
        .iter()
        .filter(|f| f.fault != Fault::Poison)
        .map(|f| (f.start, f.end + recovery))
        .unzip();
    let held_users: Vec<Uuid> = held.iter().map(|h| h.0).collect();
    let held_from: Vec<DateTime<Utc>> = held.iter().map(|h| h.1).collect();
    let held_to: Vec<DateTime<Utc>> = held.iter().map(|h| h.2 + recovery).collect();
    let rows = c
        .query(
            "WITH untouched AS (
                 SELECT r.id, r.status, r.created_at, r.updated_at FROM pipeline_runs r
                 WHERE NOT (r.id = ANY($6)) AND r.user_query NOT LIKE 'chaos poison%'
                   -- A wait cancelled or left to expire ends as planned
                   -- (waits::checks judges it).
                   AND r.user_query NOT LIKE 'chaos % cancel %' AND r.user_query NOT LIKE 'chaos % expire %'
                   AND NOT EXISTS (SELECT 1 FROM unnest($1::timestamptz[], $2::timestamptz[]) AS w(s, e)
                                   WHERE r.created_at <= w.e AND r.updated_at >= w.s)
                   AND NOT EXISTS (SELECT 1 FROM unnest($3::uuid[], $4::timestamptz[], $5::timestamptz[]) AS h(u, s, e)
                                   WHERE r.user_id = h.u AND r.created_at <= h.e AND r.updated_at >= h.s)
                   AND NOT EXISTS (SELECT 1 FROM pipeline_steps s
                                   WHERE s.run_id = r.id AND s.outcome IN ('retrying', 'deferred'))
             ),
             judged AS (
                 SELECT u.id, u.status,
                        format('created %s s, last change %s s',
                               extract(epoch FROM u.created_at - $7)::numeric(8, 2), extract(epoch FROM u.updated_at - $7)::numeric(8, 2)) AS life,
                        (SELECT string_agg(s.stage || '#' || s.attempt || ' ' || s.outcome
                                           || coalesce(' ' || s.error_class, '')
                                           || format(' (%s, %s–%s s)', s.worker,
                                                     extract(epoch FROM s.started_at - $7)::numeric(8, 2), extract(epoch FROM s.finished_at - $7)::numeric(8, 2)),
                                           ', ' ORDER BY s.id)
                         FROM pipeline_steps s WHERE s.run_id = u.id) AS steps,
                        u.status <> 'COMPLETED' OR EXISTS (
                            SELECT 1 FROM pipeline_steps s
                            WHERE s.run_id = u.id AND s.outcome IN ('lease_expired', 'failed')) AS harmed
                 FROM untouched u
             )
             SELECT (SELECT count(*) FROM judged), (SELECT count(*) FROM judged WHERE harmed),
                    coalesce((SELECT array_agg(e) FROM (SELECT id::text || ' ' || status || ' (' || life || '): ' || coalesce(steps, '') AS e
                                                        FROM judged WHERE harmed LIMIT 5) x), '{}')",
            &[&starts, &ends, &held_users, &held_from, &held_to, &poisoned, &since],
        )
        .await
        .unwrap();
    let row = &rows[0];
    let mut examples: Vec<String> = row.get(2);
    let texts: Vec<String> = logs
        .iter()
        .map(|l| strip_ansi(&std::fs::read_to_string(l).unwrap_or_default()))
        .collect();
    for e in &mut examples {
        let id = e.split(' ').next().unwrap_or_default().to_owned();
        for (i, text) in texts.iter().enumerate() {
            // The request's own lines, and any heartbeat trouble of the run.
            let named = text.lines().filter(|l| l.contains(&id)).take(6);
            let heartbeat = text.lines().filter(|l| l.contains("heartbeat")).take(4);
            for line in named.chain(heartbeat) {
                let _ = write!(e, "\n    daemon log {i}: {line}");
            }
        }
    }
    (row.get(0), row.get(1), examples)
}

async fn check(c: &Client, acked: &[Uuid], faults: &[Injected]) -> Verdict {
    let mut v = Verdict {
        acked: acked.len() as i64,
        ..Verdict::default()
    };
    v.requests = count(c, "SELECT count(*) FROM pipeline_runs").await;
    v.completed = count(c, "SELECT count(*) FROM pipeline_runs WHERE status = 'COMPLETED'").await;
    v.failed = count(c, "SELECT count(*) FROM pipeline_runs WHERE status = 'FAILED'").await;
    v.cancelled = count(c, "SELECT count(*) FROM pipeline_runs WHERE status = 'CANCELLED'").await;
    v.stuck = count(
        c,
        "SELECT count(*) FROM pipeline_runs WHERE status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')",
    )
    .await;
    v.lost = c
        .query_one(
            "SELECT count(*) FROM unnest($1::uuid[]) AS a(id)
             WHERE NOT EXISTS (SELECT 1 FROM pipeline_runs r WHERE r.id = a.id)",
            &[&acked],
        )
        .await
        .unwrap()
        .get(0);
    // An id acknowledged twice would be one request acknowledged to two
    // submissions (an idempotency key that answered for another query).
    let mut ids = acked.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let acked_twice = acked.len() as i64 - ids.len() as i64;
    let dup_checks = [
        (
            // A request that asked the user is analyzed again with the reply.
            "stage succeeded twice",
            "SELECT count(*) FROM (SELECT 1 FROM pipeline_steps s WHERE outcome = 'succeeded'
                                  GROUP BY run_id, stage
                                  HAVING count(*) > 1 + (stage = 'analyze' AND EXISTS (
                                      SELECT 1 FROM raw_logs l WHERE l.request_id = s.run_id
                                        AND l.message_type = 'assistant_question'))::int) s",
        ),
        (
            "raw log written twice",
            "SELECT count(*) FROM (SELECT 1 FROM raw_logs WHERE request_id IS NOT NULL
                                  GROUP BY request_id, message_type HAVING count(*) > 1) l",
        ),
        (
            "raw log archived twice",
            "SELECT count(*) FROM (SELECT 1 FROM lsm_storage, unnest(raw_log_ids) AS x(id)
                                  GROUP BY x.id HAVING count(*) > 1) a",
        ),
        (
            "submission made two requests",
            "SELECT count(*) FROM (SELECT 1 FROM pipeline_runs GROUP BY user_query HAVING count(*) > 1) q",
        ),
    ];
    v.duplicates = acked_twice;
    if acked_twice > 0 {
        v.details.push(format!("{acked_twice} request ids acknowledged twice"));
    }
    v.duplicates += violations(c, &dup_checks, &mut v.details).await;
    v.failed_without_reason = count(
        c,
        "SELECT count(*) FROM pipeline_runs WHERE status = 'FAILED' AND coalesce(btrim(error), '') = ''",
    )
    .await;
    let consistency = [
        (
            "COMPLETED without an answer",
            "SELECT count(*) FROM pipeline_runs WHERE status = 'COMPLETED' AND final_answer IS NULL",
        ),
        (
            "COMPLETED without its logged answer",
            "SELECT count(*) FROM pipeline_runs r WHERE status = 'COMPLETED' AND NOT EXISTS (
                 SELECT 1 FROM raw_logs l WHERE l.request_id = r.id AND l.message_type = 'assistant_response'
                   AND l.content = r.final_answer AND l.user_id = r.user_id)",
        ),
        (
            "answer logged for a request that is not COMPLETED",
            "SELECT count(*) FROM raw_logs l JOIN pipeline_runs r ON r.id = l.request_id
             WHERE l.message_type = 'assistant_response' AND r.status <> 'COMPLETED'",
        ),
        (
            "request without its logged query",
            "SELECT count(*) FROM pipeline_runs r WHERE NOT EXISTS (
                 SELECT 1 FROM raw_logs l WHERE l.request_id = r.id AND l.message_type = 'user_query')",
        ),
        (
            "COMPLETED without a succeeded step per stage",
            "SELECT count(*) FROM pipeline_runs r WHERE status = 'COMPLETED' AND (
                 SELECT count(DISTINCT stage) FROM pipeline_steps s
                 WHERE s.run_id = r.id AND s.outcome = 'succeeded') <> 3",
        ),
    ];
    v.inconsistent = violations(c, &consistency, &mut v.details).await;
    let wait_checks = waits::checks();
    let wait_checks: Vec<(&str, &str)> = wait_checks.iter().map(|(w, q)| (*w, q.as_str())).collect();
    v.waits = violations(c, &wait_checks, &mut v.details).await;
    v.waited = Some(waits::figures(c).await);
    v.llm_steps_succeeded = count(
        c,
        "SELECT count(*) FROM pipeline_steps WHERE outcome = 'succeeded' AND stage IN ('analyze', 'respond')",
    )
    .await;
    for row in c
        .query(
            "SELECT left(coalesce(error, '(none)'), 90), count(*) FROM pipeline_runs
             WHERE status = 'FAILED' GROUP BY 1 ORDER BY 2 DESC LIMIT 8",
            &[],
        )
        .await
        .unwrap()
    {
        v.failed_reasons.push((row.get(0), row.get(1)));
    }
    let windows: Vec<(DateTime<Utc>, DateTime<Utc>)> = faults
        .iter()
        .map(|f| (f.start, f.end + chrono::Duration::from_std(RECOVERY).unwrap()))
        .collect();
    for row in c
        .query(
            // A request that waited for a person is left out: its time
            // is the replier's and the reviewer's.
            "SELECT created_at, extract(epoch FROM updated_at - created_at)::float8 * 1000
             FROM pipeline_runs WHERE status = 'COMPLETED' AND clarify IS NOT TRUE AND review IS NOT TRUE",
            &[],
        )
        .await
        .unwrap()
    {
        let created: DateTime<Utc> = row.get(0);
        let ms: f64 = row.get(1);
        v.e2e_ms.push(ms);
        if windows.iter().any(|(s, e)| created >= *s && created <= *e) {
            v.e2e_ms_faults.push(ms);
        }
    }
    v.e2e_ms.sort_by(f64::total_cmp);
    v.e2e_ms_faults.sort_by(f64::total_cmp);
    v
}

/// The least share of its load each door must have acknowledged, and of the
/// acknowledged requests that must complete: a run where the submissions
/// failed (nothing acknowledged, so nothing to lose) or every request
/// failed proves nothing. Recorded runs acknowledge 99 % and complete 92 %
/// or more (docs/chaos.md).
const LEAST_DONE: f64 = 0.5;

/// Why the run did too little to count, if it did: a door (INSERT, HTTP
/// 202; `acked` in that order) acknowledged less than [`LEAST_DONE`] of its
/// half of `rate` requests per second over `load_secs`, or fewer than
/// [`LEAST_DONE`] of the acknowledged requests completed.
fn too_little_done(rate: f64, load_secs: f64, acked: [u64; 2], completed: i64) -> Vec<String> {
    let offered = rate / 2.0 * load_secs;
    let least = ((offered * LEAST_DONE).floor() as u64).max(1);
    let mut problems: Vec<String> = ["INSERT", "HTTP 202"]
        .iter()
        .zip(acked)
        .filter(|(_, n)| *n < least)
        .map(|(door, n)| {
            format!(
                "only {n} submissions acknowledged by {door} of about {offered:.0} offered; at least {least} needed"
            )
        })
        .collect();
    let total = acked.iter().sum::<u64>();
    let least_completed = (total as f64 * LEAST_DONE).ceil() as i64;
    if completed < least_completed {
        problems.push(format!(
            "only {completed} of the {total} acknowledged requests completed; at least {least_completed} needed"
        ));
    }
    problems
}

/// A percentile of milliseconds, to the millisecond.
fn ms_percentile(sorted: &[f64], p: f64) -> Option<f64> {
    percentile(sorted, p).map(f64::round)
}

// ------------------------------------------------------------------- main

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs bench
    // targets without it, and a test run must not start a chaos run.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("chaos: not run under `cargo bench` (use bin/chaos); nothing to do");
        return;
    }
    let args = parse_args();
    let rt = support::runtime();
    let passed = rt.block_on(run(args));
    rt.shutdown_timeout(Duration::from_secs(5));
    std::process::exit(i32::from(!passed));
}

#[allow(clippy::too_many_lines, reason = "one scenario, read top to bottom")]
async fn run(args: Args) -> bool {
    let cluster = support::start_cluster("maas-chaos-pg", MAX_CONNECTIONS).await;
    let url = support::fresh_database(&cluster, "chaos").await;

    let fake = analysis_provider(None).await;
    // Pretty-printed, so that a streamed answer comes in many pieces.
    let reply =
        serde_json::to_string_pretty(&serde_json::from_str::<Value>(&maas::llm::offline::analysis_example()).unwrap())
            .unwrap();
    fake.set_default(reply.clone(), None);
    // The poison fault's replies (the same text answers the analyzer and the
    // responder): a NUL in a keyword and in the answer; an analysis and an
    // answer of 1.2 million characters.
    let analysis_with = |keyword: &str| {
        json!({"needs_context": false, "context_type": "none", "time_scope": "none",
               "search_keywords": [keyword], "context_found": null})
        .to_string()
    };
    fake.answer_when(&[POISON_NUL], Reply::text(analysis_with("nul\u{0}here")));
    fake.answer_when(&[POISON_HUGE], Reply::text(analysis_with(&"h".repeat(1_200_000))));
    // A request that may ask its user is asked a question.
    fake.answer_when(&waits::needles(), Reply::text(waits::asking(&reply)));
    let rates = FaultRates {
        rate_limited: 0.03,
        server_error: 0.03,
        timeout: 0.02,
        invalid_json: 0.02,
        stream_cut: 0.03,
        stream_error: 0.03,
        timeout_delay: Duration::from_secs(LLM_TIMEOUT_SECS + 2),
    };
    fake.set_faults(rates.clone());

    let shared = Arc::new(Shared {
        acked: Mutex::new(Vec::new()),
        http: Mutex::new(vec![None; DAEMONS]),
        sql_acked: AtomicU64::new(0),
        sql_errors: AtomicU64::new(0),
        http_acked: AtomicU64::new(0),
        http_retries: AtomicU64::new(0),
        http_given_up: AtomicU64::new(0),
        seq: AtomicU64::new(0),
        users: (0..USERS).map(|_| Uuid::new_v4()).collect(),
        followers: Mutex::new(Vec::new()),
        waits: waits::Tally::default(),
    });
    let mut daemons = Daemons {
        url: url.clone(),
        provider_url: fake.openai_base_url(),
        slots: Vec::new(),
        logs: Vec::new(),
        unexpected_exits: Vec::new(),
    };
    // The first one migrates alone; then the others.
    let (first, addr) = daemons
        .start()
        .await
        .unwrap_or_else(|log| panic!("maasd did not start:\n{log}"));
    daemons.slots.push(first);
    shared.http.lock().unwrap()[0] = Some(addr);
    for i in 1..DAEMONS {
        let (d, addr) = daemons
            .start()
            .await
            .unwrap_or_else(|log| panic!("maasd did not start:\n{log}"));
        daemons.slots.push(d);
        shared.http.lock().unwrap()[i] = Some(addr);
    }

    waits::create_tenant(&connect(&url, Duration::from_secs(30)).await).await;
    eprintln!(
        "chaos: {} s, {} requests/s, {DAEMONS} daemons (lease {LEASE_SECS} s, sweep {SWEEP_SECS} s), PostgreSQL on port {}",
        args.seconds, args.rate, cluster.port
    );
    let started = Instant::now();
    let started_at = Utc::now();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut load = JoinSet::new();
    let sql_loaders = 3;
    for _ in 0..sql_loaders {
        load.spawn(sql_loader(
            url.clone(),
            Arc::clone(&shared),
            args.rate / 2.0 / f64::from(sql_loaders),
            stop_rx.clone(),
        ));
    }
    load.spawn(http_loader(Arc::clone(&shared), args.rate / 2.0, stop_rx.clone()));
    // The user and the operator answer until the drain ends.
    let (people_stop_tx, people_stop_rx) = tokio::sync::watch::channel(false);
    let mut people = JoinSet::new();
    people.spawn(waits::replier(url.clone(), Arc::clone(&shared), people_stop_rx.clone()));
    people.spawn(waits::reviewer(url.clone(), Arc::clone(&shared), people_stop_rx));

    let mut injector = Injector {
        cluster: cluster.clone(),
        url: url.clone(),
        daemons,
        fake,
        shared: Arc::clone(&shared),
        log: Vec::new(),
        started,
        kinds: args.kinds.clone(),
        poisoned: Vec::new(),
        held: Vec::new(),
    };
    injector.run(args.seconds).await;
    tokio::time::sleep(Duration::from_secs(args.seconds).saturating_sub(started.elapsed())).await;
    let load_secs = started.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    while load.join_next().await.is_some() {}

    // Quiescence: every request terminal, within the deadline.
    injector.daemons.check_alive(&shared).await;
    let checker = connect(&url, Duration::from_secs(30)).await;
    let t_drain = Instant::now();
    let in_flight = "SELECT count(*) FROM pipeline_runs WHERE status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')";
    let drained = poll_until(
        Duration::from_secs(args.drain_secs),
        Duration::from_millis(250),
        || async { count(&checker, in_flight).await == 0 },
    )
    .await;
    let drain_secs = t_drain.elapsed().as_secs_f64();
    if !drained {
        let n = count(&checker, in_flight).await;
        eprintln!("chaos: {n} requests still in flight after {drain_secs:.0} s");
    }
    let _ = people_stop_tx.send(true);
    while people.join_next().await.is_some() {}
    injector.daemons.check_alive(&shared).await;
    let acked = shared.acked.lock().unwrap().clone();
    let (streams, stream_details) = judge_streams(&checker, &shared, &reply, Duration::from_secs(30)).await;
    let mut v = check(&checker, &acked, &injector.log).await;
    let (untouched, harmed_n, examples) = harmed(
        &checker,
        &injector.log,
        &injector.poisoned,
        &injector.held,
        started_at,
        &injector.daemons.logs,
    )
    .await;
    v.untouched = untouched;
    v.harmed = harmed_n;
    if harmed_n > 0 {
        v.details.push(format!(
            "{harmed_n} of {untouched} requests no fault touched have a lease_expired or failed step or did not complete: {}",
            examples.join(" | ")
        ));
    }
    let tally = injector.fake.tally();
    let mut problems = v.details.clone();
    problems.extend(injector.daemons.unexpected_exits.iter().cloned());
    if v.llm_steps_succeeded > i64::try_from(tally.completions).unwrap() {
        problems.push(format!(
            "{} analyze/respond steps succeeded but the provider sent only {} completions",
            v.llm_steps_succeeded, tally.completions
        ));
    }
    if streams.violations() > 0 {
        problems.push(format!(
            "streaming clients: {} never saw the end, {} held text that is not a prefix of the answer, {} pieces of an attempt not announced, {} terminal answers not the stored one",
            streams.unfinished, streams.not_prefix, streams.foreign, streams.wrong_answer
        ));
        problems.extend(stream_details);
    }
    if v.failed_without_reason > 0 {
        problems.push(format!("{} FAILED runs without a reason", v.failed_without_reason));
    }
    let mut faults: BTreeMap<&str, u64> = args.kinds.iter().map(|f| (f.name(), 0)).collect();
    for f in &injector.log {
        *faults.entry(f.fault.name()).or_default() += 1;
    }
    let missing: Vec<&str> = faults.iter().filter(|(_, n)| **n == 0).map(|(k, _)| *k).collect();
    if !missing.is_empty() {
        problems.push(format!("fault kinds never injected: {}", missing.join(", ")));
    }
    problems.extend(too_little_done(
        args.rate,
        load_secs,
        [
            shared.sql_acked.load(Ordering::Relaxed),
            shared.http_acked.load(Ordering::Relaxed),
        ],
        v.completed,
    ));
    let passed = v.lost == 0
        && v.duplicates == 0
        && v.stuck == 0
        && v.failed_without_reason == 0
        && v.inconsistent == 0
        && v.harmed == 0
        && v.waits == 0
        && problems.is_empty();

    // Stop everything this run started.
    for d in &mut injector.daemons.slots {
        d.signal(Signal::SIGCONT);
        d.kill();
    }
    drop(checker);
    support::stop_cluster(cluster.clone()).await;

    let p99_faults = ms_percentile(&v.e2e_ms_faults, 0.99);
    let mut t = String::new();
    let _ = writeln!(t, "{:<34} {:>10}", "check", "value");
    let mut row = |k: &str, val: String| {
        let _ = writeln!(t, "{k:<34} {val:>10}");
    };
    row("requests in the database", v.requests.to_string());
    row("  acknowledged to a client", v.acked.to_string());
    row(
        "    by INSERT / by HTTP 202",
        format!(
            "{} / {}",
            shared.sql_acked.load(Ordering::Relaxed),
            shared.http_acked.load(Ordering::Relaxed)
        ),
    );
    row("  COMPLETED", v.completed.to_string());
    row("  FAILED (each with a reason)", v.failed.to_string());
    row("  CANCELLED", v.cancelled.to_string());
    row("lost", v.lost.to_string());
    row("duplicates", v.duplicates.to_string());
    row("stuck", v.stuck.to_string());
    row("inconsistent", v.inconsistent.to_string());
    row("FAILED without a reason", v.failed_without_reason.to_string());
    row(
        "untouched by faults / harmed",
        format!("{} / {}", v.untouched, v.harmed),
    );
    row("poisoned requests", injector.poisoned.len().to_string());
    let w = v.waited.as_ref().unwrap();
    let wt = &shared.waits;
    row(
        "waited: asked / replied / reviewed",
        format!("{} / {} / {}", w.asked, w.replied, w.reviewed),
    );
    row(
        "  answered: waited / of them COMPLETED",
        format!("{} / {}", w.waited, w.waited_completed),
    );
    row(
        "  replies SQL / HTTP, reviews, cancels",
        format!(
            "{} / {}, {}, {}",
            wt.replies_sql.load(Ordering::Relaxed),
            wt.replies_http.load(Ordering::Relaxed),
            wt.reviews.load(Ordering::Relaxed),
            wt.cancels.load(Ordering::Relaxed)
        ),
    );
    row("  cancelled while waiting", w.cancelled.to_string());
    row(
        "  expired: questions / reviews, latest past limit",
        format!(
            "{} / {}, {:.2} s",
            w.expired_questions, w.expired_reviews, w.expiry_late_max_s
        ),
    );
    row(
        "  resent and refused / errors",
        format!(
            "{} / {}",
            wt.refused.load(Ordering::Relaxed),
            wt.errors.load(Ordering::Relaxed)
        ),
    );
    row("  wait violations", v.waits.to_string());
    row(
        "streamed: followed / violations",
        format!("{} / {}", streams.followed, streams.violations()),
    );
    row(
        "  restarts / reconnects seen",
        format!("{} / {}", streams.restarts, streams.reconnects),
    );
    row(
        "e2e ms p50 / p99 (all)",
        format!(
            "{} / {}",
            ms_percentile(&v.e2e_ms, 0.5).unwrap_or(f64::NAN),
            ms_percentile(&v.e2e_ms, 0.99).unwrap_or(f64::NAN)
        ),
    );
    row(
        "e2e ms p99 during faults",
        format!("{} (n={})", p99_faults.unwrap_or(f64::NAN), v.e2e_ms_faults.len()),
    );
    row(
        "SQL insert errors (not acked)",
        shared.sql_errors.load(Ordering::Relaxed).to_string(),
    );
    row(
        "HTTP retries / given up",
        format!(
            "{} / {}",
            shared.http_retries.load(Ordering::Relaxed),
            shared.http_given_up.load(Ordering::Relaxed)
        ),
    );
    row(
        "provider: ok/429/500/timeout/junk/cut/err",
        format!(
            "{}/{}/{}/{}/{}/{}/{}",
            tally.completions,
            tally.rate_limited,
            tally.server_error,
            tally.timeout,
            tally.invalid_json,
            tally.stream_cut,
            tally.stream_error
        ),
    );
    row(
        "load seconds / drain seconds",
        format!("{load_secs:.0} / {drain_secs:.1}"),
    );
    for (k, n) in &faults {
        row(&format!("fault {k}"), n.to_string());
    }
    print!("{t}");
    println!("faults injected (start, kind, what happened):");
    for f in &injector.log {
        println!(
            "  {}  {:<22} {} ({:.1} s)",
            f.start.format("%H:%M:%S%.3f"),
            f.fault.name(),
            f.note,
            (f.end - f.start).as_seconds_f64()
        );
    }
    if !v.failed_reasons.is_empty() {
        println!("FAILED reasons:");
        for (reason, n) in &v.failed_reasons {
            println!("  {n:>5}  {reason}");
        }
    }
    for p in &problems {
        println!("PROBLEM: {p}");
    }
    println!("{}", if passed { "chaos: PASS" } else { "chaos: FAIL" });
    if args.json {
        let out = json!({
            "seconds": args.seconds,
            "requests": v.requests,
            "acknowledged": v.acked,
            "completed": v.completed,
            "failed": v.failed,
            "cancelled": v.cancelled,
            "lost": v.lost,
            "duplicates": v.duplicates,
            "stuck": v.stuck,
            "inconsistent": v.inconsistent,
            "failed_without_reason": v.failed_without_reason,
            "untouched": v.untouched,
            "harmed": v.harmed,
            "waits": {
                "asked": w.asked,
                "replied": w.replied,
                "reviewed": w.reviewed,
                "waited": w.waited,
                "waited_completed": w.waited_completed,
                "cancelled": w.cancelled,
                "expired_questions": w.expired_questions,
                "expired_reviews": w.expired_reviews,
                "expiry_late_max_s": w.expiry_late_max_s,
                "refused": wt.refused.load(Ordering::Relaxed),
                "violations": v.waits,
            },
            "faults": faults,
            "provider": {
                "completions": tally.completions,
                "rate_limited": tally.rate_limited,
                "server_error": tally.server_error,
                "timeout": tally.timeout,
                "invalid_json": tally.invalid_json,
                "stream_cut": tally.stream_cut,
                "stream_error": tally.stream_error,
            },
            "streamed": streams.followed,
            "stream_violations": streams.violations(),
            "p50_e2e_ms": ms_percentile(&v.e2e_ms, 0.5),
            "p99_e2e_ms": ms_percentile(&v.e2e_ms, 0.99),
            "p99_e2e_ms_during_faults": p99_faults,
            "passed": passed,
        });
        println!("{out}");
    }
    passed
}
