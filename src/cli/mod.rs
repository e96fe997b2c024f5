//! `maasctl`: the operator's CLI. Nouns with verbs; human-readable output by
//! default, `--json` for scripts.
//!
//! Exit codes: 0 success; 1 the command ran but found a problem (unknown
//! request, schema not current); 2 usage or runtime error.

mod archivist;
mod devdb;
mod requests;
mod sweep;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::db;

#[derive(Parser, Debug)]
#[command(name = "maasctl", version, about = "Operate maas: migrations, sweeps, requests")]
pub struct Cli {
    /// TOML configuration file (environment variables override it).
    #[arg(long, global = true, env = "MAAS_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Apply pending migrations and (re)install the triggers.
    Migrate {
        /// Only report whether the schema is current; change nothing.
        #[arg(long)]
        check: bool,
    },
    /// Run one catch-up sweep: take back expired leases and ring the
    /// doorbell for due rows.
    Sweep {
        /// Report what a sweep would do; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Inspect requests.
    Requests {
        #[command(subcommand)]
        command: requests::RequestsCommand,
    },
    /// Long-term memory: archive raw logs into LSM records, show a user's
    /// archive state and memory version.
    Archivist {
        #[command(subcommand)]
        command: archivist::ArchivistCommand,
    },
    /// A private PostgreSQL cluster for development, tests and benchmarks.
    #[command(name = "dev-db")]
    DevDb {
        #[command(subcommand)]
        command: devdb::DevDbCommand,
    },
}

/// The outcome of a command that ran: success, or a finding (exit 1).
pub enum Outcome {
    Ok,
    Finding,
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Db(#[from] db::Error),
    #[error(transparent)]
    DevDb(#[from] db::devdb::DevDbError),
    #[error(transparent)]
    Archivist(#[from] crate::archivist::ArchivistError),
    #[error("LLM configuration: {0}")]
    Llm(#[from] crate::llm::ConfigError),
    #[error("{0}")]
    Usage(String),
    #[error("output: {0}")]
    Io(#[from] std::io::Error),
}

impl From<tokio_postgres::Error> for CliError {
    fn from(e: tokio_postgres::Error) -> Self {
        CliError::Db(e.into())
    }
}

pub async fn run(cli: Cli) -> Result<Outcome, CliError> {
    match cli.command {
        Command::DevDb { command } => devdb::run(command).await,
        Command::Migrate { check } => {
            let cfg = Config::load(cli.config.as_deref())?;
            migrate(&cfg, check, cli.json).await
        }
        Command::Sweep { dry_run } => {
            let cfg = Config::load(cli.config.as_deref())?;
            sweep::run(&cfg, dry_run, cli.json).await
        }
        Command::Requests { command } => {
            let cfg = Config::load(cli.config.as_deref())?;
            requests::run(&cfg, command, cli.json).await
        }
        Command::Archivist { command } => {
            let cfg = Config::load(cli.config.as_deref())?;
            archivist::run(&cfg, command, cli.json).await
        }
    }
}

/// A connection for one-shot commands (from a pool of one, so the named
/// queries are prepared and cached as in the daemon).
pub(crate) async fn connect(cfg: &Config) -> Result<deadpool_postgres::Object, CliError> {
    let mut one = cfg.clone();
    one.pool_size = 1;
    let pool = db::connect_pool(&one, "maasctl")?;
    Ok(pool.get().await.map_err(db::Error::from)?)
}

async fn migrate(cfg: &Config, check: bool, json: bool) -> Result<Outcome, CliError> {
    let mut client = connect(cfg).await?;
    if check {
        let state = db::migrate::state(&client).await?;
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "current_version": state.current_version,
                    "latest_version": state.latest_version,
                    "missing_triggers": state.missing_triggers,
                    "current": state.is_current(),
                })
            );
        } else {
            println!(
                "schema version {} of {}; triggers {}",
                state.current_version,
                state.latest_version,
                if state.missing_triggers.is_empty() {
                    "installed".to_owned()
                } else {
                    format!("missing: {}", state.missing_triggers.join(", "))
                }
            );
        }
        return Ok(if state.is_current() {
            Outcome::Ok
        } else {
            Outcome::Finding
        });
    }
    let report = db::migrate::migrate(&mut client, true).await?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "applied": report.applied,
                "triggers": report.triggers,
                "current_version": report.current_version,
            })
        );
    } else {
        if report.applied.is_empty() {
            println!("no pending migrations");
        }
        for m in &report.applied {
            println!("applied {m}");
        }
        for t in &report.triggers {
            println!("installed triggers from {t}");
        }
        println!("schema version {}", report.current_version);
    }
    Ok(Outcome::Ok)
}
