//! `maasctl mcp --user U`: the MCP server over stdin and stdout, for a
//! desktop client on this machine (it starts `maasctl mcp` itself).
//!
//! A local trust, like every `maasctl` command: it runs with the CLI's
//! database rights (the configured `database_url`), as the default
//! tenant's administrator, for the one user `--user` names (of `--tenant`,
//! by default the default tenant): the tools need no user id and refuse
//! another. No token is asked for; whoever can run it can read that
//! database anyway. Logs go to stderr (with `RUST_LOG`), never stdout.
//! `ask` needs a running `maasd` on the same database to answer.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{CliError, Outcome};
use crate::app::{App, MemoryServices, Principal};
use crate::config::Config;
use crate::db;
use crate::listener::{Event, ListenerHandler, Notifier};
use crate::metrics::Stats;

/// Connections of the stdio server's pool.
const POOL: usize = 4;

/// Follows notifications for the live hub only (`ask` waits on it).
struct Quiet;

impl ListenerHandler for Quiet {
    fn connected(&self, _reconnect: bool) {}
    fn disconnected(&self, reason: &str) {
        tracing::warn!(reason, "mcp: notifications lost; reconnecting");
    }
    fn event(&self, _event: &Event) {}
}

/// Serves the MCP server over stdio for `user` of tenant `tenant` until
/// the client closes stdin or an interrupt.
pub async fn run(cfg: &Config, user: Uuid, tenant: &str) -> Result<Outcome, CliError> {
    let cfg = Arc::new(Config {
        pool_size: POOL,
        ..cfg.clone()
    });
    let pool = db::connect_pool(&cfg, "maasctl-mcp")?;
    let found = {
        let client = pool.get().await.map_err(db::Error::from)?;
        let all = crate::repo::tenants::list(&client).await?;
        all.into_iter()
            .find(|t| t.name == tenant)
            .ok_or_else(|| CliError::Usage(format!("no tenant {tenant:?} (maasctl tenants list)")))?
    };
    // The tenant's limits hold over stdio too (as of the start).
    let who = Principal {
        tenant: found.id,
        tenant_name: Arc::from(tenant),
        user: Some(user),
        limited: found.requests_per_minute.is_some() || found.max_in_flight.is_some(),
        ..Principal::default_admin("stdio")
    };
    let shutdown = CancellationToken::new();
    let stats = Arc::new(Stats::default());
    let notifier = Notifier::new(stats.clone());
    let listening = tokio::spawn(crate::listener::run(
        cfg.clone(),
        notifier.clone(),
        Arc::new(Quiet),
        shutdown.clone(),
    ));
    let llm = Arc::new(crate::llm::Llm::from_config(&cfg.llm, &cfg.llm_provider)?);
    let memory = MemoryServices {
        embedder: crate::llm::embed::configured(&cfg.llm).map_err(|e| CliError::Usage(format!("embeddings: {e}")))?,
        archivist: Arc::new(crate::archivist::Archivist::new(
            pool.clone(),
            llm,
            cfg.clone(),
            "maasctl-mcp".to_owned(),
        )),
    };
    let (app, hub) = App::new(cfg.clone(), pool, notifier, memory, shutdown.clone());
    let stop = shutdown.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.cancel();
        }
    });
    let served = crate::mcp::serve_stdio(crate::mcp::Server::local(app, who), shutdown.clone()).await;
    shutdown.cancel();
    let _ = listening.await;
    hub.wait().await;
    served?;
    Ok(Outcome::Ok)
}
