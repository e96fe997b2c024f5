//! The schedule: the archivist inside `maasd`, on a 6-field UTC cron
//! expression.
//!
//! Guarantees: a tick runs at most once cluster-wide (a forward-only row per
//! tick in `archive_schedule`, claimed by one daemon) and never overlaps a
//! run still going, in this process (a local lock) or in another daemon (a
//! lease row, `archive_schedule.run_owner`, renewed while the run goes: no
//! session state, so it holds through a transaction-mode pooler); a run
//! whose lease cannot be renewed stops between batches; a tick every daemon
//! missed is run once at start; shutdown waits for a run in progress, which
//! stops between batches.
//!
//! A newcomer's first run does not wait for the next tick: every
//! `first_run_poll_secs` (default a minute) the daemon archives the users never archived who have
//! crossed the novelty threshold (`archive_newcomers.sql`), one run per
//! user (the per-user lease keeps two daemons from archiving the same one).
//!
//! [`eligibility`] says when the schedule will take one user: the rule of
//! `archive_candidates.sql` applied to the user's mark, for the console.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Duration as Span, Utc};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{Archivist, ArchivistError, Quiet, RunOptions, Trigger};
use crate::config::{ArchivistConfig, cron_schedule};
use crate::repo;
use crate::repo::archive::MarkView;

/// The row of `archive_schedule` the daemons share.
pub const SCHEDULE_NAME: &str = "archivist";

/// How long a scheduled run's lease lasts unrenewed.
pub const RUN_LEASE: Duration = Duration::from_secs(30);

/// Runs the archivist on `cfg.archivist.schedule` (UTC) until `shutdown`,
/// then waits for a run in progress to stop (it stops between batches and
/// abandons an open batch, whose lease runs out).
///
/// - Overlap: a tick that fires while this process's previous run is still
///   going is skipped; across daemons, a run holds the schedule's run lease
///   (renewed every third of `RUN_LEASE`), so a tick that finds another
///   daemon's run going is skipped too. A daemon that dies mid-run leaves a
///   lease that runs out after `RUN_LEASE`.
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
    archivist.first_runs(&busy, &shutdown).await;
    if let Err(e) = scheduler.shutdown().await {
        tracing::warn!(error = %e, "archivist scheduler did not stop cleanly");
    }
    // A run in progress sees the cancellation; wait for it.
    let _guard = busy.lock().await;
    Ok(())
}

impl Archivist {
    /// Until `shutdown`: every `first_run_poll_secs` (never when 0), the
    /// first run of each newcomer due for one, unless a scheduled run is
    /// going (`busy`).
    async fn first_runs(&self, busy: &tokio::sync::Mutex<()>, shutdown: &CancellationToken) {
        let every = self.acfg().first_run_poll_secs;
        if every == 0 {
            return shutdown.cancelled().await;
        }
        loop {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(every)) => {}
                () = shutdown.cancelled() => return,
            }
            let Ok(_guard) = busy.try_lock() else { continue };
            let newcomers = match self.pool.get().await {
                Ok(client) => repo::archive::select_newcomers(&client, self.acfg().min_pending, self.acfg().page_users)
                    .await
                    .map_err(ArchivistError::from),
                Err(e) => Err(e.into()),
            };
            let users = match newcomers {
                Ok(users) => users,
                Err(e) => {
                    tracing::warn!(error = %e, "looking for newcomers to archive failed");
                    continue;
                }
            };
            for c in users {
                let opts = RunOptions {
                    trigger: Trigger::Cron,
                    user: Some(c.user_id),
                    dry_run: false,
                    tick: None,
                };
                if let Err(e) = self.run(opts, &Quiet, shutdown).await {
                    tracing::warn!(user = %c.user_id, error = %e, "a newcomer's first archive run failed");
                }
            }
        }
    }

    /// One scheduled tick: the cluster-wide run lease, the tick claim, the run.
    async fn tick(&self, tick: DateTime<Utc>, shutdown: &CancellationToken) {
        let owner = format!("{} {}", self.worker(), uuid::Uuid::new_v4().simple());
        let result = async {
            let client = self.pool.get().await?;
            if !repo::archive::lease_runs(&client, SCHEDULE_NAME, &owner, RUN_LEASE).await? {
                tracing::info!(%tick, "archivist tick skipped: another daemon's run is still going");
                return Ok(());
            }
            let claimed = repo::archive::claim_tick(&client, SCHEDULE_NAME, tick).await;
            drop(client);
            let run = match claimed {
                Ok(true) => {
                    let opts = RunOptions {
                        trigger: Trigger::Cron,
                        user: None,
                        dry_run: false,
                        tick: Some(tick),
                    };
                    // The run stops between batches when the lease is lost.
                    let stop = shutdown.child_token();
                    let renew = self.renew_lease(&owner, &stop);
                    let run = self.run(opts, &Quiet, &stop);
                    tokio::pin!(run);
                    tokio::select! {
                        r = &mut run => r.map(drop),
                        () = renew => run.await.map(drop),
                    }
                }
                Ok(false) => {
                    tracing::debug!(%tick, "archivist tick already run by another daemon");
                    Ok(())
                }
                Err(e) => Err(e.into()),
            };
            let client = self.pool.get().await?;
            repo::archive::release_runs(&client, SCHEDULE_NAME, &owner).await?;
            run
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(%tick, error = %e, "scheduled archive run failed");
        }
    }

    /// Renews `owner`'s run lease every third of [`RUN_LEASE`]; returns (after
    /// cancelling `stop`) when the lease is lost or cannot be renewed before
    /// it runs out. Never returns otherwise.
    async fn renew_lease(&self, owner: &str, stop: &CancellationToken) {
        let mut renewed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(RUN_LEASE / 3).await;
            let held = match self.pool.get().await {
                Ok(client) => repo::archive::lease_runs(&client, SCHEDULE_NAME, owner, RUN_LEASE).await,
                Err(e) => Err(e.into()),
            };
            match held {
                Ok(true) => renewed = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::warn!("archive run stopping: its lease was taken over by another daemon");
                    break;
                }
                Err(e) if renewed.elapsed() + RUN_LEASE / 3 >= RUN_LEASE => {
                    tracing::warn!(error = %e, "archive run stopping: its lease could not be renewed");
                    break;
                }
                Err(e) => tracing::warn!(error = %e, "archive run lease not renewed; trying again"),
            }
        }
        stop.cancel();
    }
}

/// When the schedule will next take a user, from its archive mark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Eligibility {
    /// `nothing_pending`, `inactive`, `eligible` or `waiting`.
    pub state: &'static str,
    /// From when the user is a candidate (`eligible`: now; `waiting`: later).
    pub from: Option<DateTime<Utc>>,
    /// The first scheduled run at or after `from` (none with the schedule off).
    pub next_run: Option<DateTime<Utc>>,
    /// What holds it back, in words.
    pub why: String,
}

/// The candidate rule of `archive_candidates.sql` (the statement the
/// schedule selects users with) applied to one mark at `now`, to say when:
/// something pending, active within A, at least N pending or the oldest
/// older than T, out of the cooldown, not backing off, not leased.
pub fn eligibility(m: &MarkView, a: &ArchivistConfig, now: DateTime<Utc>) -> Eligibility {
    let secs = |s: u64| Span::seconds(i64::try_from(s).unwrap_or(i64::MAX / 1000));
    let none = |state, why: String| Eligibility {
        state,
        from: None,
        next_run: None,
        why,
    };
    if m.pending <= 0 {
        return none("nothing_pending", "no turn is waiting".into());
    }
    let active_until = m.last_active_at.map(|t| t + secs(a.active_within_secs));
    if active_until.is_none_or(|t| t < now) {
        return none(
            "inactive",
            format!(
                "not active within active_within_secs = {} s; the next turn (or archive now) takes it",
                a.active_within_secs
            ),
        );
    }
    let (from, why) = due_from(m, a, now);
    if active_until.is_some_and(|t| t < from) {
        return none(
            "inactive",
            format!(
                "inactive (active_within_secs = {} s) before it would be due: {}",
                a.active_within_secs,
                why.join("; ")
            ),
        );
    }
    let next_run = a
        .enabled
        .then(|| cron_schedule(&a.schedule).ok())
        .flatten()
        .and_then(|c| c.find_next_occurrence(&from.max(now), true).ok());
    Eligibility {
        state: if from > now { "waiting" } else { "eligible" },
        from: Some(from),
        next_run,
        why: if why.is_empty() { "due".into() } else { why.join("; ") },
    }
}

/// The latest of the times that hold an active user with pending turns
/// back (not enough pending yet, the cooldown, a backoff, another runner's
/// lease), and what each is; `now` and nothing when none does.
fn due_from(m: &MarkView, a: &ArchivistConfig, now: DateTime<Utc>) -> (DateTime<Utc>, Vec<String>) {
    let secs = |s: u64| Span::seconds(i64::try_from(s).unwrap_or(i64::MAX / 1000));
    let young = u64::try_from(m.pending).unwrap_or(0) < a.min_pending;
    let holds = [
        (
            m.pending_since
                .map(|t| t + secs(a.max_pending_age_secs))
                .filter(|_| young),
            format!(
                "{} pending < min_pending {} until the oldest is max_pending_age_secs = {} s old",
                m.pending, a.min_pending, a.max_pending_age_secs
            ),
        ),
        (
            m.last_archived_at.map(|t| t + secs(a.cooldown_secs)),
            format!("cooldown_secs = {} s after the last archive", a.cooldown_secs),
        ),
        (m.retry_after, format!("backing off after {} failures", m.failures)),
        (
            m.lease_expires_at,
            format!("leased to {}", m.lease_owner.as_deref().unwrap_or("?")),
        ),
    ];
    let mut from = now;
    let mut why = Vec::new();
    for (until, what) in holds {
        if let Some(t) = until.filter(|t| *t > from) {
            from = t;
            why.push(what);
        }
    }
    (from, why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn mark(pending: i64) -> MarkView {
        let now = Utc::now();
        MarkView {
            user_id: Uuid::nil(),
            logged_seq: pending,
            archived_seq: 0,
            pending,
            pending_since: Some(now - Span::seconds(10)),
            last_active_at: Some(now - Span::seconds(5)),
            last_archived_at: None,
            memory_version: 0,
            lease_owner: None,
            lease_expires_at: None,
            failures: 0,
            retry_after: None,
            last_error: None,
        }
    }

    fn cfg() -> ArchivistConfig {
        ArchivistConfig {
            min_pending: 20,
            max_pending_age_secs: 3600,
            active_within_secs: 86_400,
            cooldown_secs: 600,
            ..ArchivistConfig::default()
        }
    }

    #[test]
    fn few_young_turns_wait_for_the_age_threshold() {
        let now = Utc::now();
        let m = mark(3);
        let e = eligibility(&m, &cfg(), now);
        assert_eq!(e.state, "waiting");
        assert_eq!(e.from, m.pending_since.map(|t| t + Span::seconds(3600)));
        assert!(e.why.contains("min_pending"), "{}", e.why);
    }

    #[test]
    fn enough_turns_are_due_now_unless_in_cooldown() {
        let now = Utc::now();
        let mut m = mark(25);
        assert_eq!(eligibility(&m, &cfg(), now).state, "eligible");
        m.last_archived_at = Some(now - Span::seconds(60));
        let e = eligibility(&m, &cfg(), now);
        assert_eq!(e.state, "waiting");
        assert!(e.why.contains("cooldown"), "{}", e.why);
    }

    #[test]
    fn nothing_pending_or_inactive_is_never_due() {
        let now = Utc::now();
        assert_eq!(eligibility(&mark(0), &cfg(), now).state, "nothing_pending");
        let mut m = mark(25);
        m.last_active_at = Some(now - Span::days(2));
        assert_eq!(eligibility(&m, &cfg(), now).state, "inactive");
    }
}
