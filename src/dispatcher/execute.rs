//! One attempt: a claimed row through its stage, and its record.
//!
//! - A stage runs within `stage_timeout_secs` and under a panic guard: a
//!   timeout or a panic is a retryable stage error like any other, never a
//!   lost task or a dead process.
//! - A running stage stops when its lease is found lost (its result would
//!   be rejected) or at the end of the grace period (its lease is released,
//!   its attempt unspent).
//! - What the outcome does to the request is [`super::policy::decide`]'s;
//!   this file only turns the decision into the [`Finished`] record and its
//!   message, and hands that to the completer exactly once per attempt.
//! - A successful analyze may run the assemble stage at once on the same
//!   input ([`Engine::fuse`]); whatever fusing does, the analysis stands.
//! - Before an assemble stage (fused or not) the request's memory is read
//!   as the stage layer plans it (`retrieve.rs`): one statement, one more
//!   per sub-query the plan holds, none when the plan needs none; the
//!   engine does not read the analysis itself. A failed read is a
//!   retryable stage error (a fused assemble is then left to the assemble
//!   stage).
//! - With an embedder, the query of a user with earlier turns is embedded
//!   while the analyzer's model call runs; the fused assemble's search uses
//!   that embedding, and it is kept with the analysis
//!   (`stage::analysis::keep_query_embedding`) for an assemble stage
//!   claimed on its own, which embeds the query only when none of its
//!   embedder's model was kept.
//! - A respond stage of a request that asked to stream gets a sink for its
//!   answer's pieces ([`Engine::delta_sink`], `publish.rs`); no other does.
//! - After a fused assemble the respond stage starts at once on its context
//!   ([`Engine::respond_early`]): when it answers within [`RESPOND_WAIT`],
//!   the three results are written in one statement (the request goes from
//!   its analyze lease to `COMPLETED`); otherwise the first two are written
//!   and chained as usual, and the respond stage that the chain starts takes
//!   over the running attempt instead of calling the model again (one
//!   model call, one recorded attempt, either way; unless the answer's log
//!   is locked by another transaction, `contention.rs`).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use super::policy::{ClaimFacts, Decision, StageOutcome, decide};
use super::{Engine, bump, millis};
use crate::llm::embed::Embedder;
use crate::model::{Prompts, StageKind};
use crate::repo::{self, Claimed, Finished, Output, StepUsage, Unsuccessful};
use crate::sanitize;
use crate::stage::{StageError, StageInput, StageOutput, StageSuccess, analysis};

/// What a stage attempt of `row` is given (no sink for pieces: see
/// [`Engine::delta_sink`]).
fn input_of(row: &mut Claimed, prompts: Arc<Prompts>) -> StageInput {
    StageInput {
        request_id: row.id,
        user_id: row.user_id,
        thread_id: row.thread_id,
        user_query: row.user_query.clone(),
        attempt: u32::try_from(row.attempt).unwrap_or(1),
        analysis: row.analysis.clone(),
        context: row.context.clone(),
        memory: std::mem::take(&mut row.memory),
        earlier_turns: row.earlier_turns,
        clarify: std::mem::take(&mut row.clarify),
        query_embedding: row.analysis.as_ref().and_then(analysis::kept_query_embedding),
        retrieved: Vec::new(),
        prompts,
        deltas: None,
    }
}

/// How long a fused analyze result waits for the respond stage started on
/// its context before it is written without it. Long enough for a responder
/// that answers at once (the offline provider, a local model); a model
/// called over the network takes longer, and its request is written per
/// stage as before, the analysis only this much later.
pub(super) const RESPOND_WAIT: Duration = Duration::from_millis(5);

/// The outcome of a respond stage started early, and how long it ran.
type EarlyOutcome = (Result<StageSuccess, StageError>, Duration);

/// A respond stage started right after a fused assemble that did not answer
/// in time to be written with it (or failed): the next respond stage of that
/// request here takes it over ([`Engine::take_early`]).
pub(super) enum EarlyRespond {
    Done(EarlyOutcome),
    /// Stops when dropped (no respond stage here will take it).
    Running(AbortOnDropHandle<EarlyOutcome>),
}

impl EarlyRespond {
    async fn outcome(self) -> EarlyOutcome {
        match self {
            EarlyRespond::Done(outcome) => outcome,
            EarlyRespond::Running(handle) => match handle.await {
                Ok(outcome) => outcome,
                Err(e) => (
                    Err(StageError::retry(
                        "panic",
                        format!("the respond stage's task ended: {e}"),
                    )),
                    Duration::ZERO,
                ),
            },
        }
    }
}

enum Attempt {
    Succeeded(StageSuccess),
    Failed(StageError),
    Released,
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let msg = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("the stage panicked: {msg}")
}

impl Engine {
    /// Runs one claimed row through its stage and hands the result to the
    /// completer.
    pub(super) async fn execute(
        self: Arc<Self>,
        stage: StageKind,
        mut row: Claimed,
        prompts: Arc<Prompts>,
        cancel: CancellationToken,
        waiting_from: Option<StageKind>,
    ) {
        // A row chained without a free slot in this stage still holds the
        // slot of the stage it finished; it trades that for one of this
        // stage's as soon as one frees (the lease is renewed meanwhile).
        if let Some(from) = waiting_from
            && !self.trade_slot(stage, &row, from, &cancel).await
        {
            return;
        }
        // Every line of the attempt (the LLM layer's included) carries the
        // request id: one request's path is one `request_id` in the logs.
        let span = tracing::info_span!("stage", request.id = %row.id, %stage, attempt = row.attempt);
        let mut input = input_of(&mut row, prompts);
        let streamed = self.delta_sink(stage, &row).map(|(sink, written)| {
            input.deltas = Some(sink);
            written
        });
        let early = if stage == StageKind::Respond {
            self.take_early(row.id)
        } else {
            None
        };
        let started = Instant::now();
        let result = async {
            tokio::select! {
                r = self.run_stage(stage, &mut input, early) => Some(r),
                _ = cancel.cancelled() => None,
            }
        }
        .instrument(span.clone())
        .await;
        let (result, latency) = match result {
            Some((r, ran)) => (Some(r), ran.unwrap_or_else(|| started.elapsed())),
            None => (None, started.elapsed()),
        };
        super::publish::last_pieces_out(&mut input, streamed).await;
        let result = match result {
            None if self.hard_stop.is_cancelled() => Attempt::Released,
            None => {
                // The heartbeat found the lease lost; someone else owns the row.
                self.forget(row.id, row.lease_token);
                return;
            }
            Some(Err(e)) => Attempt::Failed(e),
            Some(Ok(ok)) => Attempt::Succeeded(ok),
        };
        let mut finished = self.record(stage, &row, result, latency);
        let usage = &finished.usage;
        self.tenant_names
            .count(&self.pool, row.tenant_id, usage.prompt_tokens, usage.completion_tokens);
        // An analysis that asks the user (only where the request may ask:
        // the analyzer drops a question elsewhere) ends in a wait, not in
        // the next stage.
        if let Some(question) = finished.analysis().and_then(analysis::question_of) {
            self.ask(&row, &finished, question).instrument(span).await;
            return;
        }
        if let Some(analysis) = finished.analysis().filter(|_| !row.debug).cloned() {
            let fused = tracing::info_span!("stage", request.id = %row.id, stage = %StageKind::Assemble, fused = true);
            // (an answer that streams, or awaits review, is not fused: it is
            // written by its own respond stage)
            let respond = !row.stream && !row.review;
            if let Some(assembled) = self.fuse(input, Some(analysis), respond).instrument(fused).await {
                finished.fuse(assembled);
            }
            if let Some(r) = finished.fused_respond() {
                self.tenant_names
                    .count(&self.pool, row.tenant_id, r.prompt_tokens, r.completion_tokens);
            }
        }
        let _guard = span.enter();
        self.hand_over(finished);
    }

    /// The stage on `input`, or the outcome of its respond stage started
    /// early (with how long that ran).
    async fn run_stage(
        &self,
        stage: StageKind,
        input: &mut StageInput,
        early: Option<EarlyRespond>,
    ) -> (Result<StageSuccess, StageError>, Option<Duration>) {
        if let Some(early) = early {
            let (r, ran) = early.outcome().await;
            return (r, Some(ran));
        }
        let r = match stage {
            StageKind::Analyze => self.analyze_and_embed(input).await,
            StageKind::Assemble => match self.retrieve(input).await {
                Ok(()) => self.run_guarded(stage, input).await,
                Err(e) => Err(e),
            },
            StageKind::Respond => self.run_guarded(stage, input).await,
        };
        (r, None)
    }

    /// Trades the slot of `from` that a chained `row` holds for one of
    /// `stage`'s, waiting for one to free. False when the row is done with
    /// meanwhile: released at the end of the grace period, or its lease
    /// found lost.
    async fn trade_slot(&self, stage: StageKind, row: &Claimed, from: StageKind, cancel: &CancellationToken) -> bool {
        let acquired = tokio::select! {
            p = self.slot(stage).sem.clone().acquire_owned() => p.ok(),
            _ = cancel.cancelled() => None,
        };
        let Some(permit) = acquired else {
            self.drop_early(row.id);
            if self.hard_stop.is_cancelled() {
                let finished = self.record(stage, row, Attempt::Released, Duration::ZERO);
                self.hand_over(finished);
            } else {
                self.forget(row.id, row.lease_token); // the heartbeat found the lease lost
            }
            return false;
        };
        let previous = self.inflight.lock().ok().and_then(|mut map| {
            map.get_mut(&row.id).map(|f| {
                f.slot_of = stage;
                std::mem::replace(&mut f.slot, permit)
            })
        });
        drop(previous);
        self.freed(from);
        true
    }

    /// Runs the assemble stage right after a successful analyze, when the
    /// pipeline says it can run on what the analyzer was given
    /// ([`Pipeline::fuse_assemble`](crate::stage::Pipeline::fuse_assemble); the engine does not read the analysis).
    /// Its result is written with the analysis in one statement (one commit
    /// and one row version fewer per request). When it cannot run here, or
    /// fails, the assemble stage runs on its own as usual.
    ///
    /// With `respond` (the request does not stream), the respond stage
    /// then starts on the context ([`Engine::respond_early`]).
    async fn fuse(
        self: &Arc<Self>,
        input: StageInput,
        analysis: Option<serde_json::Value>,
        respond: bool,
    ) -> Option<repo::FusedAssemble> {
        let mut input = self.pipeline.fuse_assemble(input, analysis)?;
        let started = Instant::now();
        self.retrieve(&mut input).await.ok()?;
        let out = self.run_guarded(StageKind::Assemble, &input).await;
        let latency_ms = i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX);
        match &out {
            Ok(_) => tracing::debug!(latency_ms, "stage succeeded (fused with analyze)"),
            Err(e) => tracing::debug!(class = %e.class, error = %e.message,
                "fused assemble failed; the assemble stage runs on its own"),
        }
        match out {
            Ok(StageSuccess {
                output: StageOutput::Context(context),
                usage,
                context_sources,
            }) => {
                let respond = if respond {
                    self.respond_early(input, &context).await
                } else {
                    None
                };
                Some(repo::FusedAssemble {
                    context,
                    context_sources,
                    tokens: usage.prompt_tokens.and_then(|t| i32::try_from(t).ok()),
                    latency_ms,
                    respond,
                })
            }
            _ => None,
        }
    }

    /// Starts the respond stage on a fused assemble's `context` and waits
    /// [`RESPOND_WAIT`] for it. An answer in time is returned, to be written
    /// with the analysis and the context; anything else (a failure, or no
    /// answer yet) is kept for the respond stage the chain will start
    /// ([`Engine::take_early`]), so the model is called once per attempt.
    async fn respond_early(self: &Arc<Self>, mut input: StageInput, context: &str) -> Option<repo::FusedRespond> {
        let id = input.request_id;
        input.context = Some(context.to_owned());
        input.attempt = 1;
        input.memory = Vec::new();
        input.retrieved = Vec::new();
        input.query_embedding = None;
        let engine = self.clone();
        let started = Instant::now();
        let mut run = Box::pin(
            async move {
                let r = engine.run_guarded(StageKind::Respond, &input).await;
                (r, started.elapsed())
            }
            .instrument(tracing::info_span!("stage", request.id = %id, stage = %StageKind::Respond, early = true)),
        );
        let kept = match tokio::time::timeout(RESPOND_WAIT, &mut run).await {
            Ok((
                Ok(StageSuccess {
                    output: StageOutput::Answer(answer),
                    usage,
                    ..
                }),
                ran,
            )) => {
                tracing::debug!(request.id = %id, latency_ms = millis(ran), "stage succeeded (fused with analyze)");
                return Some(repo::FusedRespond {
                    answer,
                    model: usage.model,
                    prompt_tokens: usage.prompt_tokens.and_then(|t| i32::try_from(t).ok()),
                    completion_tokens: usage.completion_tokens.and_then(|t| i32::try_from(t).ok()),
                    latency_ms: i32::try_from(ran.as_millis()).unwrap_or(i32::MAX),
                });
            }
            Ok(outcome) => EarlyRespond::Done(outcome),
            Err(_) => EarlyRespond::Running(AbortOnDropHandle::new(tokio::spawn(run))),
        };
        // An entry no respond stage here took (its request was claimed by
        // another daemon) is dropped once no attempt could still use it.
        let stale = self.cfg.stage_timeout() + self.cfg.lease();
        if let Ok(mut map) = self.early.lock() {
            map.retain(|_, (since, _)| since.elapsed() < stale);
            map.insert(id, (Instant::now(), kept));
        }
        None
    }

    /// The respond stage started early for request `id`, if one was kept.
    fn take_early(&self, id: uuid::Uuid) -> Option<EarlyRespond> {
        self.early
            .lock()
            .ok()
            .and_then(|mut map| map.remove(&id))
            .map(|(_, e)| e)
    }

    /// Stops and forgets the respond stage started early for `id`: its
    /// request will not run its respond stage here.
    pub(super) fn drop_early(&self, id: uuid::Uuid) {
        let early = self.take_early(id);
        drop(early);
    }

    /// The analyze stage, with the query embedded while the analyzer's model
    /// call runs (kept in `input` for the fused assemble and in the stored
    /// analysis for an assemble stage claimed on its own), so that the
    /// semantic part of the search adds no embedding time to the request.
    /// Not for a user without an earlier turn: the semantic part compares
    /// the query with the user's turns, and there is none to compare it
    /// with (a search that still runs embeds the query then, as an
    /// assemble stage does when nothing was kept).
    async fn analyze_and_embed(&self, input: &mut StageInput) -> Result<StageSuccess, StageError> {
        let embedder = self.embedder.as_ref().filter(|_| input.earlier_turns > 0);
        let (mut r, embedded) = tokio::join!(
            self.run_guarded(StageKind::Analyze, input),
            Embedder::for_search(embedder, &input.user_query)
        );
        if let (
            Ok(StageSuccess {
                output: StageOutput::Analysis(stored),
                ..
            }),
            Some((e, model)),
        ) = (&mut r, &embedded)
        {
            analysis::keep_query_embedding(stored, e, model);
        }
        input.query_embedding = embedded.map(|(e, model)| (e, model.to_owned()));
        r
    }

    /// Runs one stage within the stage timeout; a timeout or a panic is a
    /// retryable stage error like any other.
    async fn run_guarded(&self, stage: StageKind, input: &StageInput) -> Result<StageSuccess, StageError> {
        let run = AssertUnwindSafe(self.pipeline.run(stage, input)).catch_unwind();
        match tokio::time::timeout(self.cfg.stage_timeout(), run).await {
            Err(_) => Err(StageError::retry(
                "stage_timeout",
                format!("{stage} did not finish within {} s", self.cfg.stage_timeout_secs),
            )),
            Ok(Err(panic)) => Err(StageError::retry("panic", panic_message(&panic))),
            Ok(Ok(result)) => result,
        }
    }

    /// Writes a successful analyze attempt that asks the user: the row
    /// waits for the reply, holding no lease (`ask_user.sql`). Then drops
    /// the row and frees its slot, whatever happened: a row whose lease was
    /// lost is someone else's, and a write that failed leaves the lease to
    /// expire, after which the analyzer runs again.
    async fn ask(&self, row: &Claimed, finished: &Finished, mut question: String) {
        let mut found = sanitize::Sanitised::default();
        sanitize::text(&mut question, sanitize::MAX_ERROR_CHARS, &mut found);
        let mut stored = finished.analysis().cloned().unwrap_or_default();
        sanitize::json(&mut stored, &mut found);
        let written = match self.pool.get().await {
            Ok(client) => {
                repo::waits::ask_user(
                    &client,
                    row,
                    &self.worker,
                    &stored,
                    &question,
                    &finished.usage,
                    finished.latency_ms,
                )
                .await
            }
            Err(e) => Err(e.into()),
        };
        match written {
            Ok(Some(expires)) => {
                bump(&self.stats.succeeded[StageKind::Analyze.index()]);
                tracing::info!(expires = ?expires, "the analyzer asked the user; the request waits for the reply");
            }
            Ok(None) => tracing::info!("the lease was lost before the question was written; nothing changed"),
            Err(e) => tracing::warn!(error = %e,
                "the question could not be written; the analyzer runs again once the lease expires"),
        }
        self.forget(row.id, row.lease_token);
    }

    /// Marks a row's stage finished and gives its result to the completer.
    fn hand_over(&self, finished: Finished) {
        let (id, token) = (finished.id, finished.lease_token);
        if let Ok(mut map) = self.inflight.lock()
            && let Some(f) = map.get_mut(&id)
            && f.token == token
        {
            f.finished = true;
        }
        if self.results.send(finished).is_err() {
            tracing::error!("completer is gone; the lease will expire and the sweep will retry");
            self.forget(id, token);
        }
    }

    /// The record of one attempt: what [`decide`] made of its outcome, the
    /// message an operator reads, and the model's usage.
    fn record(&self, stage: StageKind, row: &Claimed, attempt: Attempt, latency: Duration) -> Finished {
        let latency_ms = Some(i32::try_from(latency.as_millis()).unwrap_or(i32::MAX));
        match attempt {
            Attempt::Succeeded(StageSuccess {
                output,
                usage,
                context_sources,
            }) => {
                let output = match (stage, output) {
                    (StageKind::Analyze, StageOutput::Analysis(analysis)) => Output::Analysis { analysis, fused: None },
                    (StageKind::Assemble, StageOutput::Context(context)) => Output::Context {
                        context,
                        sources: context_sources,
                    },
                    (StageKind::Respond, StageOutput::Answer(answer)) if row.review => {
                        tracing::debug!(request.id = %row.id, attempt = row.attempt, "answer awaits review");
                        return Finished::awaiting_review(row, answer, step_usage(usage), latency_ms);
                    }
                    (StageKind::Respond, StageOutput::Answer(answer)) => Output::Answer(answer),
                    (_, other) => {
                        let wrong = format!("{stage} produced the wrong kind of output: {other:?}");
                        return self.record(
                            stage,
                            row,
                            Attempt::Failed(StageError::fail("internal", wrong)),
                            latency,
                        );
                    }
                };
                tracing::debug!(request.id = %row.id, %stage, attempt = row.attempt, "stage succeeded");
                Finished::succeeded(row, output, step_usage(usage), latency_ms)
            }
            Attempt::Released => {
                let claim = ClaimFacts {
                    attempt: u32::try_from(row.attempt).unwrap_or(u32::MAX),
                    jitter: 1.0,
                };
                let decision = decide(stage, &claim, &StageOutcome::Released, &self.policy);
                bump(&self.stats.released);
                let how = Unsuccessful {
                    outcome: decision.outcome(),
                    new_status: decision.status(),
                    delay: Duration::ZERO,
                    error_class: "shutdown".into(),
                    error_message: "released at shutdown before the stage finished".into(),
                };
                Finished::unsuccessful(stage, row, how, StepUsage::default(), latency_ms)
            }
            Attempt::Failed(mut e) => {
                let usage = step_usage(std::mem::take(&mut e.usage));
                Finished::unsuccessful(stage, row, self.failed(stage, row, e), usage, latency_ms)
            }
        }
    }

    /// What [`decide`] makes of a failed attempt, with the message an
    /// operator reads.
    fn failed(&self, stage: StageKind, row: &Claimed, e: StageError) -> Unsuccessful {
        let attempts = u32::try_from(row.attempt).unwrap_or(u32::MAX);
        let claim = ClaimFacts {
            attempt: attempts,
            jitter: crate::backoff::jitter(),
        };
        let decision = decide(stage, &claim, &StageOutcome::Failed(e.disposition), &self.policy);
        let delay = decision.delay();
        let error_message = match decision {
            Decision::Defer { after, .. } => {
                tracing::info!(request.id = %row.id, %stage, class = %e.class, retry_in_ms = millis(after),
                    "stage deferred");
                format!(
                    "{stage} deferred ({}): {}; trying again in {} ms without spending an attempt",
                    e.class,
                    e.message,
                    after.as_millis()
                )
            }
            Decision::Retry { limit, .. } => {
                tracing::warn!(request.id = %row.id, %stage, attempt = attempts, class = %e.class,
                    error = %e.message, retry_in_ms = millis(delay), "stage failed; will retry");
                format!(
                    "{stage} attempt {attempts} of {limit} failed ({}): {}; retrying in {} ms",
                    e.class,
                    e.message,
                    delay.as_millis()
                )
            }
            Decision::Fail { exhausted: Some(_) } => {
                tracing::warn!(request.id = %row.id, %stage, attempt = attempts, class = %e.class,
                    error = %e.message, "stage failed; attempts exhausted");
                format!("{stage} failed after {attempts} attempts ({}): {}", e.class, e.message)
            }
            Decision::Fail { exhausted: None } | Decision::Advance { .. } | Decision::Release { .. } => {
                tracing::warn!(request.id = %row.id, %stage, attempt = attempts, class = %e.class,
                    error = %e.message, "stage failed permanently");
                format!("{stage} failed ({}): {}", e.class, e.message)
            }
        };
        Unsuccessful {
            outcome: decision.outcome(),
            new_status: decision.status(),
            delay,
            error_class: e.class.to_string(),
            error_message,
        }
    }
}

/// A stage's usage as the step history records it.
fn step_usage(usage: crate::stage::Usage) -> StepUsage {
    StepUsage {
        model: usage.model,
        prompt_tokens: usage.prompt_tokens.and_then(|t| i32::try_from(t).ok()),
        completion_tokens: usage.completion_tokens.and_then(|t| i32::try_from(t).ok()),
    }
}
