//! The connection pools (deadpool-postgres): the engine's (claims,
//! completions, heartbeats, the sweep, services) and the HTTP API's, built
//! apart so HTTP traffic never takes the engine's connections. The LISTEN
//! session is never taken from a pool: see `listener`.
//!
//! Every session made by [`connect_pool`] (and the listener) runs under the
//! `[db]` timeouts (`statement_timeout`, `lock_timeout`,
//! `idle_in_transaction_session_timeout`), set as startup options, so a lock
//! held by another transaction fails a statement after `db.lock_timeout_ms`
//! instead of holding it forever. Options given in the connection string
//! come after ours and win. With `db.pooler = "transaction"` the pools send
//! no options (PgBouncer refuses them): the role's settings hold instead.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Runtime};

use crate::config::{Config, DbConfig};

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

/// Sets the session timeouts of `limits` on `pg`, before any options the
/// connection string already carries (those win).
pub fn with_limits(pg: &mut tokio_postgres::Config, limits: &DbConfig) {
    let ours = limits.session_options();
    let options = match pg.get_options() {
        Some(given) if !given.trim().is_empty() => format!("{ours} {given}"),
        _ => ours,
    };
    pg.options(&options);
}

/// Set for the whole process once a pool for a transaction-mode pooler is
/// built (`db.pooler = "transaction"`; one configuration per process).
static UNNAMED_STATEMENTS: AtomicBool = AtomicBool::new(false);

/// True when statements must leave nothing on a server connection: no
/// prepared statement kept across round trips (`repo` then sends each as
/// the unnamed statement). A prepared statement cached per connection,
/// whose plan PostgreSQL caches too, is what every other setup uses.
pub fn unnamed_statements() -> bool {
    UNNAMED_STATEMENTS.load(Ordering::Relaxed)
}

/// Builds the engine's pool (`pool_size`). Connections are made lazily; a
/// dead one is replaced.
pub fn connect_pool(cfg: &Config, application_name: &str) -> Result<Pool, super::Error> {
    sized_pool(cfg, application_name, cfg.pool_size)
}

/// Builds the HTTP API's pool (`db.api_pool_size`).
pub fn connect_api_pool(cfg: &Config, application_name: &str) -> Result<Pool, super::Error> {
    sized_pool(cfg, application_name, cfg.db.api_pool_size)
}

fn sized_pool(cfg: &Config, application_name: &str, size: usize) -> Result<Pool, super::Error> {
    let mut pg = pg_config(cfg.database_url.expose(), application_name)?;
    if cfg.db.through_pooler() {
        UNNAMED_STATEMENTS.store(true, Ordering::Relaxed);
    } else {
        with_limits(&mut pg, &cfg.db);
    }
    let recycling_method = super::failover::recycling(&pg);
    let mgr = Manager::from_config(
        pg,
        super::tls::connector(cfg.database_url.expose())?,
        ManagerConfig { recycling_method },
    );
    Pool::builder(mgr)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(Duration::from_secs(10)))
        .build()
        .map_err(|e| super::Error::Setup(format!("cannot build the connection pool: {e}")))
}
