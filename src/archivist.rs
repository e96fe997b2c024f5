//! The archivist: novelty-triggered long-term memory from raw logs, exactly
//! once (seed 000 "Фоновый цикл архивирования", seed 004).
//!
//! Which users: every raw log takes the next number of its user's sequence
//! (`raw_logs.user_seq`, kept with the user's counters in `archive_marks` by
//! a trigger); a user's high-water mark `archived_seq` says every log up to it
//! is archived, so pending = `logged_seq - archived_seq`, read from one row.
//! A user is a candidate when pending ≥ N or the oldest pending log is older
//! than T, and the user was active within A, and not archived within the
//! cooldown ([`Thresholds`]). Selection reads `archive_marks` through a
//! partial index, never `raw_logs`.
//!
//! What: a user's pending logs, in bounded batches (`batch_logs`), grouped by
//! thread; a thread longer than the archivist model's budget
//! (`chunk_tokens`, counted with [`TokenCounter`]) is split into chunks; each
//! chunk goes to the `Archivist` prompt and its JSON answer
//! (`time_bucket_start`, `time_bucket_end`, `tags`, `summary`) is validated;
//! one `lsm_storage` row per chunk carries the exact `raw_log_ids` it covers.
//!
//! Exactly once: the model is called with no transaction open; the records
//! of a batch and the mark's advance are then written by one statement
//! fenced on the mark the batch started from ([`repo::archive::commit_batch`]).
//! Two runners (two daemons, cron and `maasctl`) can both call the model for
//! the same logs only if one's lease ran out, and then only one commit
//! applies. A crash loses at most the uncommitted batch, which the next run
//! redoes from the mark.
//!
//! Failures follow the stages' classification ([`crate::stage::from_llm`]):
//! the user gets a durable `retry_after` (exponential backoff, or the
//! provider's `Retry-After`), one user's failure never stops the others, and
//! every run leaves a row in `archive_runs`.
//!
//! Schedule: [`run_scheduled`] runs inside `maasd` on a 6-field UTC cron
//! expression; a tick runs once cluster-wide (a forward-only row per tick,
//! `archive_schedule`) and never overlaps a run still going in this process.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::Config;
use crate::db::{self, Pool};
use crate::error::Disposition;
use crate::llm::{ChatRequest, Llm, LlmDisposition, Role};
use crate::repo;
use crate::repo::archive::{Candidate, Committed, NewRecord, PendingLog, RunTotals, Thresholds};
use crate::stage::analyzer::strip_fence;
use crate::stage::tokens::TokenCounter;
use crate::stage::{StageError, from_llm};

/// `[archivist]`: when and how the archivist works.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ArchivistConfig {
    /// Run on `schedule` inside `maasd`. Default true. `maasctl archivist
    /// run` works either way.
    pub enabled: bool,
    /// When to run: a 6-field cron expression (seconds first), in UTC.
    /// Default `"0 0 */6 * * *"`: every 6 hours on the hour.
    pub schedule: String,
    /// N: a user with at least this many pending logs is archived. Default 20.
    pub min_pending: u64,
    /// T: a user whose oldest pending log is this old is archived however
    /// few logs are pending. Default 86400 (one day).
    pub max_pending_age_secs: u64,
    /// A: only users with a log within this many seconds are selected.
    /// Default 2592000 (30 days).
    pub active_within_secs: u64,
    /// A user is not selected again within this many seconds of being
    /// archived. Default 3600.
    pub cooldown_secs: u64,
    /// Token budget of the messages of one archivist call (counted with the
    /// archivist model's tokenizer, or a conservative estimate); a longer
    /// thread is split into chunks, one LSM record each. Default 6000.
    pub chunk_tokens: usize,
    /// Most logs of one user read, summarised and committed together; the
    /// unit of progress a crash can lose. Default 200.
    pub batch_logs: usize,
    /// Users archived at once by one run. Default 4.
    pub concurrency: usize,
    /// Lease on a user while a runner works on it; renewed every third.
    /// Default 60.
    pub lease_secs: u64,
    /// Candidates read per selection query. Default 256.
    pub page_users: usize,
}

impl Default for ArchivistConfig {
    fn default() -> Self {
        ArchivistConfig {
            enabled: true,
            schedule: "0 0 */6 * * *".into(),
            min_pending: 20,
            max_pending_age_secs: 86_400,
            active_within_secs: 30 * 86_400,
            cooldown_secs: 3600,
            chunk_tokens: 6000,
            batch_logs: 200,
            concurrency: 4,
            lease_secs: 60,
            page_users: 256,
        }
    }
}

impl ArchivistConfig {
    /// The problem with a value, named by key.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        for (key, v) in [
            ("archivist.chunk_tokens", self.chunk_tokens),
            ("archivist.batch_logs", self.batch_logs),
            ("archivist.concurrency", self.concurrency),
            ("archivist.page_users", self.page_users),
        ] {
            if v == 0 {
                return Some((key, "must be at least 1".into()));
            }
        }
        if self.lease_secs < 3 {
            return Some(("archivist.lease_secs", "must be at least 3".into()));
        }
        if self.chunk_tokens < 64 {
            return Some(("archivist.chunk_tokens", "must be at least 64".into()));
        }
        if let Err(e) = cron_schedule(&self.schedule) {
            return Some(("archivist.schedule", e));
        }
        None
    }

    pub fn thresholds(&self) -> Thresholds {
        Thresholds {
            min_pending: self.min_pending,
            max_pending_age: Duration::from_secs(self.max_pending_age_secs),
            active_within: Duration::from_secs(self.active_within_secs),
            cooldown: Duration::from_secs(self.cooldown_secs),
        }
    }

    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.lease_secs)
    }
}

/// Parses a 6-field cron expression (seconds first), as tokio-cron-scheduler
/// does.
pub fn cron_schedule(expr: &str) -> Result<croner::Cron, String> {
    let fields = expr.split_whitespace().count();
    if fields != 6 {
        return Err(format!(
            "{expr:?} has {fields} fields; expected 6 (sec min hour day-of-month month day-of-week), in UTC"
        ));
    }
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Required)
        .dom_and_dow(true)
        .build()
        .parse(expr)
        .map_err(|e| format!("{expr:?} is not a cron expression: {e}"))
}

#[derive(Debug, thiserror::Error)]
pub enum ArchivistError {
    #[error(transparent)]
    Db(#[from] db::Error),
    #[error("no active Archivist prompt in system_prompts")]
    NoPrompt,
    #[error("archivist schedule: {0}")]
    Schedule(String),
}

impl From<tokio_postgres::Error> for ArchivistError {
    fn from(e: tokio_postgres::Error) -> Self {
        ArchivistError::Db(e.into())
    }
}

impl From<deadpool_postgres::PoolError> for ArchivistError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        ArchivistError::Db(e.into())
    }
}

/// Who started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The schedule inside `maasd`.
    Cron,
    /// An operator (`maasctl archivist run`).
    Manual,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Cron => "cron",
            Trigger::Manual => "manual",
        }
    }
}

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    pub trigger: Trigger,
    /// Only this user, regardless of thresholds and cooldown.
    pub user: Option<Uuid>,
    /// Select and plan (users, logs, chunks) without calling a model or
    /// writing anything.
    pub dry_run: bool,
    /// The cron tick a scheduled run belongs to.
    pub tick: Option<DateTime<Utc>>,
}

/// What happened to one user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UserOutcome {
    /// Records written and the mark moved.
    Archived,
    /// Nothing pending.
    Nothing,
    /// Another runner holds the user's lease.
    Busy,
    /// Another runner archived these logs first; this run's work was dropped.
    Raced,
    /// A failure; the user backs off (see `archive_marks.retry_after`).
    Failed,
    /// Shutdown came first; nothing of the unfinished batch was written.
    Cancelled,
    /// Dry run: what would be done.
    Planned,
}

/// One user's part of a run.
#[derive(Debug, Clone, Serialize)]
pub struct UserReport {
    pub user_id: Uuid,
    pub outcome: UserOutcome,
    /// Logs covered by the records written (planned, for a dry run).
    pub logs: i64,
    /// Records written (chunks planned, for a dry run).
    pub records: i64,
    /// The memory version after this run's last commit.
    pub memory_version: Option<i64>,
    pub error_class: Option<String>,
    pub error: Option<String>,
}

impl UserReport {
    fn new(user_id: Uuid, outcome: UserOutcome) -> UserReport {
        UserReport {
            user_id,
            outcome,
            logs: 0,
            records: 0,
            memory_version: None,
            error_class: None,
            error: None,
        }
    }
}

/// The result of a run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The `archive_runs` row (none for a dry run).
    pub run_id: Option<i64>,
    pub dry_run: bool,
    pub users: Vec<UserReport>,
    pub users_archived: i64,
    pub logs: i64,
    pub records: i64,
    pub failures: i64,
    pub duration_ms: u64,
}

/// Progress of a run, for a terminal's progress bar or plain lines.
pub trait Progress: Send + Sync {
    /// `n` more users are about to be worked on.
    fn add_users(&self, _n: usize) {}
    /// One user is done.
    fn user_done(&self, _report: &UserReport) {}
}

/// No progress output.
pub struct Quiet;
impl Progress for Quiet {}

/// One message of a chunk, as sent to the model.
#[derive(Debug, Clone)]
struct ChunkMessage<'a> {
    log: &'a PendingLog,
    /// The content, cut to the budget when one message alone exceeds it.
    content: &'a str,
}

/// Groups logs by thread (in order of first appearance; logs without a
/// thread form one group) and splits each group so that no chunk's messages
/// exceed `budget` tokens. A single message longer than the budget is cut
/// to it (its id is still covered).
fn plan_chunks<'a>(logs: &'a [PendingLog], counter: &TokenCounter, budget: usize) -> Vec<Vec<ChunkMessage<'a>>> {
    /// Tokens of a message's envelope (type, time, JSON punctuation).
    const ENVELOPE: usize = 24;
    let mut groups: Vec<(Option<Uuid>, Vec<&PendingLog>)> = Vec::new();
    for log in logs {
        match groups.iter_mut().find(|(t, _)| *t == log.thread_id) {
            Some((_, g)) => g.push(log),
            None => groups.push((log.thread_id, vec![log])),
        }
    }
    let room = budget.saturating_sub(ENVELOPE).max(1);
    let mut chunks = Vec::new();
    for (_, group) in groups {
        let mut current: Vec<ChunkMessage<'a>> = Vec::new();
        let mut used = 0usize;
        for log in group {
            let content = counter.truncate(&log.content, room);
            let tokens = counter.count(content) + ENVELOPE;
            if !current.is_empty() && used + tokens > budget {
                chunks.push(std::mem::take(&mut current));
                used = 0;
            }
            current.push(ChunkMessage { log, content });
            used += tokens;
        }
        if !current.is_empty() {
            chunks.push(current);
        }
    }
    chunks
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The archivist's input for one chunk (seed 000: period and messages).
fn render_chunk(chunk: &[ChunkMessage<'_>]) -> String {
    let start = chunk.iter().map(|m| m.log.created_at).min().unwrap_or_else(Utc::now);
    let end = chunk.iter().map(|m| m.log.created_at).max().unwrap_or_else(Utc::now);
    json!({
        "start_date": rfc3339(start),
        "end_date": rfc3339(end),
        "raw_logs": chunk.iter().map(|m| json!({
            "message_type": m.log.message_type,
            "content": m.content,
            "created_at": rfc3339(m.log.created_at),
        })).collect::<Vec<_>>(),
    })
    .to_string()
}

/// The validated answer of the archivist model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveSummary {
    pub time_bucket_start: DateTime<Utc>,
    pub time_bucket_end: DateTime<Utc>,
    pub tags: Vec<String>,
    pub summary: String,
}

fn parse_time(v: Option<&Value>, key: &str) -> Result<DateTime<Utc>, String> {
    let s = v.and_then(Value::as_str).ok_or(format!("{key} must be a string"))?;
    // RFC 3339, also with a space for the `T` and PostgreSQL's `+00` offsets.
    let t = s.trim().replacen(' ', "T", 1);
    let short_offset = t.len() > 3 && {
        let (head, tail) = t.split_at(t.len() - 3);
        (tail.starts_with('+') || tail.starts_with('-'))
            && tail[1..].bytes().all(|b| b.is_ascii_digit())
            && head.contains('T')
    };
    let t = if short_offset { format!("{t}:00") } else { t };
    DateTime::parse_from_rfc3339(&t)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{key} is not an RFC 3339 time ({e})"))
}

/// Parses and validates the archivist's JSON: one object, possibly inside
/// a fenced code block, with `time_bucket_start` ≤ `time_bucket_end` (RFC
/// 3339), `tags` (strings; may be absent) and a non-empty `summary`.
pub fn parse_summary(text: &str) -> Result<ArchiveSummary, String> {
    let body = strip_fence(text.trim());
    let v: Value = serde_json::from_str(body).map_err(|e| format!("{e} (in {} bytes)", text.len()))?;
    let obj = v.as_object().ok_or("expected a JSON object")?;
    let start = parse_time(obj.get("time_bucket_start"), "time_bucket_start")?;
    let end = parse_time(obj.get("time_bucket_end"), "time_bucket_end")?;
    if start > end {
        return Err("time_bucket_start is after time_bucket_end".into());
    }
    let tags = match obj.get("tags") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|t| t.as_str().map(|s| s.trim().to_owned()).ok_or("tags must be strings"))
            .filter(|t| t.as_ref().map_or(true, |s| !s.is_empty()))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err("tags must be an array of strings".into()),
    };
    let summary = obj
        .get("summary")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or("summary must be a non-empty string")?;
    Ok(ArchiveSummary {
        time_bucket_start: start,
        time_bucket_end: end,
        tags,
        summary: summary.to_owned(),
    })
}

/// Invalid model output gets exactly one more try (as the analyzer's).
pub const INVALID_JSON_ATTEMPTS: u32 = 2;

/// Why a user's batch stopped.
enum BatchError {
    Model(StageError),
    LeaseLost,
    Cancelled,
    Db(db::Error),
}

/// The archivist of one process.
pub struct Archivist {
    pool: Pool,
    llm: Arc<Llm>,
    cfg: Arc<Config>,
    counter: TokenCounter,
    worker: String,
}

impl Archivist {
    pub fn new(pool: Pool, llm: Arc<Llm>, cfg: Arc<Config>, worker: String) -> Archivist {
        let counter = TokenCounter::for_model(llm.model(Role::Archivist));
        Archivist {
            pool,
            llm,
            cfg,
            counter,
            worker,
        }
    }

    fn acfg(&self) -> &ArchivistConfig {
        &self.cfg.archivist
    }

    /// One run: the given user, or every candidate (page by page until none
    /// is left that this run has not seen). Stops early, leaving a clean
    /// state, when `cancel` fires.
    pub async fn run(
        &self,
        opts: RunOptions,
        progress: &dyn Progress,
        cancel: &CancellationToken,
    ) -> Result<RunReport, ArchivistError> {
        let started = Instant::now();
        let client = self.pool.get().await?;
        let prompt = repo::active_prompts(&client)
            .await?
            .archivist
            .ok_or(ArchivistError::NoPrompt)?;
        let run_id = if opts.dry_run {
            None
        } else {
            Some(repo::archive::start_run(&client, opts.trigger.as_str(), &self.worker, opts.user, opts.tick).await?)
        };
        // Users take connections of their own; hold none across them.
        drop(client);
        tracing::info!(run = run_id, trigger = opts.trigger.as_str(), user = ?opts.user, dry_run = opts.dry_run,
            "archive run starting");
        let mut users: Vec<UserReport> = Vec::new();
        let work = |user: Uuid| {
            let prompt = prompt.as_str();
            async move {
                let report = if opts.dry_run {
                    self.plan_user(user).await
                } else {
                    self.archive_user(user, prompt, cancel).await
                };
                progress.user_done(&report);
                report
            }
        };
        if let Some(user) = opts.user {
            progress.add_users(1);
            users.push(work(user).await);
        } else {
            let mut seen: HashSet<Uuid> = HashSet::new();
            let thresholds = self.acfg().thresholds();
            while !cancel.is_cancelled() {
                let client = self.pool.get().await?;
                let page: Vec<Candidate> =
                    repo::archive::select_candidates(&client, &thresholds, self.acfg().page_users).await?;
                drop(client);
                let fresh: Vec<Uuid> = page.iter().map(|c| c.user_id).filter(|u| seen.insert(*u)).collect();
                if fresh.is_empty() {
                    break;
                }
                progress.add_users(fresh.len());
                let done: Vec<UserReport> = futures_util::stream::iter(fresh)
                    .map(work)
                    .buffer_unordered(self.acfg().concurrency)
                    .collect()
                    .await;
                users.extend(done);
                if opts.dry_run {
                    // A dry run changes nothing, so the same page would come back.
                    break;
                }
            }
        }
        let mut report = RunReport {
            run_id,
            dry_run: opts.dry_run,
            users_archived: count(&users, UserOutcome::Archived),
            logs: users.iter().map(|u| u.logs).sum(),
            records: users.iter().map(|u| u.records).sum(),
            failures: count(&users, UserOutcome::Failed),
            users,
            duration_ms: 0,
        };
        report.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if let Some(id) = run_id {
            let errors: Vec<Value> = report
                .users
                .iter()
                .filter(|u| u.outcome == UserOutcome::Failed)
                .map(|u| json!({"user_id": u.user_id, "class": u.error_class, "message": u.error}))
                .collect();
            let totals = RunTotals {
                users: i32::try_from(report.users.len()).unwrap_or(i32::MAX),
                users_archived: i32::try_from(report.users_archived).unwrap_or(i32::MAX),
                logs: report.logs,
                records: i32::try_from(report.records).unwrap_or(i32::MAX),
                failures: i32::try_from(report.failures).unwrap_or(i32::MAX),
                errors: Value::Array(errors),
            };
            let client = self.pool.get().await?;
            repo::archive::finish_run(&client, id, &totals).await?;
        }
        tracing::info!(
            run = run_id,
            users = report.users.len(),
            users_archived = report.users_archived,
            logs = report.logs,
            records = report.records,
            failures = report.failures,
            duration_ms = report.duration_ms,
            "archive run finished"
        );
        Ok(report)
    }

    /// A dry run for one user: how many logs are pending and how many
    /// chunks (records) the first batch would make.
    async fn plan_user(&self, user: Uuid) -> UserReport {
        let plan = async {
            let client = self.pool.get().await.map_err(db::Error::from)?;
            let Some(mark) = repo::archive::show_mark(&client, user).await? else {
                return Ok::<_, db::Error>(UserReport::new(user, UserOutcome::Nothing));
            };
            if mark.pending <= 0 {
                return Ok(UserReport::new(user, UserOutcome::Nothing));
            }
            let logs = repo::archive::pending_logs(
                &client,
                user,
                mark.archived_seq,
                mark.logged_seq,
                self.acfg().batch_logs,
            )
            .await?;
            let chunks = plan_chunks(&logs, &self.counter, self.acfg().chunk_tokens).len();
            let mut r = UserReport::new(user, UserOutcome::Planned);
            r.logs = mark.pending;
            r.records = i64::try_from(chunks).unwrap_or(i64::MAX);
            r.memory_version = Some(mark.memory_version);
            Ok(r)
        };
        plan.await.unwrap_or_else(|e| failed(user, "database", &e.to_string()))
    }

    /// Archives everything `user` has pending, batch by batch.
    async fn archive_user(&self, user: Uuid, prompt: &str, cancel: &CancellationToken) -> UserReport {
        let lease = self.acfg().lease();
        let client = match self.pool.get().await {
            Ok(c) => c,
            Err(e) => return failed(user, "database", &e.to_string()),
        };
        let claim = match repo::archive::claim_user(&client, user, &self.worker, lease).await {
            Ok(Some(c)) => c,
            Ok(None) => {
                // Unknown user, or another runner holds the lease.
                let known = matches!(repo::archive::show_mark(&client, user).await, Ok(Some(_)));
                return UserReport::new(user, if known { UserOutcome::Busy } else { UserOutcome::Nothing });
            }
            Err(e) => return failed(user, "database", &e.to_string()),
        };
        drop(client);
        let mut report = UserReport::new(user, UserOutcome::Nothing);
        report.memory_version = Some(claim.memory_version);
        let mut from = claim.archived_seq;
        let through = claim.logged_seq;
        let result: Result<(), BatchError> = async {
            while from < through {
                if cancel.is_cancelled() {
                    return Err(BatchError::Cancelled);
                }
                let client = self.pool.get().await.map_err(|e| BatchError::Db(e.into()))?;
                let logs = repo::archive::pending_logs(&client, user, from, through, self.acfg().batch_logs)
                    .await
                    .map_err(BatchError::Db)?;
                drop(client);
                // Fewer than a full batch: the batch reaches the end of the
                // sequence (gaps left by inserts that did nothing included).
                let to = match logs.last() {
                    Some(last) if logs.len() >= self.acfg().batch_logs => last.user_seq,
                    _ => through,
                };
                let records = if logs.is_empty() {
                    Vec::new()
                } else {
                    self.with_lease(user, cancel, self.summarise(prompt, &logs)).await??
                };
                let client = self.pool.get().await.map_err(|e| BatchError::Db(e.into()))?;
                match repo::archive::commit_batch(&client, user, from, to, &records)
                    .await
                    .map_err(BatchError::Db)?
                {
                    Committed::Applied {
                        memory_version,
                        records: written,
                    } => {
                        report.logs += i64::try_from(logs.len()).unwrap_or(i64::MAX);
                        report.records += written;
                        report.memory_version = Some(memory_version);
                        if written > 0 {
                            report.outcome = UserOutcome::Archived;
                        }
                        from = to;
                    }
                    Committed::Fenced => {
                        tracing::warn!(user = %user, from, "another runner archived these logs first; dropped");
                        report.outcome = UserOutcome::Raced;
                        return Ok(());
                    }
                }
            }
            Ok(())
        }
        .await;
        let Ok(client) = self.pool.get().await else {
            // The lease runs out by itself.
            return report;
        };
        match result {
            Ok(()) => {
                logged(
                    repo::archive::release_user(&client, user, &self.worker).await,
                    user,
                    "release the lease",
                );
            }
            Err(BatchError::Cancelled) => {
                logged(
                    repo::archive::release_user(&client, user, &self.worker).await,
                    user,
                    "release the lease",
                );
                report.outcome = UserOutcome::Cancelled;
            }
            Err(BatchError::LeaseLost) => {
                tracing::warn!(user = %user, "archive lease lost; stopping this user");
                report.outcome = UserOutcome::Raced;
            }
            Err(BatchError::Db(e)) => {
                logged(
                    repo::archive::release_user(&client, user, &self.worker).await,
                    user,
                    "release the lease",
                );
                tracing::warn!(user = %user, error = %e, "archiving a user failed");
                report.outcome = UserOutcome::Failed;
                report.error_class = Some("database".into());
                report.error = Some(e.to_string());
            }
            Err(BatchError::Model(e)) => {
                let attempt = u32::try_from(claim.failures).unwrap_or(0).saturating_add(1);
                let (delay, counts) = match e.disposition {
                    Disposition::Retry { after, .. } => (after.unwrap_or_else(|| self.cfg.retry_delay(attempt)), true),
                    Disposition::Defer { after } => (after, false),
                    Disposition::Fail => (Duration::from_secs(self.cfg.retry_max_secs), true),
                };
                tracing::warn!(user = %user, error.class = %e.class, error = %e.message,
                    retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "archiving a user failed");
                logged(
                    repo::archive::fail_user(&client, user, &self.worker, &e.to_string(), delay, counts).await,
                    user,
                    "record the failure",
                );
                report.outcome = UserOutcome::Failed;
                report.error_class = Some(e.class.to_string());
                report.error = Some(e.message);
            }
        }
        report
    }

    /// Runs `work` while renewing the user's lease every third of it.
    async fn with_lease<T>(
        &self,
        user: Uuid,
        cancel: &CancellationToken,
        work: impl std::future::Future<Output = Result<T, StageError>>,
    ) -> Result<Result<T, BatchError>, BatchError> {
        let lease = self.acfg().lease();
        let mut tick = tokio::time::interval(lease / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                r = &mut work => return Ok(r.map_err(BatchError::Model)),
                () = cancel.cancelled() => return Err(BatchError::Cancelled),
                _ = tick.tick() => {
                    let client = self.pool.get().await.map_err(|e| BatchError::Db(e.into()))?;
                    if !repo::archive::extend_user_lease(&client, user, &self.worker, lease)
                        .await
                        .map_err(BatchError::Db)?
                    {
                        return Err(BatchError::LeaseLost);
                    }
                }
            }
        }
    }

    /// The records of one batch: one per chunk, in order.
    async fn summarise(&self, prompt: &str, logs: &[PendingLog]) -> Result<Vec<NewRecord>, StageError> {
        let mut queue: VecDeque<Vec<ChunkMessage<'_>>> =
            plan_chunks(logs, &self.counter, self.acfg().chunk_tokens).into();
        let mut records = Vec::new();
        let mut invalid = 0u32;
        while let Some(chunk) = queue.pop_front() {
            let req = ChatRequest::new(Some(prompt.to_owned()), render_chunk(&chunk)).json();
            match self.llm.chat(Role::Archivist, req).await {
                Ok(resp) => match parse_summary(&resp.text) {
                    Ok(s) => {
                        invalid = 0;
                        records.push(NewRecord {
                            time_bucket_start: s.time_bucket_start,
                            time_bucket_end: s.time_bucket_end,
                            tags: s.tags,
                            summary: s.summary,
                            raw_log_ids: chunk.iter().map(|m| m.log.id).collect(),
                        });
                    }
                    Err(problem) => {
                        invalid += 1;
                        if invalid >= INVALID_JSON_ATTEMPTS {
                            return Err(StageError::retry(
                                "invalid_json",
                                format!("the archivist's output was not valid: {problem}"),
                            ));
                        }
                        queue.push_front(chunk);
                    }
                },
                // Too long for the model after all: halve the chunk.
                Err(e) if e.disposition() == LlmDisposition::TokenLimit && chunk.len() > 1 => {
                    let mut first = chunk;
                    let second = first.split_off(first.len() / 2);
                    queue.push_front(second);
                    queue.push_front(first);
                }
                Err(e) => return Err(from_llm(e, &self.llm, Role::Archivist)),
            }
        }
        Ok(records)
    }
}

/// Logs a failed bookkeeping write; the lease runs out by itself.
fn logged<T>(r: Result<T, db::Error>, user: Uuid, what: &str) {
    if let Err(e) = r {
        tracing::warn!(user = %user, error = %e, "archivist could not {what}");
    }
}

/// The row of `archive_schedule` the daemons share.
pub const SCHEDULE_NAME: &str = "archivist";

/// Runs the archivist on `cfg.archivist.schedule` (UTC) until `shutdown`,
/// then waits for a run in progress to stop (it stops between batches and
/// abandons an open batch, whose lease runs out).
///
/// - Overlap: a tick that fires while this process's previous run is still
///   going is skipped; across daemons, a run holds a session-level advisory
///   lock, so a tick that finds another daemon's run going is skipped too.
/// - Once per tick cluster-wide: the tick is claimed by moving
///   `archive_schedule.last_tick` forward, which succeeds for one daemon.
/// - Catch-up: at start, a tick that every daemon missed (all were down) is
///   run once; a fresh install has missed none.
pub async fn run_scheduled(archivist: Arc<Archivist>, shutdown: CancellationToken) -> Result<(), ArchivistError> {
    use tokio_cron_scheduler::{Job, JobScheduler};
    let expr = archivist.acfg().schedule.clone();
    let cron = Arc::new(cron_schedule(&expr).map_err(ArchivistError::Schedule)?);
    let busy = Arc::new(tokio::sync::Mutex::new(()));
    let sched_err = |e: tokio_cron_scheduler::JobSchedulerError| ArchivistError::Schedule(e.to_string());

    // Catch up on a tick missed while every daemon was down.
    if let Ok(prev) = cron.find_previous_occurrence(&Utc::now(), true) {
        let fresh = match archivist.pool.get().await {
            Ok(client) => repo::archive::init_schedule(&client, SCHEDULE_NAME, prev).await,
            Err(e) => Err(e.into()),
        };
        match fresh {
            Ok(true) => {}
            Ok(false) => {
                let _guard = busy.lock().await;
                archivist.tick(prev, &shutdown).await;
            }
            Err(e) => tracing::warn!(error = %e, "archivist catch-up skipped"),
        }
    }

    let mut scheduler = JobScheduler::new().await.map_err(sched_err)?;
    let job = {
        let (archivist, busy, cron, shutdown) = (archivist.clone(), busy.clone(), cron.clone(), shutdown.clone());
        Job::new_async(expr.as_str(), move |_id, _lock| {
            let (archivist, busy, cron, shutdown) = (archivist.clone(), busy.clone(), cron.clone(), shutdown.clone());
            Box::pin(async move {
                let Ok(_guard) = busy.try_lock() else {
                    tracing::info!("archivist tick skipped: the previous run is still going");
                    return;
                };
                // The tick this firing belongs to (it may fire a little late).
                let Ok(tick) = cron.find_previous_occurrence(&Utc::now(), true) else {
                    return;
                };
                archivist.tick(tick, &shutdown).await;
            })
        })
        .map_err(sched_err)?
    };
    scheduler.add(job).await.map_err(sched_err)?;
    scheduler.start().await.map_err(sched_err)?;
    tracing::info!(schedule = %expr, "archivist scheduled (UTC)");
    shutdown.cancelled().await;
    if let Err(e) = scheduler.shutdown().await {
        tracing::warn!(error = %e, "archivist scheduler did not stop cleanly");
    }
    // A run in progress sees the cancellation; wait for it.
    let _guard = busy.lock().await;
    Ok(())
}

impl Archivist {
    /// One scheduled tick: the cluster-wide run lock, the tick claim, the run.
    async fn tick(&self, tick: DateTime<Utc>, shutdown: &CancellationToken) {
        let result = async {
            let lock = self.pool.get().await?;
            if !repo::archive::try_lock_runs(&lock).await? {
                tracing::info!(%tick, "archivist tick skipped: another daemon's run is still going");
                return Ok(());
            }
            let claimed = repo::archive::claim_tick(&lock, SCHEDULE_NAME, tick).await;
            let run = match claimed {
                Ok(true) => {
                    let opts = RunOptions {
                        trigger: Trigger::Cron,
                        user: None,
                        dry_run: false,
                        tick: Some(tick),
                    };
                    self.run(opts, &Quiet, shutdown).await.map(drop)
                }
                Ok(false) => {
                    tracing::debug!(%tick, "archivist tick already run by another daemon");
                    Ok(())
                }
                Err(e) => Err(e.into()),
            };
            repo::archive::unlock_runs(&lock).await?;
            run
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(%tick, error = %e, "scheduled archive run failed");
        }
    }
}

fn count(users: &[UserReport], outcome: UserOutcome) -> i64 {
    i64::try_from(users.iter().filter(|u| u.outcome == outcome).count()).unwrap_or(i64::MAX)
}

fn failed(user: Uuid, class: &str, message: &str) -> UserReport {
    let mut r = UserReport::new(user, UserOutcome::Failed);
    r.error_class = Some(class.to_owned());
    r.error = Some(message.to_owned());
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(id: i64, thread: Option<u128>, content: &str) -> PendingLog {
        PendingLog {
            id,
            user_seq: id,
            thread_id: thread.map(Uuid::from_u128),
            request_id: None,
            message_type: "user_query".into(),
            content: content.into(),
            created_at: DateTime::from_timestamp(1_700_000_000 + id, 0).unwrap_or_default(),
        }
    }

    fn ids(chunks: &[Vec<ChunkMessage<'_>>]) -> Vec<Vec<i64>> {
        chunks.iter().map(|c| c.iter().map(|m| m.log.id).collect()).collect()
    }

    #[test]
    fn groups_by_thread_in_order_of_first_appearance() {
        let logs = vec![
            log(1, Some(1), "a"),
            log(2, Some(2), "b"),
            log(3, Some(1), "c"),
            log(4, None, "d"),
            log(5, Some(2), "e"),
            log(6, None, "f"),
        ];
        let chunks = plan_chunks(&logs, &TokenCounter::estimate(), 1000);
        assert_eq!(ids(&chunks), vec![vec![1, 3], vec![2, 5], vec![4, 6]]);
    }

    #[test]
    fn splits_a_long_thread_by_the_budget_and_cuts_a_huge_message() {
        let long = "x".repeat(300); // 100 estimated tokens
        let logs: Vec<PendingLog> = (1..=5).map(|i| log(i, Some(1), &long)).collect();
        let chunks = plan_chunks(&logs, &TokenCounter::estimate(), 300);
        assert_eq!(ids(&chunks), vec![vec![1, 2], vec![3, 4], vec![5]]);
        let huge = vec![log(1, None, &"y".repeat(3000))];
        let chunks = plan_chunks(&huge, &TokenCounter::estimate(), 100);
        assert_eq!(chunks.len(), 1);
        assert!(chunks[0][0].content.len() < 300);
    }

    #[test]
    fn accepts_plain_and_fenced_summaries() {
        let good = r#"{"time_bucket_start": "2024-05-01T10:00:00Z", "time_bucket_end": "2024-05-01T13:00:00+02:00",
            "tags": ["trip", " Lisbon "], "summary": "Planned a trip."}"#;
        let s = parse_summary(good).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.tags, vec!["trip", "Lisbon"]);
        assert_eq!(s.time_bucket_end.to_rfc3339(), "2024-05-01T11:00:00+00:00");
        assert_eq!(parse_summary(&format!("```json\n{good}\n```")).ok(), Some(s));
        let no_tags = r#"{"time_bucket_start": "2024-05-01 10:00:00+00", "time_bucket_end": "2024-05-01T10:00:00Z", "summary": "x"}"#;
        assert_eq!(parse_summary(no_tags).map(|s| s.tags.len()), Ok(0));
    }

    #[test]
    fn refuses_what_is_not_a_summary() {
        for bad in [
            "",
            "Here is the summary",
            "[]",
            r#"{"time_bucket_start": "yesterday", "time_bucket_end": "2024-05-01T10:00:00Z", "summary": "x"}"#,
            r#"{"time_bucket_start": "2024-05-02T10:00:00Z", "time_bucket_end": "2024-05-01T10:00:00Z", "summary": "x"}"#,
            r#"{"time_bucket_start": "2024-05-01T10:00:00Z", "time_bucket_end": "2024-05-01T10:00:00Z", "summary": ""}"#,
            r#"{"time_bucket_start": "2024-05-01T10:00:00Z", "time_bucket_end": "2024-05-01T10:00:00Z", "summary": "x", "tags": "a"}"#,
            r#"{"time_bucket_start": "2024-05-01T10:00:00Z", "time_bucket_end": "2024-05-01T10:00:00Z", "summary": "x", "tags": [1]}"#,
        ] {
            assert!(parse_summary(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_offline_archivist_answer_validates() {
        let logs = vec![log(1, None, "How do I prune tomato plants?"), log(2, None, "Weekly.")];
        let chunks = plan_chunks(&logs, &TokenCounter::estimate(), 1000);
        let req = ChatRequest::new(Some("Archivist".into()), render_chunk(&chunks[0]));
        let answer = crate::llm::offline::archive(&req, Utc::now()).to_string();
        let s = parse_summary(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
        assert_eq!(s.time_bucket_start, logs[0].created_at);
        assert_eq!(s.time_bucket_end, logs[1].created_at);
    }

    #[test]
    fn the_default_config_is_valid() {
        assert_eq!(ArchivistConfig::default().problem(), None);
        let bad = ArchivistConfig {
            schedule: "0 */6 * * *".into(),
            ..ArchivistConfig::default()
        };
        assert_eq!(bad.problem().map(|p| p.0), Some("archivist.schedule"));
    }
}
