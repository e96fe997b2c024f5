//! The runner: one archive run over the given user or every candidate.
//!
//! Guarantees:
//! - Exactly once: the model is called with no transaction open; a batch's
//!   records and the mark's advance are written by one statement fenced on
//!   the mark the batch started from ([`repo::archive::commit_batch`]), so of
//!   two runners that summarised the same logs (one's lease ran out) only
//!   one commit applies, and a crash loses at most the uncommitted batch.
//! - A user is worked on only under its lease, renewed every third of it;
//!   a lost lease stops the user without writing.
//! - Failures follow the LLM layer's retry policy ([`Failure`]): the user
//!   gets a durable `retry_after` (exponential backoff, or the provider's
//!   `Retry-After`); one user's failure never stops the others; every run
//!   that is not a dry run leaves a row in `archive_runs`.
//! - Cancellation stops between batches and writes nothing of an open one.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::chunking::{ChunkMessage, plan_chunks, render_chunk};
use super::summary::{INVALID_JSON_ATTEMPTS, parse_summary};
use super::{ArchivistError, Progress, RunOptions, RunReport, UserOutcome, UserReport, count_run};
use crate::config::{ArchivistConfig, Config};
use crate::db::{self, Pool};
use crate::error::Disposition;
use crate::llm::{ChatRequest, Failure, Llm, LlmDisposition, Role, TokenCounter};
use crate::model::PromptRole;
use crate::repo;
use crate::repo::archive::{Candidate, Claim, Committed, NewRecord, PendingLog};

/// Why a user's batch stopped.
enum BatchError {
    Model(Failure),
    LeaseLost,
    Cancelled,
    Db(db::Error),
}

/// The archivist of one process.
pub struct Archivist {
    pub(super) pool: Pool,
    llm: Arc<Llm>,
    cfg: Arc<Config>,
    counter: TokenCounter,
    worker: String,
}

impl Archivist {
    /// The name this daemon's runs are recorded under (`archive_runs.worker`).
    pub(super) fn worker(&self) -> &str {
        &self.worker
    }

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

    pub(super) fn acfg(&self) -> &ArchivistConfig {
        &self.cfg.archivist
    }

    /// The pool this archivist's runs take their connections from.
    pub fn pool(&self) -> &Pool {
        &self.pool
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
        let result = self.run_counted(opts, progress, cancel, started).await;
        if !opts.dry_run {
            count_run(opts, result.as_ref().ok(), started.elapsed());
        }
        result
    }

    /// [`Archivist::run`] before its metrics: start (the `archive_runs`
    /// row), work on the users, finish (the row's totals).
    async fn run_counted(
        &self,
        opts: RunOptions,
        progress: &dyn Progress,
        cancel: &CancellationToken,
        started: Instant,
    ) -> Result<RunReport, ArchivistError> {
        let (prompt, run_id) = self.start_run(opts).await?;
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
        let users = match opts.user {
            Some(user) => {
                progress.add_users(1);
                vec![work(user).await]
            }
            None => self.work_candidates(opts.dry_run, progress, cancel, work).await?,
        };
        let mut report = RunReport::of(run_id, opts.dry_run, users);
        report.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if let Some(id) = run_id {
            let client = self.pool.get().await?;
            repo::archive::finish_run(&client, id, &report.totals()).await?;
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

    /// The Archivist prompt, and the run's `archive_runs` row (none for a
    /// dry run).
    async fn start_run(&self, opts: RunOptions) -> Result<(String, Option<i64>), ArchivistError> {
        let client = self.pool.get().await?;
        let prompt = repo::active_prompts(&client)
            .await?
            .get(PromptRole::Archivist)
            .map(str::to_owned)
            .ok_or(ArchivistError::NoPrompt)?;
        let archive_run_id = if opts.dry_run {
            None
        } else {
            Some(repo::archive::start_run(&client, opts.trigger.as_str(), &self.worker, opts.user, opts.tick).await?)
        };
        // Users take connections of their own; hold none across them.
        drop(client);
        tracing::info!(run = archive_run_id, trigger = opts.trigger.as_str(), user = ?opts.user, dry_run = opts.dry_run,
            "archive run starting");
        Ok((prompt, archive_run_id))
    }

    /// `work` on every candidate, a page at a time, `concurrency` at once,
    /// until a page brings no user this run has not seen (a dry run: one page).
    async fn work_candidates<F: std::future::Future<Output = UserReport>>(
        &self,
        dry_run: bool,
        progress: &dyn Progress,
        cancel: &CancellationToken,
        work: impl Fn(Uuid) -> F,
    ) -> Result<Vec<UserReport>, ArchivistError> {
        let mut users: Vec<UserReport> = Vec::new();
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
                .map(&work)
                .buffer_unordered(self.acfg().concurrency)
                .collect()
                .await;
            users.extend(done);
            if dry_run {
                // A dry run changes nothing, so the same page would come back.
                break;
            }
        }
        Ok(users)
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
            let chunks = crate::sys::cpu_bound(|| plan_chunks(&logs, &self.counter, self.acfg().chunk_tokens)).len();
            let mut r = UserReport::new(user, UserOutcome::Planned);
            r.logs = mark.pending;
            r.records = i64::try_from(chunks).unwrap_or(i64::MAX);
            r.memory_version = Some(mark.memory_version);
            Ok(r)
        };
        plan.await.unwrap_or_else(|e| failed(user, "database", &e.to_string()))
    }

    /// Archives everything `user` has pending, batch by batch, under its lease.
    async fn archive_user(&self, user: Uuid, prompt: &str, cancel: &CancellationToken) -> UserReport {
        let claim = match self.claim_user(user).await {
            Ok(claim) => claim,
            Err(report) => return report,
        };
        let mut report = UserReport::new(user, UserOutcome::Nothing);
        report.memory_version = Some(claim.memory_version);
        let result = self.archive_batches(user, &claim, prompt, cancel, &mut report).await;
        let Ok(client) = self.pool.get().await else {
            // The lease runs out by itself.
            return report;
        };
        self.settle(&client, user, &claim, result, &mut report).await;
        report
    }

    /// Takes `user`'s lease; the user's report when it cannot be taken.
    async fn claim_user(&self, user: Uuid) -> Result<Claim, UserReport> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| failed(user, "database", &e.to_string()))?;
        match repo::archive::claim_user(&client, user, &self.worker, self.acfg().lease()).await {
            Ok(Some(c)) => Ok(c),
            Ok(None) => {
                // Unknown user, or another runner holds the lease.
                let known = matches!(repo::archive::show_mark(&client, user).await, Ok(Some(_)));
                Err(UserReport::new(
                    user,
                    if known { UserOutcome::Busy } else { UserOutcome::Nothing },
                ))
            }
            Err(e) => Err(failed(user, "database", &e.to_string())),
        }
    }

    /// The batches from the claimed mark up to the logged one: summarise
    /// (model, no transaction open), then commit fenced on the mark.
    async fn archive_batches(
        &self,
        user: Uuid,
        claim: &Claim,
        prompt: &str,
        cancel: &CancellationToken,
        report: &mut UserReport,
    ) -> Result<(), BatchError> {
        let mut from = claim.archived_seq;
        let through = claim.logged_seq;
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

    /// After the batches: release the lease (unless it was lost), and on a
    /// failure say so in the report (a model's failure backs the user off).
    async fn settle(
        &self,
        client: &deadpool_postgres::Object,
        user: Uuid,
        claim: &Claim,
        result: Result<(), BatchError>,
        report: &mut UserReport,
    ) {
        let release = async || {
            logged(
                repo::archive::release_user(client, user, &self.worker).await,
                user,
                "release the lease",
            );
        };
        match result {
            Ok(()) => release().await,
            Err(BatchError::Cancelled) => {
                release().await;
                report.outcome = UserOutcome::Cancelled;
            }
            Err(BatchError::LeaseLost) => {
                tracing::warn!(user = %user, "archive lease lost; stopping this user");
                report.outcome = UserOutcome::Raced;
            }
            Err(BatchError::Db(e)) => {
                release().await;
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
                    repo::archive::fail_user(client, user, &self.worker, &e.to_string(), delay, counts).await,
                    user,
                    "record the failure",
                );
                report.outcome = UserOutcome::Failed;
                report.error_class = Some(e.class.to_string());
                report.error = Some(e.message);
            }
        }
    }

    /// Runs `work` while renewing the user's lease every third of it.
    async fn with_lease<T>(
        &self,
        user: Uuid,
        cancel: &CancellationToken,
        work: impl std::future::Future<Output = Result<T, Failure>>,
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
    async fn summarise(&self, prompt: &str, logs: &[PendingLog]) -> Result<Vec<NewRecord>, Failure> {
        let mut queue: VecDeque<Vec<ChunkMessage<'_>>> =
            crate::sys::cpu_bound(|| plan_chunks(logs, &self.counter, self.acfg().chunk_tokens)).into();
        let mut records = Vec::new();
        let mut invalid = 0u32;
        while let Some(chunk) = queue.pop_front() {
            let req = ChatRequest::new(Some(prompt.to_owned()), render_chunk(&chunk)).json();
            match self.llm.chat(Role::Archivist, req).await {
                Ok(resp) => match parse_summary(&resp.text) {
                    Ok(s) => {
                        invalid = 0;
                        let (tags, summary) = sanitise_record(s.tags, s.summary);
                        records.push(NewRecord {
                            time_bucket_start: s.time_bucket_start,
                            time_bucket_end: s.time_bucket_end,
                            tags,
                            summary,
                            raw_log_ids: chunk.iter().map(|m| m.log.id).collect(),
                        });
                    }
                    Err(problem) => {
                        invalid += 1;
                        if invalid >= INVALID_JSON_ATTEMPTS {
                            return Err(Failure::retry(
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
                Err(e) => return Err(Failure::from_llm(&e)),
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

fn failed(user: Uuid, class: &str, message: &str) -> UserReport {
    let mut r = UserReport::new(user, UserOutcome::Failed);
    r.error_class = Some(class.to_owned());
    r.error = Some(message.to_owned());
    r
}

/// The most tags a record keeps (`lsm_storage_tags_size` allows 1000).
const MAX_TAGS: usize = 100;
/// The longest tag kept, in characters.
const MAX_TAG_CHARS: usize = 200;

/// A record's texts as the archivist's model gave them, made storable
/// (`crate::sanitize`: NULs removed, sizes capped), each change counted in
/// `maas_poison_total`.
fn sanitise_record(mut tags: Vec<String>, mut summary: String) -> (Vec<String>, String) {
    use crate::sanitize::{self, Sanitised};
    let mut found = Sanitised::default();
    sanitize::text(&mut summary, sanitize::MAX_ANSWER_CHARS, &mut found);
    if tags.len() > MAX_TAGS {
        tags.truncate(MAX_TAGS);
        found.found.push(sanitize::Poison::Oversize);
    }
    for t in &mut tags {
        sanitize::text(t, MAX_TAG_CHARS, &mut found);
    }
    tags.retain(|t| !t.is_empty());
    for p in found.found {
        crate::metrics::poison(p.as_str());
    }
    (tags, summary)
}
