//! Stage attempts on `pipeline_runs` (and their `pipeline_steps` rows): the
//! claim, lease renewal, the fenced batch finish and taking back expired
//! leases. These are the dispatcher's hot path: one statement, one round
//! trip each.

use std::time::Duration;

use super::GenericClient;
use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{FromRow, secs};
use crate::db::Error;
use crate::model::{Clarify, MemoryRecord, Outcome, StageKind, Status};

const CLAIM: &str = include_str!("../../sql/queries/claim.sql");
const FINISH: &str = include_str!("../../sql/queries/finish.sql");
const HEARTBEAT: &str = include_str!("../../sql/queries/heartbeat.sql");
const RECLAIM_EXPIRED: &str = include_str!("../../sql/queries/reclaim_expired.sql");

/// This file's statements, for [`super::all`].
pub(super) fn statements() -> Vec<(&'static str, &'static str)> {
    vec![
        ("claim_analyze", claim_sql(StageKind::Analyze)),
        ("claim_assemble", claim_sql(StageKind::Assemble)),
        ("claim_respond", claim_sql(StageKind::Respond)),
        ("finish", FINISH),
        ("heartbeat", HEARTBEAT),
        ("reclaim_expired", RECLAIM_EXPIRED),
    ]
}

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
    /// Whose request it is (`tenants`; the nil id for the default tenant).
    pub tenant_id: Uuid,
    /// The request asked for its answer's pieces while the model writes.
    pub stream: bool,
    /// Its answer waits for an operator's review (`AWAITING_REVIEW`): read
    /// by the claims of the stages that may answer (see `claim.sql`), false
    /// in the others.
    pub review: bool,
    pub claimed_at: DateTime<Utc>,
    /// How long the row had been due before this claim.
    pub due_for: Duration,
    /// The user's memory this stage reads (see `claim.sql`).
    pub memory: Vec<MemoryRecord>,
    /// The user's logged turns besides this request's query, for the
    /// analyzer (`claim.sql`); 0 for the other stages.
    pub earlier_turns: i64,
    /// Whether the analyzer may ask the user, and what it asked already
    /// (`claim.sql`); `Off` for the other stages.
    pub clarify: Clarify,
}

impl Claimed {
    /// The columns `claim.sql` and a chained row of `finish.sql` share;
    /// `due_for` is left for the caller.
    fn from_columns(r: &Row) -> Result<Claimed, Error> {
        let memory: Option<Value> = r.try_get("memory")?;
        Ok(Claimed {
            id: r.try_get("id")?,
            user_id: r.try_get("user_id")?,
            thread_id: r.try_get("thread_id")?,
            user_query: r.try_get("user_query")?,
            attempt: r.try_get("attempt")?,
            lease_token: r.try_get("lease_token")?,
            analysis: r.try_get("analysis_result")?,
            context: r.try_get("final_context_payload")?,
            debug: r.try_get("debug")?,
            tenant_id: r.try_get("tenant_id")?,
            stream: r.try_get("stream")?,
            review: r.try_get::<_, Option<bool>>("review")?.unwrap_or(false),
            claimed_at: r.try_get("claimed_at")?,
            due_for: Duration::ZERO,
            memory: memory.and_then(|m| serde_json::from_value(m).ok()).unwrap_or_default(),
            earlier_turns: 0,
            clarify: Clarify::Off,
        })
    }
}

impl FromRow for Claimed {
    /// A row of `claim.sql`.
    fn from_row(r: &Row) -> Result<Claimed, Error> {
        let due_ms: f64 = r.try_get("due_for_ms")?;
        Ok(Claimed {
            due_for: Duration::try_from_secs_f64(due_ms.max(0.0) / 1000.0).unwrap_or_default(),
            earlier_turns: r.try_get::<_, Option<i64>>("earlier_turns")?.unwrap_or(0),
            clarify: clarify_of(r.try_get("clarify")?, r.try_get("exchange")?),
            ..Claimed::from_columns(r)?
        })
    }
}

/// The analyzer's [`Clarify`] from the claim's `clarify` and `exchange`
/// (`{"assistant_question": …, "user_reply": …}`, the request's turns).
fn clarify_of(on: Option<bool>, exchange: Option<Value>) -> Clarify {
    let text = |key: &str| {
        exchange
            .as_ref()
            .and_then(|e| e.get(key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    match (on, text("assistant_question")) {
        (Some(true), Some(question)) => Clarify::Asked {
            question,
            reply: text("user_reply"),
        },
        (Some(true), None) => Clarify::MayAsk,
        _ => Clarify::Off,
    }
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
    let params: [&(dyn ToSql + Sync); 4] = [
        &super::as_limit(limit),
        &owner,
        &secs(lease),
        &super::as_limit(memory_records),
    ];
    super::query_as(client, claim_sql(stage), &params).await
}

/// The result of one stage attempt, to be written by [`finish_batch`].
///
/// Built by one constructor per way an attempt ends
/// ([`Finished::succeeded`] with the stage's [`Output`],
/// [`Finished::unsuccessful`] with what the attempt policy decided), and
/// changed afterwards only by its transitions: [`Finished::fuse`],
/// [`Finished::drop_fused_respond`] and [`Finished::fail_instead`]. What an
/// outcome writes lives in its variant of [`Ended`], so a result cannot
/// carry an output and a failure at once.
#[derive(Debug, Clone)]
pub struct Finished {
    pub id: Uuid,
    pub lease_token: i64,
    pub stage: StageKind,
    pub attempt: i32,
    pub started_at: DateTime<Utc>,
    pub latency_ms: Option<i32>,
    /// The model's usage in this attempt, a failed one's included.
    pub usage: StepUsage,
    /// How the attempt ended, with what that writes.
    pub ended: Ended,
}

/// The model's usage in one attempt, as `pipeline_steps` records it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepUsage {
    pub model: Option<String>,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
}

/// How a stage attempt ended.
#[derive(Debug, Clone)]
pub enum Ended {
    /// The stage produced its output: the row moves to the stage's done
    /// status (or further, see `finish.sql`).
    Succeeded(Output),
    /// It did not: what the attempt policy made of it.
    Unsuccessful(Unsuccessful),
}

/// What a successful attempt produced: one variant per stage.
#[derive(Debug, Clone)]
pub enum Output {
    /// The analyzer's analysis, and the assemble stage run right after it
    /// in the same task, if it was (see `finish.sql`).
    Analysis {
        analysis: Value,
        fused: Option<FusedAssemble>,
    },
    /// The assembler's context and the memory it holds
    /// (`pipeline_runs.context_sources`).
    Context { context: String, sources: Option<Value> },
    /// The responder's answer.
    Answer(String),
    /// The responder's answer to a request whose answer an operator
    /// reviews: stored, not logged, and the row rests in `AWAITING_REVIEW`
    /// (see `finish.sql`).
    AnswerToReview(String),
}

impl Output {
    /// The stage that produces this output.
    pub fn stage(&self) -> StageKind {
        match self {
            Output::Analysis { .. } => StageKind::Analyze,
            Output::Context { .. } => StageKind::Assemble,
            Output::Answer(_) | Output::AnswerToReview(_) => StageKind::Respond,
        }
    }
}

/// An attempt that did not succeed, as the attempt policy decided it.
#[derive(Debug, Clone)]
pub struct Unsuccessful {
    /// `retrying`, `deferred`, `failed` or `released`; never `succeeded`.
    pub outcome: Outcome,
    /// The status the row moves to.
    pub new_status: Status,
    /// How long the row waits before it is due again (retrying, deferred).
    pub delay: Duration,
    pub error_class: String,
    /// What an operator reads (`pipeline_runs.error`, the step's message).
    pub error_message: String,
}

/// The assemble stage, run right after a successful analyze on the memory
/// the analyzer was given, and written with it in one statement.
#[derive(Debug, Clone)]
pub struct FusedAssemble {
    pub context: String,
    /// The memory the context holds (`pipeline_runs.context_sources`).
    pub context_sources: Option<Value>,
    pub tokens: Option<i32>,
    pub latency_ms: i32,
    /// The respond stage, when it answered while the two stages before it
    /// were being finished: the request goes from its analyze lease to
    /// `COMPLETED` in one statement.
    pub respond: Option<FusedRespond>,
}

/// The respond stage, run right after a fused assemble on its context and
/// written with both (see `finish.sql`).
#[derive(Debug, Clone)]
pub struct FusedRespond {
    pub answer: String,
    pub model: Option<String>,
    pub prompt_tokens: Option<i32>,
    pub completion_tokens: Option<i32>,
    pub latency_ms: i32,
}

impl Finished {
    /// The attempt on `row` of the stage that produced `output`.
    pub fn succeeded(row: &Claimed, output: Output, usage: StepUsage, latency_ms: Option<i32>) -> Finished {
        Finished::ended(output.stage(), row, Ended::Succeeded(output), usage, latency_ms)
    }

    /// A successful respond attempt on `row` whose answer awaits an
    /// operator's review (`row.review`): `answer` is stored and the row
    /// rests in `AWAITING_REVIEW`, neither logged nor delivered until it
    /// is approved (`app::review`).
    pub fn awaiting_review(row: &Claimed, answer: String, usage: StepUsage, latency_ms: Option<i32>) -> Finished {
        Finished::succeeded(row, Output::AnswerToReview(answer), usage, latency_ms)
    }

    /// An attempt of `stage` on `row` that did not succeed.
    pub fn unsuccessful(
        stage: StageKind,
        row: &Claimed,
        how: Unsuccessful,
        usage: StepUsage,
        latency_ms: Option<i32>,
    ) -> Finished {
        Finished::ended(stage, row, Ended::Unsuccessful(how), usage, latency_ms)
    }

    fn ended(stage: StageKind, row: &Claimed, ended: Ended, usage: StepUsage, latency_ms: Option<i32>) -> Finished {
        Finished {
            id: row.id,
            lease_token: row.lease_token,
            stage,
            attempt: row.attempt,
            started_at: row.claimed_at,
            latency_ms,
            usage,
            ended,
        }
    }

    /// Adds the assemble stage run right after this successful analysis;
    /// any other result is left as it is.
    pub fn fuse(&mut self, fused: FusedAssemble) {
        if let Ended::Succeeded(Output::Analysis { fused: slot, .. }) = &mut self.ended {
            *slot = Some(fused);
        }
    }

    /// Drops the respond stage fused into this result; true if there was one.
    pub fn drop_fused_respond(&mut self) -> bool {
        match &mut self.ended {
            Ended::Succeeded(Output::Analysis { fused: Some(a), .. }) => a.respond.take().is_some(),
            _ => false,
        }
    }

    /// Makes this attempt unsuccessful after all (its outputs are dropped,
    /// its usage kept): a result that cannot be written as it is.
    pub fn fail_instead(&mut self, how: Unsuccessful) {
        self.ended = Ended::Unsuccessful(how);
    }

    /// How the attempt ended, for the step history.
    pub fn outcome(&self) -> Outcome {
        match &self.ended {
            Ended::Succeeded(_) => Outcome::Succeeded,
            Ended::Unsuccessful(u) => u.outcome,
        }
    }

    /// The status the row moves to (before fusing and chaining, which
    /// `finish.sql` decides).
    pub fn new_status(&self) -> Status {
        match &self.ended {
            Ended::Succeeded(Output::AnswerToReview(_)) => Status::AwaitingReview,
            Ended::Succeeded(_) => self.stage.done_status(),
            Ended::Unsuccessful(u) => u.new_status,
        }
    }

    /// How long the row waits before it is due again.
    pub fn delay(&self) -> Duration {
        match &self.ended {
            Ended::Succeeded(_) => Duration::ZERO,
            Ended::Unsuccessful(u) => u.delay,
        }
    }

    /// What the policy decided, for an attempt that did not succeed.
    fn how_unsuccessful(&self) -> Option<&Unsuccessful> {
        match &self.ended {
            Ended::Unsuccessful(u) => Some(u),
            Ended::Succeeded(_) => None,
        }
    }

    pub fn error_class(&self) -> Option<&str> {
        self.how_unsuccessful().map(|u| u.error_class.as_str())
    }

    pub fn error_message(&self) -> Option<&str> {
        self.how_unsuccessful().map(|u| u.error_message.as_str())
    }

    /// The output of a successful attempt.
    pub fn output(&self) -> Option<&Output> {
        match &self.ended {
            Ended::Succeeded(o) => Some(o),
            Ended::Unsuccessful(_) => None,
        }
    }

    /// A successful analyze attempt's analysis.
    pub fn analysis(&self) -> Option<&Value> {
        match self.output()? {
            Output::Analysis { analysis, .. } => Some(analysis),
            _ => None,
        }
    }

    /// The context this result writes: an assemble attempt's, or the fused
    /// assemble stage's.
    pub fn context(&self) -> Option<&str> {
        match self.output()? {
            Output::Context { context, .. } => Some(context),
            Output::Analysis { fused, .. } => fused.as_ref().map(|a| a.context.as_str()),
            Output::Answer(_) | Output::AnswerToReview(_) => None,
        }
    }

    /// The memory the written context holds.
    pub fn context_sources(&self) -> Option<&Value> {
        match self.output()? {
            Output::Context { sources, .. } => sources.as_ref(),
            Output::Analysis { fused, .. } => fused.as_ref().and_then(|a| a.context_sources.as_ref()),
            Output::Answer(_) | Output::AnswerToReview(_) => None,
        }
    }

    /// A successful respond attempt's answer (not a fused one's), one
    /// that awaits review included.
    pub fn answer(&self) -> Option<&str> {
        match self.output()? {
            Output::Answer(a) | Output::AnswerToReview(a) => Some(a),
            _ => None,
        }
    }

    /// The assemble stage fused with this result, if any.
    pub fn fused(&self) -> Option<&FusedAssemble> {
        match self.output()? {
            Output::Analysis { fused, .. } => fused.as_ref(),
            _ => None,
        }
    }

    /// The respond stage fused with this result, if any.
    pub fn fused_respond(&self) -> Option<&FusedRespond> {
        self.fused().and_then(|a| a.respond.as_ref())
    }

    /// The stage this result leads to when it succeeds.
    pub fn next_stage(&self) -> Option<StageKind> {
        if self.fused_respond().is_some() {
            StageKind::Respond.next()
        } else if self.fused().is_some() {
            StageKind::Assemble.next()
        } else {
            self.stage.next()
        }
    }
}

super::statement_params! {
    /// The inputs of `finish.sql`, `$1` to `$30` in field order (the
    /// statement's doc comment says what each is): one array per column of
    /// the batch, with two scalars among them (the worker, the lease of a
    /// chained claim).
    struct FinishParams<'a> {
        id: Vec<Uuid>,
        token: Vec<i64>,
        stage: Vec<StageKind>,
        in_flight: Vec<Status>,
        new_status: Vec<Status>,
        outcome: Vec<Outcome>,
        attempt: Vec<i32>,
        started_at: Vec<DateTime<Utc>>,
        analysis: Vec<Option<&'a Value>>,
        context: Vec<Option<&'a str>>,
        answer: Vec<Option<&'a str>>,
        error_class: Vec<Option<&'a str>>,
        error_message: Vec<Option<&'a str>>,
        delay_ms: Vec<i64>,
        model: Vec<Option<&'a str>>,
        prompt_tokens: Vec<Option<i32>>,
        completion_tokens: Vec<Option<i32>>,
        latency_ms: Vec<Option<i32>>,
        worker: &'a str,
        chain_to: Vec<Option<Status>>,
        lease_secs: f64,
        fused_in: Vec<bool>,
        fused_tokens: Vec<Option<i32>>,
        fused_latency_ms: Vec<Option<i32>>,
        context_sources: Vec<Option<&'a Value>>,
        fused_answer: Vec<Option<&'a str>>,
        fused_model: Vec<Option<&'a str>>,
        fused_prompt_tokens: Vec<Option<i32>>,
        fused_completion_tokens: Vec<Option<i32>>,
        fused_respond_latency_ms: Vec<Option<i32>>,
    }
}

impl<'a> FinishParams<'a> {
    fn new(
        worker: &'a str,
        batch: &'a [Finished],
        chain: impl Fn(&Finished) -> Option<StageKind>,
        lease: Duration,
    ) -> Self {
        FinishParams {
            id: each(batch, |f| f.id),
            token: each(batch, |f| f.lease_token),
            stage: each(batch, |f| f.stage),
            in_flight: each(batch, |f| f.stage.in_flight_status()),
            new_status: each(batch, Finished::new_status),
            outcome: each(batch, Finished::outcome),
            attempt: each(batch, |f| f.attempt),
            started_at: each(batch, |f| f.started_at),
            analysis: each(batch, Finished::analysis),
            context: each(batch, Finished::context),
            answer: each(batch, Finished::answer),
            error_class: each(batch, Finished::error_class),
            error_message: each(batch, Finished::error_message),
            delay_ms: each(batch, |f| i64::try_from(f.delay().as_millis()).unwrap_or(i64::MAX)),
            model: each(batch, |f| f.usage.model.as_deref()),
            prompt_tokens: each(batch, |f| f.usage.prompt_tokens),
            completion_tokens: each(batch, |f| f.usage.completion_tokens),
            latency_ms: each(batch, |f| f.latency_ms),
            worker,
            chain_to: batch
                .iter()
                .map(|f| chain(f).map(StageKind::in_flight_status))
                .collect(),
            lease_secs: secs(lease),
            fused_in: each(batch, |f| f.fused().is_some()),
            fused_tokens: each(batch, |f| f.fused().and_then(|a| a.tokens)),
            fused_latency_ms: each(batch, |f| f.fused().map(|a| a.latency_ms)),
            context_sources: each(batch, Finished::context_sources),
            fused_answer: each(batch, |f| f.fused_respond().map(|r| r.answer.as_str())),
            fused_model: each(batch, |f| f.fused_respond().and_then(|r| r.model.as_deref())),
            fused_prompt_tokens: each(batch, |f| f.fused_respond().and_then(|r| r.prompt_tokens)),
            fused_completion_tokens: each(batch, |f| f.fused_respond().and_then(|r| r.completion_tokens)),
            fused_respond_latency_ms: each(batch, |f| f.fused_respond().map(|r| r.latency_ms)),
        }
    }
}

/// `f` of each result of `batch`, in order: one array of `finish.sql`.
fn each<'a, T>(batch: &'a [Finished], f: impl Fn(&'a Finished) -> T) -> Vec<T> {
    batch.iter().map(f).collect()
}

/// A result that was applied: the row's creation time (for the request
/// duration histogram) and, when it was chained, its claim for the next
/// stage.
#[derive(Debug, Clone)]
pub struct Applied {
    pub id: Uuid,
    /// The lease token the result was written under (the result's own, not
    /// the chained claim's).
    pub result_token: i64,
    pub created_at: DateTime<Utc>,
    /// Its fused assemble result was written too (not for a debug request, nor
    /// while paused: the row then rests in `ANALYZED`).
    pub fused: bool,
    /// Its fused respond result was written too: the request is `COMPLETED`.
    pub responded: bool,
    pub chained: Option<(StageKind, Claimed)>,
}

impl FromRow for Applied {
    /// A row of `finish.sql`.
    fn from_row(r: &Row) -> Result<Applied, Error> {
        let id: Uuid = r.try_get("id")?;
        let chained = if r.try_get::<_, bool>("chained")? {
            let status: Status = super::column(r, "status")?;
            let stage = status
                .in_flight_stage()
                .ok_or_else(|| Error::Unexpected(format!("finish: chained row {id} has status {status}")))?;
            Some((stage, Claimed::from_columns(r)?))
        } else {
            None
        };
        Ok(Applied {
            id,
            result_token: r.try_get("result_token")?,
            created_at: r.try_get("created_at")?,
            fused: r.try_get("fused")?,
            responded: r.try_get("responded")?,
            chained,
        })
    }
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
    let params = FinishParams::new(worker, batch, chain, lease);
    super::query_as(client, FINISH, &params.params()).await
}

/// Renews the given leases; returns the ids still held.
pub async fn extend_leases(
    client: &impl GenericClient,
    held: &[(Uuid, i64)],
    lease: Duration,
) -> Result<Vec<Uuid>, Error> {
    let ids: Vec<Uuid> = held.iter().map(|h| h.0).collect();
    let tokens: Vec<i64> = held.iter().map(|h| h.1).collect();
    super::query_column(client, HEARTBEAT, &[&ids, &tokens, &secs(lease)], "id").await
}

super::row_struct! {
    /// A row the sweep took back from an expired lease.
    #[derive(Debug, Clone)]
    pub struct Reclaimed {
        pub id: Uuid,
        pub new_status: Status,
        pub was: Status,
    }
}

/// Takes back up to `limit` rows whose lease expired.
pub async fn reclaim_expired(
    client: &impl GenericClient,
    max_attempts: u32,
    limit: usize,
) -> Result<Vec<Reclaimed>, Error> {
    let max = i32::try_from(max_attempts).unwrap_or(i32::MAX);
    super::query_as(client, RECLAIM_EXPIRED, &[&max, &super::as_limit(limit)]).await
}

#[cfg(test)]
mod tests;
