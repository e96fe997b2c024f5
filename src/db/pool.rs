//! The connection pool (deadpool-postgres) shared by claims, completions,
//! heartbeats, the sweep and the HTTP server. The LISTEN session is never
//! taken from it: see `listener`.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Runtime};

use crate::config::Config;

pub type Pool = deadpool_postgres::Pool;

/// A client configuration from the connection string, with timeouts and TCP
/// keepalives set (the keepalive default is two hours).
pub fn pg_config(url: &str, application_name: &str) -> Result<tokio_postgres::Config, tokio_postgres::Error> {
    // Without the TLS keys tokio-postgres does not know (see `tls`).
    let stripped = crate::config::pgtls::split(url).map(|(rest, _)| rest);
    let mut pg: tokio_postgres::Config = stripped.as_deref().unwrap_or(url).parse()?;
    if pg.get_application_name().is_none() {
        pg.application_name(application_name);
    }
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(Duration::from_secs(5));
    }
    pg.keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .keepalives_interval(Duration::from_secs(5))
        .keepalives_retries(3)
        .tcp_user_timeout(Duration::from_secs(30));
    Ok(pg)
}

/// Builds the pool. Connections are made lazily; a dead one is replaced.
pub fn connect_pool(cfg: &Config, application_name: &str) -> Result<Pool, super::Error> {
    let pg = pg_config(cfg.database_url.expose(), application_name)?;
    let recycling_method = super::failover::recycling(&pg);
    let mgr = Manager::from_config(
        pg,
        super::tls::connector(cfg.database_url.expose())?,
        ManagerConfig { recycling_method },
    );
    Pool::builder(mgr)
        .max_size(cfg.pool_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(Duration::from_secs(10)))
        .build()
        .map_err(|e| super::Error::Setup(format!("cannot build the connection pool: {e}")))
}
