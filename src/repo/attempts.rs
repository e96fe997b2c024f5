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
use crate::model::{MemoryRecord, Outcome, StageKind, Status};

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
    pub claimed_at: DateTime<Utc>,
    /// How long the row had been due before this claim.
    pub due_for: Duration,
    /// The user's memory this stage reads (see `claim.sql`).
    pub memory: Vec<MemoryRecord>,
    /// The user's logged turns besides this request's query, for the
    /// analyzer (`claim.sql`); 0 for the other stages.
    pub earlier_turns: i64,
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
            claimed_at: r.try_get("claimed_at")?,
            due_for: Duration::ZERO,
            memory: memory.and_then(|m| serde_json::from_value(m).ok()).unwrap_or_default(),
            earlier_turns: 0,
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
            ..Claimed::from_columns(r)?
        })
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
    /// The memory the context holds (`pipeline_runs.context_sources`).
    pub context_sources: Option<Value>,
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
    /// A successful attempt of `stage` on `row`, with no output yet: the
    /// caller fills in what the stage produced (or turns it into a failure).
    pub fn succeeded(stage: StageKind, row: &Claimed, latency_ms: Option<i32>) -> Finished {
        Finished {
            id: row.id,
            lease_token: row.lease_token,
            stage,
            outcome: Outcome::Succeeded,
            new_status: stage.done_status(),
            attempt: row.attempt,
            started_at: row.claimed_at,
            analysis: None,
            context: None,
            context_sources: None,
            answer: None,
            error_class: None,
            error_message: None,
            delay: Duration::ZERO,
            model: None,
            prompt_tokens: None,
            completion_tokens: None,
            latency_ms,
            fused: None,
        }
    }

    /// The respond stage fused with this result, if any.
    pub fn fused_respond(&self) -> Option<&FusedRespond> {
        self.fused.as_ref().and_then(|a| a.respond.as_ref())
    }

    /// The stage this result leads to when it succeeds.
    pub fn next_stage(&self) -> Option<StageKind> {
        if self.fused_respond().is_some() {
            StageKind::Respond.next()
        } else if self.fused.is_some() {
            StageKind::Assemble.next()
        } else {
            self.stage.next()
        }
    }
}

super::statement_params! {
    /// The inputs of `finish.sql`, `$1` to `$25` in field order: one array
    /// per column of the batch, then the worker, the lease of a chained
    /// claim, the fused assemble results and the context's sources.
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
            id: batch.iter().map(|f| f.id).collect(),
            token: batch.iter().map(|f| f.lease_token).collect(),
            stage: batch.iter().map(|f| f.stage).collect(),
            in_flight: batch.iter().map(|f| f.stage.in_flight_status()).collect(),
            new_status: batch.iter().map(|f| f.new_status).collect(),
            outcome: batch.iter().map(|f| f.outcome).collect(),
            attempt: batch.iter().map(|f| f.attempt).collect(),
            started_at: batch.iter().map(|f| f.started_at).collect(),
            analysis: batch.iter().map(|f| f.analysis.as_ref()).collect(),
            context: batch
                .iter()
                .map(|f| f.context.as_deref().or(f.fused.as_ref().map(|a| a.context.as_str())))
                .collect(),
            answer: batch.iter().map(|f| f.answer.as_deref()).collect(),
            error_class: batch.iter().map(|f| f.error_class.as_deref()).collect(),
            error_message: batch.iter().map(|f| f.error_message.as_deref()).collect(),
            delay_ms: batch
                .iter()
                .map(|f| i64::try_from(f.delay.as_millis()).unwrap_or(i64::MAX))
                .collect(),
            model: batch.iter().map(|f| f.model.as_deref()).collect(),
            prompt_tokens: batch.iter().map(|f| f.prompt_tokens).collect(),
            completion_tokens: batch.iter().map(|f| f.completion_tokens).collect(),
            latency_ms: batch.iter().map(|f| f.latency_ms).collect(),
            worker,
            chain_to: batch
                .iter()
                .map(|f| chain(f).map(StageKind::in_flight_status))
                .collect(),
            lease_secs: secs(lease),
            fused_in: batch.iter().map(|f| f.fused.is_some()).collect(),
            fused_tokens: batch.iter().map(|f| f.fused.as_ref().and_then(|a| a.tokens)).collect(),
            fused_latency_ms: batch.iter().map(|f| f.fused.as_ref().map(|a| a.latency_ms)).collect(),
            context_sources: batch
                .iter()
                .map(|f| {
                    f.context_sources
                        .as_ref()
                        .or(f.fused.as_ref().and_then(|a| a.context_sources.as_ref()))
                })
                .collect(),
            fused_answer: batch
                .iter()
                .map(|f| f.fused_respond().map(|r| r.answer.as_str()))
                .collect(),
            fused_model: batch
                .iter()
                .map(|f| f.fused_respond().and_then(|r| r.model.as_deref()))
                .collect(),
            fused_prompt_tokens: batch
                .iter()
                .map(|f| f.fused_respond().and_then(|r| r.prompt_tokens))
                .collect(),
            fused_completion_tokens: batch
                .iter()
                .map(|f| f.fused_respond().and_then(|r| r.completion_tokens))
                .collect(),
            fused_respond_latency_ms: batch.iter().map(|f| f.fused_respond().map(|r| r.latency_ms)).collect(),
        }
    }
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
mod tests {
    use super::super::params_check::check;
    use super::*;

    #[test]
    fn finish_params_are_in_the_order_the_sql_documents() {
        check(FINISH, FinishParams::NAMES);
    }
}
