//! Database access: the pool, a connection outside it ([`session`]), the
//! migration runner and a private cluster for development and tests.

pub mod devdb;
pub mod failover;
pub mod migrate;
pub mod pool;
pub mod session;
pub mod tls;

pub use pool::{Pool, connect_api_pool, connect_pool, pg_config, unnamed_statements, with_limits};

/// A database failure, classified for the caller.
///
/// Its text says what happened: for an error the server reported, the
/// server's message, SQLSTATE, constraint, table, column, detail and hint
/// ([`describe`]); for a lost session, the cause from the socket. The
/// driver's own text for a server error is only "db error", so the driver
/// error is kept as a field, not as a `source` that would repeat it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database: {}", describe(.0))]
    Postgres(tokio_postgres::Error),
    #[error("database pool: {}", describe_pool(.0))]
    Pool(deadpool_postgres::PoolError),
    #[error("migration: {0}")]
    Migration(String),
    #[error("database setup: {0}")]
    Setup(String),
    /// The database answered with something this program cannot use.
    #[error("database: unexpected result: {0}")]
    Unexpected(String),
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        Error::Postgres(e)
    }
}

impl From<deadpool_postgres::PoolError> for Error {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Error::Pool(e)
    }
}

impl Error {
    /// The server's report, when the server refused the statement.
    pub fn as_db_error(&self) -> Option<&tokio_postgres::error::DbError> {
        match self {
            Error::Postgres(e) | Error::Pool(deadpool_postgres::PoolError::Backend(e)) => e.as_db_error(),
            _ => None,
        }
    }

    /// The SQLSTATE the server reported, if it did.
    pub fn sqlstate(&self) -> Option<&str> {
        self.as_db_error().map(|db| db.code().code())
    }

    /// The constraint the server named, if it did.
    pub fn constraint(&self) -> Option<&str> {
        self.as_db_error().and_then(|db| db.constraint())
    }

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

/// A driver error as one line a person can act on: for a server error,
/// `message (SQLSTATE code, constraint c, table t, column c, detail: …,
/// hint: …, where: …)` with the parts the server sent; otherwise the
/// driver's text followed by its causes (e.g. the socket's error).
pub fn describe(e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        return crate::error::chain(e);
    };
    server_line(
        db.message(),
        db.code().code(),
        &[
            ("schema", db.schema()),
            ("table", db.table()),
            ("column", db.column()),
            ("constraint", db.constraint()),
            ("datatype", db.datatype()),
        ],
        &[("detail", db.detail()), ("hint", db.hint()), ("where", db.where_())],
    )
}

/// `message (SQLSTATE code, name value…, text: value…)` with the parts that
/// are present; line breaks in texts become ` / ` so a log line stays one.
fn server_line(message: &str, code: &str, named: &[(&str, Option<&str>)], texts: &[(&str, Option<&str>)]) -> String {
    let mut parts = vec![format!("SQLSTATE {code}")];
    for (what, value) in named {
        if let Some(v) = value {
            parts.push(format!("{what} {v}"));
        }
    }
    for (what, value) in texts {
        if let Some(v) = value {
            parts.push(format!("{what}: {}", v.replace('\n', " / ")));
        }
    }
    format!("{} ({})", message.replace('\n', " / "), parts.join(", "))
}

/// A pool error as one line: a failed connection is described by
/// [`describe`]; a timeout or closed pool by its own text.
fn describe_pool(e: &deadpool_postgres::PoolError) -> String {
    match e {
        deadpool_postgres::PoolError::Backend(e) => format!("cannot get a connection: {}", describe(e)),
        other => other.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_error_line_names_code_constraint_and_detail() {
        let line = server_line(
            "new row for relation \"pipeline_runs\" violates check constraint \"pipeline_runs_attempt_range\"",
            "23514",
            &[
                ("schema", Some("public")),
                ("table", Some("pipeline_runs")),
                ("column", None),
                ("constraint", Some("pipeline_runs_attempt_range")),
            ],
            &[
                ("detail", Some("Failing row contains (…).\nsecond line")),
                ("hint", None),
            ],
        );
        assert_eq!(
            line,
            "new row for relation \"pipeline_runs\" violates check constraint \"pipeline_runs_attempt_range\" \
             (SQLSTATE 23514, schema public, table pipeline_runs, constraint pipeline_runs_attempt_range, \
             detail: Failing row contains (…). / second line)"
        );
        assert!(!line.contains("db error"));
    }

    #[test]
    fn a_pool_timeout_says_so() {
        let e = Error::from(deadpool_postgres::PoolError::Timeout(
            deadpool_postgres::TimeoutType::Wait,
        ));
        let text = e.to_string();
        assert!(text.starts_with("database pool: "), "{text}");
        assert!(text.to_lowercase().contains("timeout"), "{text}");
        assert!(e.is_connection());
        assert_eq!(e.sqlstate(), None);
    }
}
