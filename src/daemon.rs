//! `maasd`: configuration → HTTP bind → migrations → engine, HTTP server
//! and background services, until a signal.
//!
//! - Every background job is a [`Service`] started from one list in
//!   [`run`]: the sweep, callback delivery, retention, idempotency key
//!   expiry, the metrics refresh and (when enabled) the archivist schedule.
//! - Everything that follows notifications subscribes to the one
//!   [`Notifier`] before the engine (and with it the LISTEN session) starts,
//!   so no subscriber misses the first events.
//! - [`run`] returns only after the engine wrote every result, the server
//!   drained (at most the grace period) and every service stopped.

use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::archivist::{self, Archivist};
use crate::callbacks::Callbacks;
use crate::config::Config;
use crate::db::{self, migrate};
use crate::dispatcher::{Engine, Sweep};
use crate::http::housekeeping::{IdempotencyExpiry, MetricsRefresh};
use crate::listener::Notifier;
use crate::llm::Llm;
use crate::metrics::Stats;
use crate::retention::Retention;
use crate::service::{self, Service};
use crate::stage::{LlmPipeline, Pipeline};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Db(#[from] db::Error),
    #[error("LLM configuration: {0}")]
    Llm(#[from] crate::llm::ConfigError),
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
    #[error("embeddings: {0}")]
    Embed(#[from] crate::llm::embed::SetupError),
}

/// The embedder of `[llm.embedding]`, or `None` when embeddings are off. A
/// local model is loaded here: a missing one stops the start, naming its
/// folder.
pub fn embedder(cfg: &Config) -> Result<Option<crate::llm::embed::Embedder>, DaemonError> {
    let embedder = crate::llm::embed::configured(&cfg.llm)?;
    if let Some(note) = cfg.llm.embedding.fallback_note(&|name| std::env::var(name).ok()) {
        tracing::warn!("{note}");
    }
    if let Some(e) = &embedder {
        tracing::info!(provider = e.provider_name(), model = e.model(), "embeddings on");
    }
    Ok(embedder)
}

/// Applies pending migrations (and missing triggers) under the advisory lock.
pub async fn migrate_at_start(cfg: &Config) -> Result<migrate::Report, db::Error> {
    let mut pg = db::pg_config(cfg.database_url.expose(), "maasd-migrate")?;
    if !cfg.db.through_pooler() {
        db::with_limits(&mut pg, &cfg.db.for_migrations());
    }
    let (mut client, conn) = pg.connect(db::tls::connector(cfg.database_url.expose())?).await?;
    let driver = tokio::spawn(conn);
    // A current schema needs no DDL, so a runtime role without CREATE
    // rights starts (migrations then run as the owner: `maasctl migrate`).
    let report = match migrate::state(&client).await {
        Ok(state) if state.is_current() => Ok(migrate::Report::default()),
        _ => migrate::migrate(&mut client, false).await,
    };
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
    Ok(Arc::new(
        LlmPipeline::new(llm, cfg.context_max_tokens).with_memory(cfg.memory.clone()),
    ))
}

/// The daemon's archivist, built once: its schedule (when enabled) and
/// "archive now" from the console share it. A pool of its own, so archiving
/// never takes connections from the stages: one per concurrent user, the
/// run's own, the schedule lock (connections open only when used).
pub fn archivist(cfg: &Arc<Config>, worker: String) -> Result<Arc<Archivist>, DaemonError> {
    let sized = Config {
        pool_size: cfg.archivist.concurrency + 2,
        ..(**cfg).clone()
    };
    let pool = db::connect_pool(&sized, "maasd-archivist")?;
    let llm = Arc::new(Llm::from_config(&cfg.llm, &cfg.llm_provider)?);
    Ok(Arc::new(Archivist::new(pool, llm, cfg.clone(), worker)))
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
    let embedder = embedder(&cfg)?;
    // Bind first: a taken port or a refused address stops us before we
    // touch the database.
    let bound = crate::http::bind(&cfg).await?;
    let report = migrate_at_start(&cfg).await?;
    if !report.applied.is_empty() || !report.triggers.is_empty() {
        tracing::info!(applied = ?report.applied, triggers = ?report.triggers, "schema updated");
    }
    let pool = db::connect_pool(&cfg, "maasd")?;
    let worker = crate::sys::worker_id();
    tracing::info!(worker = %worker, provider = %cfg.llm_provider, lease_secs = cfg.lease_secs,
        sweep_secs = cfg.sweep_secs, "maasd starting");
    let archivist = archivist(&cfg, worker.clone())?;
    let stats = Arc::new(Stats::default());
    let notifier = Notifier::new(stats.clone());
    let engine = Engine::new(
        pool.clone(),
        cfg.clone(),
        pipeline,
        worker,
        notifier.clone(),
        embedder.clone(),
    );
    // The API's own pool: HTTP traffic never takes the engine's connections.
    let api_pool = db::connect_api_pool(&cfg, "maasd-api")?;
    let server = crate::http::start(
        bound,
        cfg.clone(),
        api_pool,
        notifier.clone(),
        stats.clone(),
        crate::http::MemoryServices {
            embedder: embedder.clone(),
            archivist: archivist.clone(),
        },
        crate::mcp::http::router,
        shutdown.clone(),
    )?;
    let mut services: Vec<Arc<dyn Service>> = vec![
        Arc::new(Sweep::new(engine.clone())),
        Arc::new(Callbacks::new(pool.clone(), cfg.clone(), &notifier)),
        Arc::new(Retention::new(pool.clone(), cfg.clone())),
        Arc::new(IdempotencyExpiry::new(pool.clone(), cfg.clone())),
        Arc::new(crate::users::Eraser::new(
            pool.clone(),
            std::time::Duration::from_secs(60),
        )),
        Arc::new(MetricsRefresh::new(
            pool,
            cfg.clone(),
            stats,
            notifier,
            server.metrics(),
        )),
    ];
    if cfg.archivist.enabled {
        services.push(Arc::new(ArchivistSchedule(archivist)));
    }
    if let Some(embedder) = embedder {
        services.push(Arc::new(crate::embedder::EmbedderService::new(
            engine.pool().clone(),
            embedder,
        )));
    }
    let services = service::start(services, &shutdown);
    ready(&engine);
    engine.run(shutdown).await;
    crate::systemd::notify_stopping();
    server.stop(cfg.grace()).await;
    services.wait().await;
    Ok(())
}

/// The archivist's cron schedule ([`archivist::run_scheduled`]) as a service.
struct ArchivistSchedule(Arc<Archivist>);

impl Service for ArchivistSchedule {
    fn name(&self) -> &'static str {
        "archivist-schedule"
    }

    fn run(self: Arc<Self>, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        async move {
            if let Err(e) = archivist::run_scheduled(self.0.clone(), shutdown).await {
                tracing::error!(error = %e, "archivist schedule stopped");
            }
        }
        .boxed()
    }
}
