//! The schedule: the archivist inside `maasd`, on a 6-field UTC cron
//! expression.
//!
//! Guarantees: a tick runs at most once cluster-wide (a forward-only row per
//! tick in `archive_schedule`, claimed by one daemon) and never overlaps a
//! run still going, in this process (a local lock) or in another daemon (a
//! session-level advisory lock); a tick every daemon missed is run once at
//! start; shutdown waits for a run in progress, which stops between
//! batches.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::{Archivist, ArchivistError, Quiet, RunOptions, Trigger};
use crate::config::cron_schedule;
use crate::repo;

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
