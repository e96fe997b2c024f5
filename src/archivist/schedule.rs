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

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::{Archivist, ArchivistError, Quiet, RunOptions, Trigger};
use crate::config::cron_schedule;
use crate::repo;

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
    shutdown.cancelled().await;
    if let Err(e) = scheduler.shutdown().await {
        tracing::warn!(error = %e, "archivist scheduler did not stop cleanly");
    }
    // A run in progress sees the cancellation; wait for it.
    let _guard = busy.lock().await;
    Ok(())
}

impl Archivist {
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
