//! Every SQL statement the daemon runs, named after its database effect.
//! The statements live in `sql/queries/` and are embedded at build time;
//! each is prepared once per connection and cached.
//!
//! Functions accept any `GenericClient`, so callers choose between a pooled
//! connection and a transaction.

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde_json::Value;
use uuid::Uuid;

use crate::db::Error;
use crate::model::{MemoryRecord, Outcome, PromptRole, Prompts, StageKind, Status};

pub mod archive;

/// The claim template; see [`claim_sql`].
pub mod http;

pub mod ops;

pub const CLAIM: &str = include_str!("../../sql/queries/claim.sql");
pub const FINISH: &str = include_str!("../../sql/queries/finish.sql");
pub const HEARTBEAT: &str = include_str!("../../sql/queries/heartbeat.sql");
pub const RECLAIM_EXPIRED: &str = include_str!("../../sql/queries/reclaim_expired.sql");
pub const DUE_COUNTS: &str = include_str!("../../sql/queries/due_counts.sql");
pub const RING_DUE: &str = include_str!("../../sql/queries/ring_due.sql");
pub const SHOW_RUN: &str = include_str!("../../sql/queries/show_run.sql");
pub const SHOW_STEPS: &str = include_str!("../../sql/queries/show_steps.sql");
pub const ACTIVE_PROMPTS: &str = include_str!("../../sql/queries/active_prompts.sql");

fn render_claim(stage: StageKind) -> String {
    CLAIM
        .replace("{ready}", &format!("'{}'", stage.ready_status().as_str()))
        .replace("{in_flight}", &format!("'{}'", stage.in_flight_status().as_str()))
}

/// The claim statement of one stage: the template with its statuses as
/// literals (see `claim.sql`).
pub fn claim_sql(stage: StageKind) -> &'static str {
    static SQL: std::sync::LazyLock<[String; 3]> = std::sync::LazyLock::new(|| StageKind::ALL.map(render_claim));
    &SQL[stage.index()]
}

pub use ops::{
    CALLBACKS_CLAIM, CALLBACKS_DELIVERED, CALLBACKS_FAILED, CANCEL_RUN, CONTINUE_RUN, CONTROL_GET, CONTROL_SET,
    FAILED_IDS, LIST_RUNS, PROMPTS_ACTIVATE, PROMPTS_DEACTIVATE, PROMPTS_INSERT, PROMPTS_LIST, PROMPTS_LOCK,
    PROMPTS_SHOW, RECORD_ACTION, RETENTION_ACTIONS, RETENTION_RUNS, RETRY_FAILED, RUN_STATUS, SHOW_ACTIONS,
    SHOW_CALLBACKS, STATS_BACKLOG, STATS_CALLBACKS, STATS_DAEMONS, STATS_FINISHED, STATS_LEASES,
};

/// Every named query, for the test that prepares them all.
pub fn all() -> Vec<(&'static str, &'static str)> {
    let mut all = vec![
        ("claim_analyze", claim_sql(StageKind::Analyze)),
        ("claim_assemble", claim_sql(StageKind::Assemble)),
        ("claim_respond", claim_sql(StageKind::Respond)),
    ];
    all.extend_from_slice(NAMED);
    all
}

const NAMED: &[(&str, &str)] = &[
    ("finish", FINISH),
    ("heartbeat", HEARTBEAT),
    ("reclaim_expired", RECLAIM_EXPIRED),
    ("due_counts", DUE_COUNTS),
    ("ring_due", RING_DUE),
    ("show_run", SHOW_RUN),
    ("show_steps", SHOW_STEPS),
    ("active_prompts", ACTIVE_PROMPTS),
    ("submit_request", http::SUBMIT_REQUEST),
    ("submit_idempotent", http::SUBMIT_IDEMPOTENT),
    ("find_idempotent", http::FIND_IDEMPOTENT),
    ("expire_idempotency_keys", http::EXPIRE_IDEMPOTENCY_KEYS),
    ("request_states", http::REQUEST_STATES),
    ("user_states", http::USER_STATES),
    ("count_backlog", http::COUNT_BACKLOG),
    ("cancel_run", CANCEL_RUN),
    ("continue_run", CONTINUE_RUN),
    ("retry_failed", RETRY_FAILED),
    ("failed_ids", FAILED_IDS),
    ("run_status", RUN_STATUS),
    ("control_get", CONTROL_GET),
    ("control_set", CONTROL_SET),
    ("list_runs", LIST_RUNS),
    ("show_actions", SHOW_ACTIONS),
    ("show_callbacks", SHOW_CALLBACKS),
    ("stats_backlog", STATS_BACKLOG),
    ("stats_finished", STATS_FINISHED),
    ("stats_leases", STATS_LEASES),
    ("stats_callbacks", STATS_CALLBACKS),
    ("stats_daemons", STATS_DAEMONS),
    ("prompts_list", PROMPTS_LIST),
    ("prompts_show", PROMPTS_SHOW),
    ("prompts_lock", PROMPTS_LOCK),
    ("prompts_deactivate", PROMPTS_DEACTIVATE),
    ("prompts_insert", PROMPTS_INSERT),
    ("prompts_activate", PROMPTS_ACTIVATE),
    ("record_action", RECORD_ACTION),
    ("retention_runs", RETENTION_RUNS),
    ("retention_actions", RETENTION_ACTIONS),
    ("callbacks_claim", CALLBACKS_CLAIM),
    ("callbacks_delivered", CALLBACKS_DELIVERED),
    ("callbacks_failed", CALLBACKS_FAILED),
    ("archive_candidates", archive::CANDIDATES),
    ("archive_claim", archive::CLAIM),
    ("archive_extend", archive::EXTEND),
    ("archive_release", archive::RELEASE),
    ("archive_pending", archive::PENDING),
    ("archive_commit", archive::COMMIT),
    ("archive_fail", archive::FAIL),
    ("archive_mark", archive::MARK),
    ("archive_run_start", archive::RUN_START),
    ("archive_run_finish", archive::RUN_FINISH),
    ("archive_tick", archive::TICK),
    ("archive_schedule_init", archive::SCHEDULE_INIT),
];

/// A row claimed for one stage attempt.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: Uuid,
    pub user_id: Uuid,
    pub thread_id: Option<Uuid>,
    pub user_query: String,
    /// Attempt number of this stage, 1-based.
    pub attempt: i32,
    /// Fencing token of this lease.
    pub lease_token: i64,
    pub analysis: Option<Value>,
    pub context: Option<String>,
    pub debug: bool,
    pub claimed_at: DateTime<Utc>,
    /// How long the row had been due before this claim.
    pub due_for: Duration,
    /// The user's memory this stage reads (see `claim.sql`).
    pub memory: Vec<MemoryRecord>,
}

/// Claims up to `limit` due rows for `stage`, leased to `owner`, with up to
/// `memory_records` of each user's recent memory for the analyzer.
///
/// The claiming transaction commits without waiting for its WAL flush
/// (`claim.sql` says why that is safe for a lease): call it on its own, not
/// inside a transaction that also writes something that must be durable.
pub async fn claim_next(
    client: &impl GenericClient,
    stage: StageKind,
    limit: usize,
    owner: &str,
    lease: Duration,
    memory_records: usize,
) -> Result<Vec<Claimed>, Error> {
    let stmt = client.prepare_cached(claim_sql(stage)).await?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client
        .query(
            &stmt,
            &[
                &limit,
                &owner,
                &lease.as_secs_f64(),
                &i64::try_from(memory_records).unwrap_or(i64::MAX),
            ],
        )
        .await?;
    rows.iter().map(claimed_from_row).collect()
}

fn claimed_from_row(r: &tokio_postgres::Row) -> Result<Claimed, Error> {
    let due_ms: f64 = r.try_get(10)?;
    let memory: Option<Value> = r.try_get(11)?;
    Ok(Claimed {
        id: r.try_get(0)?,
        user_id: r.try_get(1)?,
        thread_id: r.try_get(2)?,
        user_query: r.try_get(3)?,
        attempt: r.try_get(4)?,
        lease_token: r.try_get(5)?,
        analysis: r.try_get(6)?,
        context: r.try_get(7)?,
        debug: r.try_get(8)?,
        claimed_at: r.try_get(9)?,
        due_for: Duration::try_from_secs_f64(due_ms.max(0.0) / 1000.0).unwrap_or_default(),
        memory: memory.and_then(|m| serde_json::from_value(m).ok()).unwrap_or_default(),
    })
}

/// The result of one stage attempt, to be written by [`finish_batch`].
#[derive(Debug, Clone)]
pub struct Finished {
    pub id: Uuid,
    pub lease_token: i64,
    pub stage: StageKind,
    pub outcome: Outcome,
    /// Status the row moves to.
    pub new_status: Status,
    pub attempt: i32,
    pub started_at: DateTime<Utc>,
    pub analysis: Option<Value>,
    pub context: Option<String>,
    pub answer: Option<String>,
    pub error_class: Option<String>,
    pub error_message: Option<String>,
    /// For `Retrying`: how long the row waits before it is due again.
    pub delay: Duration,
    pub model: Option<String>,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
    pub latency_ms: Option<i32>,
    /// A successful analyze result whose assemble stage already ran, in the
    /// same task (see `finish.sql`).
    pub fused: Option<FusedAssemble>,
}

/// The assemble stage, run right after a successful analyze on the memory
/// the analyzer was given, and written with it in one statement.
#[derive(Debug, Clone)]
pub struct FusedAssemble {
    pub context: String,
    pub tokens: Option<i32>,
    pub latency_ms: i32,
}

impl Finished {
    /// The stage this result leads to when it succeeds.
    pub fn next_stage(&self) -> Option<StageKind> {
        if self.fused.is_some() {
            StageKind::Assemble.next()
        } else {
            self.stage.next()
        }
    }
}

/// The columns of a batch of results, as the arrays `finish.sql` unnests.
struct FinishArgs<'a> {
    ids: Vec<Uuid>,
    tokens: Vec<i64>,
    stages: Vec<&'static str>,
    in_flight: Vec<&'static str>,
    new_status: Vec<&'static str>,
    outcomes: Vec<&'static str>,
    attempts: Vec<i32>,
    started: Vec<DateTime<Utc>>,
    analysis: Vec<Option<&'a Value>>,
    context: Vec<Option<&'a str>>,
    answer: Vec<Option<&'a str>>,
    err_class: Vec<Option<&'a str>>,
    err_msg: Vec<Option<&'a str>>,
    delay: Vec<i64>,
    model: Vec<Option<&'a str>>,
    p_tok: Vec<Option<i32>>,
    c_tok: Vec<Option<i32>>,
    latency: Vec<Option<i32>>,
    worker: &'a str,
}

impl<'a> FinishArgs<'a> {
    fn new(worker: &'a str, batch: &'a [Finished]) -> Self {
        FinishArgs {
            ids: batch.iter().map(|f| f.id).collect(),
            tokens: batch.iter().map(|f| f.lease_token).collect(),
            stages: batch.iter().map(|f| f.stage.as_str()).collect(),
            in_flight: batch.iter().map(|f| f.stage.in_flight_status().as_str()).collect(),
            new_status: batch.iter().map(|f| f.new_status.as_str()).collect(),
            outcomes: batch.iter().map(|f| f.outcome.as_str()).collect(),
            attempts: batch.iter().map(|f| f.attempt).collect(),
            started: batch.iter().map(|f| f.started_at).collect(),
            analysis: batch.iter().map(|f| f.analysis.as_ref()).collect(),
            context: batch
                .iter()
                .map(|f| f.context.as_deref().or(f.fused.as_ref().map(|a| a.context.as_str())))
                .collect(),
            answer: batch.iter().map(|f| f.answer.as_deref()).collect(),
            err_class: batch.iter().map(|f| f.error_class.as_deref()).collect(),
            err_msg: batch.iter().map(|f| f.error_message.as_deref()).collect(),
            delay: batch
                .iter()
                .map(|f| i64::try_from(f.delay.as_millis()).unwrap_or(i64::MAX))
                .collect(),
            model: batch.iter().map(|f| f.model.as_deref()).collect(),
            p_tok: batch.iter().map(|f| f.prompt_tokens).collect(),
            c_tok: batch.iter().map(|f| f.completion_tokens).collect(),
            latency: batch.iter().map(|f| f.latency_ms).collect(),
            worker,
        }
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 19] {
        [
            &self.ids,
            &self.tokens,
            &self.stages,
            &self.in_flight,
            &self.new_status,
            &self.outcomes,
            &self.attempts,
            &self.started,
            &self.analysis,
            &self.context,
            &self.answer,
            &self.err_class,
            &self.err_msg,
            &self.delay,
            &self.model,
            &self.p_tok,
            &self.c_tok,
            &self.latency,
            &self.worker,
        ]
    }
}

/// A result that was applied: the row's creation time (for the request
/// duration histogram) and, when it was chained, its claim for the next
/// stage.
#[derive(Debug, Clone)]
pub struct Applied {
    pub id: Uuid,
    pub created_at: DateTime<Utc>,
    /// Its fused assemble result was written too (not for a debug run, nor
    /// while paused: the row then rests in `ANALYZED`).
    pub fused: bool,
    pub chained: Option<(StageKind, Claimed)>,
}

/// Writes a batch of results, fenced, in one statement; results that
/// `chain` maps to a stage are claimed for that stage by the same statement
/// (see `finish.sql`: one row version and one commit per transition, and no
/// wait for a doorbell between stages). Returns the applied results; the
/// others had lost their lease.
pub async fn finish_batch(
    client: &impl GenericClient,
    worker: &str,
    batch: &[Finished],
    chain: impl Fn(&Finished) -> Option<StageKind>,
    lease: Duration,
) -> Result<Vec<Applied>, Error> {
    let stmt = client.prepare_cached(FINISH).await?;
    let args = FinishArgs::new(worker, batch);
    let chain_to: Vec<Option<&str>> = batch
        .iter()
        .map(|f| chain(f).map(|s| s.in_flight_status().as_str()))
        .collect();
    let lease_secs = lease.as_secs_f64();
    let fused: Vec<bool> = batch.iter().map(|f| f.fused.is_some()).collect();
    let fused_tokens: Vec<Option<i32>> = batch.iter().map(|f| f.fused.as_ref().and_then(|a| a.tokens)).collect();
    let fused_latency: Vec<Option<i32>> = batch.iter().map(|f| f.fused.as_ref().map(|a| a.latency_ms)).collect();
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = args.params().to_vec();
    params.push(&chain_to);
    params.push(&lease_secs);
    params.push(&fused);
    params.push(&fused_tokens);
    params.push(&fused_latency);
    let rows = client.query(&stmt, &params).await?;
    rows.iter().map(applied_from_row).collect()
}

fn applied_from_row(r: &tokio_postgres::Row) -> Result<Applied, Error> {
    let id: Uuid = r.try_get(0)?;
    let chained = if r.try_get::<_, bool>(2)? {
        let status: &str = r.try_get(13)?;
        let stage = status
            .parse::<Status>()
            .ok()
            .and_then(Status::in_flight_stage)
            .ok_or_else(|| Error::Unexpected(format!("finish: chained row {id} has status {status}")))?;
        let memory: Option<Value> = r.try_get(12)?;
        Some((
            stage,
            Claimed {
                id,
                user_id: r.try_get(3)?,
                thread_id: r.try_get(4)?,
                user_query: r.try_get(5)?,
                attempt: r.try_get(6)?,
                lease_token: r.try_get(7)?,
                analysis: r.try_get(8)?,
                context: r.try_get(9)?,
                debug: r.try_get(10)?,
                claimed_at: r.try_get(11)?,
                due_for: Duration::ZERO,
                memory: memory.and_then(|m| serde_json::from_value(m).ok()).unwrap_or_default(),
            },
        ))
    } else {
        None
    };
    Ok(Applied {
        id,
        created_at: r.try_get(1)?,
        fused: r.try_get(14)?,
        chained,
    })
}

/// Renews the given leases; returns the ids still held.
pub async fn extend_leases(
    client: &impl GenericClient,
    held: &[(Uuid, i64)],
    lease: Duration,
) -> Result<Vec<Uuid>, Error> {
    let stmt = client.prepare_cached(HEARTBEAT).await?;
    let ids: Vec<Uuid> = held.iter().map(|h| h.0).collect();
    let tokens: Vec<i64> = held.iter().map(|h| h.1).collect();
    let rows = client.query(&stmt, &[&ids, &tokens, &lease.as_secs_f64()]).await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

/// A row the sweep took back from an expired lease.
#[derive(Debug, Clone)]
pub struct Reclaimed {
    pub id: Uuid,
    pub new_status: String,
    pub was: String,
}

/// Takes back up to `limit` rows whose lease expired.
pub async fn reclaim_expired(
    client: &impl GenericClient,
    max_attempts: u32,
    limit: usize,
) -> Result<Vec<Reclaimed>, Error> {
    let stmt = client.prepare_cached(RECLAIM_EXPIRED).await?;
    let max = i32::try_from(max_attempts).unwrap_or(i32::MAX);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client.query(&stmt, &[&max, &limit]).await?;
    rows.iter()
        .map(|r| {
            Ok(Reclaimed {
                id: r.try_get(0)?,
                new_status: r.try_get(1)?,
                was: r.try_get(2)?,
            })
        })
        .collect()
}

/// Due dispatchable rows by status: (status, count, seconds the oldest waited).
pub async fn due_counts(client: &impl GenericClient) -> Result<Vec<(String, i64, f64)>, Error> {
    let stmt = client.prepare_cached(DUE_COUNTS).await?;
    let rows = client.query(&stmt, &[]).await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect()
}

/// Rings the doorbell for every status that has due rows; returns how many
/// notifications were sent.
pub async fn ring_due(client: &impl GenericClient) -> Result<usize, Error> {
    let stmt = client.prepare_cached(RING_DUE).await?;
    Ok(client.query(&stmt, &[]).await?.len())
}

/// A request as `maasctl requests show` prints it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunView {
    pub id: Uuid,
    pub user_id: Uuid,
    pub thread_id: Option<Uuid>,
    pub user_query: String,
    pub status: String,
    pub analysis_result: Option<Value>,
    pub final_context_payload: Option<String>,
    pub final_answer: Option<String>,
    pub error: Option<String>,
    pub debug: bool,
    pub attempt: i32,
    pub run_after: DateTime<Utc>,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub lease_token: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Debug mode: resting until an operator continues it.
    pub held: bool,
    pub callback_url: Option<String>,
}

/// One row of the step history.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StepView {
    pub stage: String,
    pub attempt: i32,
    pub worker: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub outcome: String,
    pub error_class: Option<String>,
    pub error_message: Option<String>,
    pub model: Option<String>,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
    pub latency_ms: Option<i32>,
}

pub async fn show_run(client: &impl GenericClient, id: Uuid) -> Result<Option<RunView>, Error> {
    let stmt = client.prepare_cached(SHOW_RUN).await?;
    let Some(r) = client.query_opt(&stmt, &[&id]).await? else {
        return Ok(None);
    };
    Ok(Some(RunView {
        id: r.try_get(0)?,
        user_id: r.try_get(1)?,
        thread_id: r.try_get(2)?,
        user_query: r.try_get(3)?,
        status: r.try_get(4)?,
        analysis_result: r.try_get(5)?,
        final_context_payload: r.try_get(6)?,
        final_answer: r.try_get(7)?,
        error: r.try_get(8)?,
        debug: r.try_get(9)?,
        attempt: r.try_get(10)?,
        run_after: r.try_get(11)?,
        lease_owner: r.try_get(12)?,
        lease_expires_at: r.try_get(13)?,
        lease_token: r.try_get(14)?,
        created_at: r.try_get(15)?,
        updated_at: r.try_get(16)?,
        held: r.try_get(17)?,
        callback_url: r.try_get(18)?,
    }))
}

pub async fn show_steps(client: &impl GenericClient, id: Uuid) -> Result<Vec<StepView>, Error> {
    let stmt = client.prepare_cached(SHOW_STEPS).await?;
    let rows = client.query(&stmt, &[&id]).await?;
    rows.iter()
        .map(|r| {
            Ok(StepView {
                stage: r.try_get(0)?,
                attempt: r.try_get(1)?,
                worker: r.try_get(2)?,
                started_at: r.try_get(3)?,
                finished_at: r.try_get(4)?,
                outcome: r.try_get(5)?,
                error_class: r.try_get(6)?,
                error_message: r.try_get(7)?,
                model: r.try_get(8)?,
                prompt_tokens: r.try_get(9)?,
                completion_tokens: r.try_get(10)?,
                latency_ms: r.try_get(11)?,
            })
        })
        .collect()
}

/// The active prompt of every role.
pub async fn active_prompts(client: &impl GenericClient) -> Result<Prompts, Error> {
    let stmt = client.prepare_cached(ACTIVE_PROMPTS).await?;
    let mut prompts = Prompts::default();
    for r in client.query(&stmt, &[]).await? {
        let role: String = r.try_get(0)?;
        let text: String = r.try_get(1)?;
        if let Ok(role) = role.parse::<PromptRole>() {
            prompts.set(role, text);
        }
    }
    Ok(prompts)
}
