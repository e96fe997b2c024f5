//! `maasd`: configuration → HTTP bind → migrations → engine and HTTP
//! server, until a signal. Beside the engine run the callback delivery worker
//! ([`crate::callbacks`]) and the retention pass ([`crate::retention`]); both
//! stop with the engine.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::archivist::{self, Archivist};
use crate::config::Config;
use crate::db::{self, migrate};
use crate::dispatcher::Engine;
use crate::llm::Llm;
use crate::stage::{LlmPipeline, Pipeline};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Db(#[from] db::Error),
    #[error("LLM configuration: {0}")]
    Llm(#[from] crate::llm::ConfigError),
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
}

/// A name for this process in leases and step history: host, pid and a
/// random suffix, so a restarted process never reuses an old identity.
pub fn worker_id() -> String {
    // gethostname(2), not /proc/sys: systemd's ProcSubset=pid hides the latter.
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    let suffix: u32 = rand::random();
    format!("{host}:{}:{:08x}", std::process::id(), suffix)
}

/// Applies pending migrations (and missing triggers) under the advisory lock.
pub async fn migrate_at_start(cfg: &Config) -> Result<migrate::Report, db::Error> {
    let pg = db::pg_config(cfg.database_url.expose(), "maasd-migrate")?;
    let (mut client, conn) = pg.connect(tokio_postgres::NoTls).await?;
    let driver = tokio::spawn(conn);
    let report = migrate::migrate(&mut client, false).await;
    drop(client);
    let _ = driver.await;
    report
}

/// Builds the pipeline: the providers of each role from `[llm]`, falling
/// back to `llm_provider` (`MAAS_LLM_PROVIDER`).
pub fn pipeline(cfg: &Config) -> Result<Arc<dyn Pipeline>, DaemonError> {
    let llm = Llm::from_config(&cfg.llm, &cfg.llm_provider)?;
    for role in crate::llm::Role::ALL {
        tracing::info!(
            role = role.as_str(),
            provider = llm.provider_name(role),
            model = llm.model(role),
            "llm role"
        );
    }
    Ok(Arc::new(LlmPipeline::new(llm, cfg.context_max_tokens)))
}

/// Runs the daemon until `shutdown`; `ready` is called once migrated and
/// the engine is started.
pub async fn run(
    cfg: Config,
    shutdown: CancellationToken,
    ready: impl FnOnce(&Arc<Engine>),
) -> Result<(), DaemonError> {
    let cfg = Arc::new(cfg);
    let pipeline = pipeline(&cfg)?;
    // Bind first: a taken port or a refused address stops us before we
    // touch the database.
    let bound = crate::http::bind(&cfg).await?;
    let report = migrate_at_start(&cfg).await?;
    if !report.applied.is_empty() || !report.triggers.is_empty() {
        tracing::info!(applied = ?report.applied, triggers = ?report.triggers, "schema updated");
    }
    let pool = db::connect_pool(&cfg, "maasd")?;
    let worker = worker_id();
    tracing::info!(worker = %worker, provider = %cfg.llm_provider, lease_secs = cfg.lease_secs,
        sweep_secs = cfg.sweep_secs, "maasd starting");
    let archivist = if cfg.archivist.enabled {
        // A pool of its own, so archiving never takes connections from the
        // stages: one per concurrent user, the run's own, the schedule lock.
        let sized = Config {
            pool_size: cfg.archivist.concurrency + 2,
            ..(*cfg).clone()
        };
        let pool = db::connect_pool(&sized, "maasd-archivist")?;
        let llm = Arc::new(Llm::from_config(&cfg.llm, &cfg.llm_provider)?);
        let archivist = Arc::new(Archivist::new(pool, llm, cfg.clone(), worker.clone()));
        Some(tokio::spawn(archivist::run_scheduled(
            archivist,
            shutdown.child_token(),
        )))
    } else {
        None
    };
    let engine = Engine::new(pool.clone(), cfg.clone(), pipeline, worker);
    let server = crate::http::start(bound, cfg.clone(), engine.clone(), shutdown.clone())?;
    let workers = TaskTracker::new();
    workers.spawn(crate::callbacks::run(
        pool.clone(),
        cfg.clone(),
        engine.subscribe(),
        shutdown.clone(),
    ));
    workers.spawn(crate::retention::run(pool, cfg.clone(), shutdown.clone()));
    workers.close();
    ready(&engine);
    engine.run(shutdown).await;
    server.stop(cfg.grace()).await;
    workers.wait().await;
    if let Some(task) = archivist {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "archivist schedule stopped"),
            Err(e) => tracing::error!(error = %e, "archivist schedule panicked"),
        }
    }
    Ok(())
}
