//! A connection outside the pools (the migration's at start): driving it,
//! and saying where a connection string points.
//!
//! - [`drive`] logs the server's notices at DEBUG and its warnings at WARN.
//!   tokio-postgres's own driver logs every notice at INFO, so a fresh
//!   database's migrations (`DROP TRIGGER IF EXISTS` says "does not exist,
//!   skipping" once per trigger) opened maasd's log with ten lines a
//!   newcomer read as problems.
//! - [`shown`] is `user@host:port/database`: never the password, for the
//!   log lines that say which database a process uses.

use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::config::Host;
use tokio_postgres::error::Severity;
use tokio_postgres::{AsyncMessage, Connection};

/// Drives `conn` until it closes (the client dropped) or fails; the
/// server's messages on the way are logged (module doc).
pub async fn drive<S, T>(mut conn: Connection<S, T>) -> Result<(), tokio_postgres::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
    while let Some(message) = messages.next().await {
        if let AsyncMessage::Notice(notice) = message? {
            let code = notice.code().code();
            if notice.parsed_severity() == Some(Severity::Warning) {
                tracing::warn!(code, "server: {}", notice.message());
            } else {
                tracing::debug!(severity = notice.severity(), code, "server: {}", notice.message());
            }
        }
    }
    Ok(())
}

/// Where the connection string `url` points: `user@host:port/database`,
/// hosts joined by commas, defaults filled in as libpq fills them (port
/// 5432, the database named as the user). No password, whatever the
/// string holds; a string that does not parse is not shown at all.
pub fn shown(url: &str) -> String {
    let Ok(pg) = super::pg_config(url, "maas") else {
        return "(a connection string that does not parse)".to_owned();
    };
    let user = pg.get_user().unwrap_or("(the OS user)");
    let ports = pg.get_ports();
    let hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match host {
                Host::Tcp(name) if name.contains(':') => format!("[{name}]:{port}"),
                Host::Tcp(name) => format!("{name}:{port}"),
                Host::Unix(dir) => format!("{}:{port}", dir.display()),
            }
        })
        .collect();
    let hosts = if hosts.is_empty() {
        "(the default socket)".to_owned()
    } else {
        hosts.join(",")
    };
    let database = pg.get_dbname().unwrap_or(user);
    format!("{user}@{hosts}/{database}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_names_user_hosts_ports_and_database_but_never_the_password() {
        assert_eq!(
            shown("postgres://maas:s3cret@db.example:6432/orders?sslmode=require"),
            "maas@db.example:6432/orders"
        );
        assert_eq!(shown("postgresql://app@127.0.0.1/maas"), "app@127.0.0.1:5432/maas");
        assert_eq!(
            shown("host=a,b port=5433,5434 user=u password=pw dbname=d"),
            "u@a:5433,b:5434/d"
        );
        assert_eq!(shown("postgres://u@[::1]:5433/d"), "u@[::1]:5433/d");
        assert_eq!(shown("host=/run/postgresql user=u"), "u@/run/postgresql:5432/u");
        let text = shown("postgres://u:hunter2@h/d");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!shown("postgres://u:hunter2@h:notaport/d").contains("hunter2"));
    }
}
