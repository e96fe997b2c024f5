//! Database access: the pool, the migration runner and a private cluster
//! for development and tests.

pub mod devdb;
pub mod failover;
pub mod migrate;
pub mod pool;
pub mod tls;

pub use pool::{Pool, connect_pool, pg_config};

/// A database failure, classified for the caller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("database pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("migration: {0}")]
    Migration(String),
    #[error("database setup: {0}")]
    Setup(String),
    /// The database answered with something this program cannot use.
    #[error("database: unexpected result: {0}")]
    Unexpected(String),
}

impl Error {
    /// Lost or unreachable connection: reconnect with backoff and try again.
    pub fn is_connection(&self) -> bool {
        match self {
            Error::Postgres(e) => is_connection_error(e),
            Error::Pool(deadpool_postgres::PoolError::Backend(e)) => is_connection_error(e),
            Error::Pool(_) => true,
            Error::Migration(_) | Error::Setup(_) | Error::Unexpected(_) => false,
        }
    }
}

/// True when the error means the session is gone (closed socket, server
/// shutdown or `pg_terminate_backend`, connection refused) rather than a
/// problem with the statement.
pub fn is_connection_error(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            let c = code.code();
            // Class 08: connection exception; 57P01..57P03: admin shutdown,
            // crash shutdown, cannot connect now; 25006: the server no
            // longer takes writes (see `failover`).
            c.starts_with("08") || c == "57P01" || c == "57P02" || c == "57P03" || failover::is_read_only(c)
        }
        // No SQLSTATE: an I/O or protocol error on the socket.
        None => true,
    }
}
