//! The `[db]` section: limits every daemon connection runs under, and the
//! split of connections between the engine and the HTTP API.
//!
//! Guarantees: plain data with its defaults; [`DbConfig::session_options`]
//! is the libpq `options` string that sets the three timeouts (and turns
//! JIT compilation off) at connect,
//! so they hold from a session's first statement, also after a reconnect.
//! With [`Pooler::Transaction`] it is not sent on `database_url` (PgBouncer
//! refuses the `options` startup parameter): the timeouts are then the
//! role's (`ALTER ROLE … SET statement_timeout = …`, docs/deploying.md, "Poolers").
//! Imports nothing of the crate.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[db]` in the file, `MAAS_DB__*` in the environment.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct DbConfig {
    /// Longest one statement of a daemon connection may run; 0 = no limit.
    /// Migrations are not bound by it. Default 30000.
    pub statement_timeout_ms: u64,
    /// Longest a statement waits for a row or table lock (another
    /// transaction holding one user's rows) before it fails with SQLSTATE
    /// 55P03; 0 = no limit. Migrations wait for each other regardless.
    /// Default 5000.
    pub lock_timeout_ms: u64,
    /// A daemon session idle inside an open transaction this long is ended
    /// by the server (its locks released); 0 = no limit. Default 60000.
    pub idle_in_transaction_timeout_ms: u64,
    /// Connections of the HTTP API's own pool (submit, status, streams'
    /// re-reads). The engine's claims, heartbeats and result writes use
    /// `pool_size` and never wait for HTTP traffic. Default 8.
    pub api_pool_size: usize,
    /// What `database_url` goes through: `none` (straight to PostgreSQL,
    /// or a session-mode pooler) or `transaction` (PgBouncer in transaction
    /// mode: no session options at connect; `listen_database_url` must then
    /// go straight to PostgreSQL). Default `none`. `MAAS_DB__POOLER`.
    pub pooler: Pooler,
}

/// The pooler `database_url` goes through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooler {
    #[default]
    None,
    Transaction,
}

impl Default for DbConfig {
    fn default() -> Self {
        DbConfig {
            statement_timeout_ms: 30_000,
            lock_timeout_ms: 5_000,
            idle_in_transaction_timeout_ms: 60_000,
            api_pool_size: 8,
            pooler: Pooler::None,
        }
    }
}

impl DbConfig {
    /// The `options` startup parameter setting the three timeouts, and
    /// `jit = off`: the daemon's statements are short, and a plan costed
    /// above `jit_above_cost` (the memory search of a user of 100,000
    /// turns, planned for its parameters) spent 130 ms compiling to save
    /// none.
    pub fn session_options(&self) -> String {
        format!(
            "-c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={} -c jit=off",
            self.statement_timeout_ms, self.lock_timeout_ms, self.idle_in_transaction_timeout_ms
        )
    }

    /// The limits of a migration session: no statement or lock limit (a
    /// migration may rewrite a table and waits for another daemon's), the
    /// idle-in-transaction limit kept.
    pub fn for_migrations(&self) -> DbConfig {
        DbConfig {
            statement_timeout_ms: 0,
            lock_timeout_ms: 0,
            ..self.clone()
        }
    }

    /// True when `database_url`'s sessions may not carry startup options.
    pub fn through_pooler(&self) -> bool {
        self.pooler == Pooler::Transaction
    }

    pub fn lock_timeout(&self) -> Duration {
        Duration::from_millis(self.lock_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_name_every_timeout() {
        let o = DbConfig::default().session_options();
        assert_eq!(
            o,
            "-c statement_timeout=30000 -c lock_timeout=5000 -c idle_in_transaction_session_timeout=60000 -c jit=off"
        );
        assert!(
            DbConfig::default()
                .for_migrations()
                .session_options()
                .contains("lock_timeout=0 ")
        );
    }
}
