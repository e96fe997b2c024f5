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
use crate::llm::{Llm, Role};
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
/// folder. (Where the default model is missing, the start says so.)
pub fn embedder(cfg: &Config) -> Result<Option<crate::llm::embed::Embedder>, DaemonError> {
    let embedder = crate::llm::embed::configured(&cfg.llm)?;
    if let Some(e) = &embedder {
        tracing::debug!(provider = e.provider_name(), model = e.model(), "embeddings on");
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
    // The migrations' notices ("… does not exist, skipping") at DEBUG.
    let driver = tokio::spawn(db::session::drive(conn));
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

/// Logs what a start's migration run did: a line when it changed the
/// schema, the files' names at DEBUG.
fn schema_updated(report: &migrate::Report) {
    if report.applied.is_empty() && report.triggers.is_empty() {
        return;
    }
    tracing::info!(
        "schema updated to version {}: {} migrations and {} trigger files applied",
        report.current_version,
        report.applied.len(),
        report.triggers.len()
    );
    tracing::debug!(applied = ?report.applied, triggers = ?report.triggers, "schema updated");
}

/// Builds the pipeline: the providers of each role from `[llm]`, falling
/// back to `llm_provider` (`MAAS_LLM_PROVIDER`). Also returns what runs,
/// for the start's lines ([`providers`]).
pub fn pipeline(cfg: &Config) -> Result<(Arc<dyn Pipeline>, String), DaemonError> {
    let llm = Llm::from_config(&cfg.llm, &cfg.llm_provider)?;
    for role in Role::ALL {
        tracing::debug!(
            role = role.as_str(),
            provider = llm.provider_name(role),
            model = llm.model(role),
            "llm role"
        );
    }
    let shown = providers(&Role::ALL.map(|r| (r.as_str(), llm.provider_name(r), llm.model(r))));
    let pipeline = LlmPipeline::new(llm, cfg.context_max_tokens).with_memory(cfg.memory.clone());
    Ok((Arc::new(pipeline), shown))
}

/// The LLM providers of `roles` (role, provider, model) for people:
/// `offline` or `openai gpt-4o-mini` when every role has the same,
/// otherwise each role's.
pub fn providers(roles: &[(&str, &str, &str)]) -> String {
    let one = |provider: &str, model: &str| {
        if model == provider {
            provider.to_owned()
        } else {
            format!("{provider} {model}")
        }
    };
    match roles {
        [(_, provider, model), rest @ ..] if rest.iter().all(|r| (r.1, r.2) == (*provider, *model)) => {
            format!("{} for every role", one(provider, model))
        }
        _ => roles
            .iter()
            .map(|(role, provider, model)| format!("{role} {}", one(provider, model)))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// What the memory search runs on, for people.
pub fn memory_search(embedder: Option<&crate::llm::embed::Embedder>) -> String {
    match embedder {
        Some(e) => format!("full text and semantic, model {} ({})", e.model(), e.provider_name()),
        None => "full text alone".to_owned(),
    }
}

/// Says what runs and where, first in the log: the database (never its
/// password), the HTTP address and the console, the LLM providers, the
/// memory search (and why it is full text alone where the default model
/// is missing).
fn started(cfg: &Config, http: &str, providers: &str, embedder: Option<&crate::llm::embed::Embedder>) {
    tracing::info!(
        "maasd {} starting: database {}",
        env!("CARGO_PKG_VERSION"),
        db::session::shown(cfg.database_url.expose())
    );
    tracing::info!("HTTP API on {http}, console {http}/console");
    tracing::info!("LLM provider: {providers}");
    tracing::info!("memory search: {}", memory_search(embedder));
    if let Some(note) = cfg.llm.embedding.fallback_note(&|name| std::env::var(name).ok()) {
        tracing::warn!("{note}");
    }
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
    let (pipeline, providers) = pipeline(&cfg)?;
    let embedder = embedder(&cfg)?;
    // Bind first: a taken port or a refused address stops us before we
    // touch the database.
    let bound = crate::http::bind(&cfg).await?;
    started(&cfg, &bound.url(), &providers, embedder.as_ref());
    schema_updated(&migrate_at_start(&cfg).await?);
    let pool = db::connect_pool(&cfg, "maasd")?;
    let worker = crate::sys::worker_id();
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
    let (app, hub) = crate::app::App::new(
        cfg.clone(),
        api_pool,
        notifier.clone(),
        crate::app::MemoryServices {
            embedder: embedder.clone(),
            archivist: archivist.clone(),
        },
        shutdown.clone(),
    );
    let mcp = crate::mcp::http::router(&app);
    let server = crate::http::start(bound, crate::http::state(app, stats.clone())?, mcp);
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
    let _ = tokio::time::timeout(cfg.grace(), hub.wait()).await;
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

#[cfg(test)]
mod tests {
    use super::providers;

    #[test]
    fn the_providers_are_said_once_when_every_role_has_the_same() {
        let offline = [("analyzer", "offline", "offline"); 3];
        assert_eq!(providers(&offline), "offline for every role");
        let openai = [("analyzer", "openai", "gpt-4o-mini"); 3];
        assert_eq!(providers(&openai), "openai gpt-4o-mini for every role");
        let mixed = [
            ("analyzer", "openai", "gpt-4o-mini"),
            ("responder", "anthropic", "claude-sonnet"),
            ("archivist", "offline", "offline"),
        ];
        assert_eq!(
            providers(&mixed),
            "analyzer openai gpt-4o-mini, responder anthropic claude-sonnet, archivist offline"
        );
    }
}
