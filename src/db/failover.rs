//! A primary that stops taking writes is a lost connection.
//!
//! - SQLSTATE `25006` (read-only SQL transaction: a primary demoted, or set
//!   `default_transaction_read_only`) is classified with the connection
//!   errors ([`super::is_connection_error`]): the work is released and
//!   retried after a reconnect, never failed for it.
//! - With `target_session_attrs=read-write` in the connection string, a
//!   pooled connection is checked before each use (one round trip) and
//!   dropped when its server has become read-only; new connections go only
//!   to a server that takes writes (tokio-postgres tries each `host` in
//!   turn), so after a failover the pool follows the new primary. Until one
//!   takes writes, taking a connection fails and `/readyz` answers 503.
//! - Without it, connections are reused without a check (the fast path).

use deadpool_postgres::RecyclingMethod;
use tokio_postgres::config::TargetSessionAttrs;

/// Fails (division by zero) on a session whose transactions are read-only.
const WRITABLE_CHECK: &str = "SELECT 1 / (current_setting('transaction_read_only') = 'off')::int";

/// How the pool checks a connection before handing it out.
pub fn recycling(pg: &tokio_postgres::Config) -> RecyclingMethod {
    if pg.get_target_session_attrs() == TargetSessionAttrs::ReadWrite {
        RecyclingMethod::Custom(WRITABLE_CHECK.to_owned())
    } else {
        RecyclingMethod::Fast
    }
}

/// SQLSTATE 25006, read_only_sql_transaction.
pub(super) fn is_read_only(code: &str) -> bool {
    code == "25006"
}
