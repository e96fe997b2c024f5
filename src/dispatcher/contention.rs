//! Lock contention in a result batch: a transaction outside the daemon (a
//! producer inserting one user's turns, an operator's `SELECT … FOR
//! UPDATE`) holds a row the batch must lock.
//!
//! Guarantees:
//! - Every engine session has `lock_timeout` (`[db]`), so the batch
//!   statement fails with SQLSTATE 55P03 instead of waiting for the other
//!   transaction forever.
//! - A contended batch of more than one result is split ([`split`]) and
//!   the parts are written apart: the results that log an answer (each
//!   locks its user's `archive_marks` row, triggers/0004) one by one, the
//!   others together, and a part that is contended again is halved. So
//!   results that need no locked row are written after at most two lock
//!   timeouts, and only the results touching the held rows keep waiting
//!   (within their lease, renewed by the heartbeat meanwhile).
//! - An answer that cannot be logged after [`LOG_TRIES`] lock timeouts in a
//!   row is not written: the attempt is recorded as failed (retryable,
//!   class `contention`, the reason naming the held lock), so the request
//!   runs its respond stage again after the retry delay, and past
//!   `max_attempts` ends `FAILED` with that reason — bounded, never
//!   waiting for the other transaction forever.
//! - A result that carries a fused respond stage (`Engine::respond_early`)
//!   drops it at the first lock timeout: its analysis and context are
//!   written without the answer, and the respond stage runs on its own (a
//!   second model call for that request), under the rule above.
//! - A heartbeat stopped by a lock renews the leases one by one
//!   ([`Engine::renew_apart`]): every lease whose row is not held elsewhere
//!   is renewed, and a lease whose own renewal fails is not taken for lost.

use std::collections::HashSet;
use std::sync::Arc;

use futures_util::StreamExt;
use uuid::Uuid;

use super::Engine;
use super::policy::{ClaimFacts, StageOutcome, decide};
use crate::db;
use crate::error::Disposition;
use crate::model::Outcome;
use crate::repo::{self, Finished, Unsuccessful};

/// Lock timeouts in a row after which an answer is no longer logged.
pub(super) const LOG_TRIES: u32 = 3;

/// A held lease: request id and fencing token.
type Held = (Uuid, i64);
/// What one lease's own renewal statement returned.
type Renewal = Result<Vec<Uuid>, db::Error>;

/// Single-lease renewals at once after a contended heartbeat.
const RENEWERS: usize = 4;

impl Engine {
    /// Renews each of `held` by its own statement: returns the renewed ids,
    /// and the ids whose statement failed (neither renewed nor known lost).
    pub(super) async fn renew_apart(self: &Arc<Self>, held: &[(Uuid, i64)]) -> (Vec<Uuid>, HashSet<Uuid>) {
        let lease = self.cfg.lease();
        let results: Vec<(Held, Renewal)> = futures_util::stream::iter(held.iter().copied())
            .map(|one| async move {
                let res = match self.pool.get().await {
                    Ok(client) => repo::extend_leases(&client, &[one], lease).await,
                    Err(e) => Err(e.into()),
                };
                (one, res)
            })
            .buffer_unordered(RENEWERS)
            .collect()
            .await;
        let mut renewed = Vec::new();
        let mut unknown = HashSet::new();
        for ((id, _), res) in results {
            match res {
                Ok(ids) => renewed.extend(ids),
                Err(e) => {
                    tracing::warn!(request.id = %id, error = %e, "lease not renewed: its row is held elsewhere");
                    unknown.insert(id);
                }
            }
        }
        (renewed, unknown)
    }
}

/// True when `e` means a lock held elsewhere stopped the statement: lock
/// timeout (55P03), deadlock (40P01), or a statement timeout (57014) that a
/// lock wait may have caused.
pub(super) fn contended(e: &db::Error) -> bool {
    let code = match e {
        db::Error::Postgres(e) => e.code(),
        db::Error::Pool(deadpool_postgres::PoolError::Backend(e)) => e.code(),
        _ => None,
    };
    code.is_some_and(|c| matches!(c.code(), "55P03" | "40P01" | "57014"))
}

/// Turns `f`, an answer whose log stayed locked, into a failed attempt
/// (see the module docs).
pub(super) fn give_up_logging(engine: &Engine, f: &mut Finished, e: &db::Error) {
    let attempts = u32::try_from(f.attempt).unwrap_or(u32::MAX);
    let claim = ClaimFacts {
        attempt: attempts,
        jitter: crate::backoff::jitter(),
    };
    let retry = Disposition::Retry {
        after: None,
        max_attempts: None,
    };
    let decision = decide(f.stage, &claim, &StageOutcome::Failed(retry), &engine.policy);
    let (outcome, delay) = (decision.outcome(), decision.delay());
    let why = format!(
        "the answer could not be logged: the user's turns stayed locked by another transaction \
         ({LOG_TRIES} lock timeouts of {} ms; {e})",
        engine.cfg.db.lock_timeout_ms
    );
    let error_message = match outcome {
        Outcome::Failed => format!("{} failed after {attempts} attempts (contention): {why}", f.stage),
        _ => format!(
            "{} attempt {attempts} failed (contention): {why}; retrying in {} ms",
            f.stage,
            delay.as_millis()
        ),
    };
    f.fail_instead(Unsuccessful {
        outcome,
        new_status: decision.status(),
        delay,
        error_class: "contention".into(),
        error_message,
    });
    tracing::warn!(request.id = %f.id, stage = %f.stage, attempt = attempts, outcome = outcome.as_str(),
        "answer not logged: the user's turns stayed locked by another transaction");
}

/// Drops the respond stage fused into `f`, if any (see the module docs).
pub(super) fn unfuse_respond(f: &mut Finished) {
    if f.drop_fused_respond() {
        tracing::warn!(request.id = %f.id,
            "the fused answer's log is locked by another transaction; the respond stage runs on its own");
    }
}

/// True when writing `f` inserts a turn (the answer), which locks its
/// user's `archive_marks` row.
pub(super) fn logs_a_turn(f: &Finished) -> bool {
    f.answer().is_some()
}

/// The parts a contended batch is written in (see the module docs); each
/// part keeps the batch's order. `batch` has at least two results.
pub(super) fn split(batch: Vec<Finished>) -> Vec<Vec<Finished>> {
    let (logging, rest): (Vec<Finished>, Vec<Finished>) = batch.into_iter().partition(logs_a_turn);
    if !logging.is_empty() && !rest.is_empty() {
        return vec![rest, logging];
    }
    let mut all = if logging.is_empty() { rest } else { logging };
    if all.first().is_some_and(logs_a_turn) {
        return all.into_iter().map(|f| vec![f]).collect();
    }
    let tail = all.split_off(all.len() / 2);
    vec![all, tail]
}
