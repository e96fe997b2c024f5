//! `maasctl`: the operator's CLI. Nouns with verbs; human-readable output by
//! default, `--json` for scripts.
//!
//! Exit codes: 0 success; 1 the command ran but found a problem (unknown
//! request, schema not current, a request not in a state the verb applies
//! to, a failed `doctor` check); 2 usage or runtime error (bad arguments,
//! database unreachable).
//!
//! Actions are recorded in `operator_actions` under `--operator` (default
//! `$MAAS_OPERATOR`, else the login name).

mod archivist;
mod control;
mod devdb;
mod doctor;
mod mcp;
mod prompts;
mod requests;
mod stats;
mod sweep;
mod tenants;
mod users;

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
    /// Who is acting, for the audit trail (default: $MAAS_OPERATOR, else the login name).
    #[arg(long, global = true)]
    pub operator: Option<String>,
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
    /// Find, inspect, retry, cancel and step through requests.
    Requests {
        #[command(subcommand)]
        command: requests::RequestsCommand,
    },
    /// Backlog by status, oldest waiting age, failure rate, leases by daemon.
    Stats {
        /// Window for the failure rate (e.g. 15m, 1h, 1d).
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        window: std::time::Duration,
    },
    /// Check health: database, schema, triggers, a NOTIFY round trip,
    /// daemons, callbacks, LLM providers. Exit 1 if any check fails.
    Doctor,
    /// The system prompts of each role (versioned; one active per role).
    Prompts {
        #[command(subcommand)]
        command: prompts::PromptsCommand,
    },
    /// Stop claiming in every daemon (running stages finish).
    Pause {
        /// Why, for the audit trail and `stats`.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume claiming in every daemon.
    Resume {
        /// Why, for the audit trail.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Long-term memory: archive raw logs into LSM records, show a user's
    /// archive state and memory version.
    Archivist {
        #[command(subcommand)]
        command: archivist::ArchivistCommand,
    },
    /// A user's data: show (and search) its memory, forget the user.
    Users {
        #[command(subcommand)]
        command: users::UsersCommand,
    },
    /// Tenants: their limits and callback signing secret.
    Tenants {
        #[command(subcommand)]
        command: tenants::TenantsCommand,
    },
    /// API tokens of the database: create (shown once), list, rotate, revoke.
    Tokens {
        #[command(subcommand)]
        command: tenants::TokensCommand,
    },
    /// The MCP server over stdio for one user, for a local desktop client
    /// (a local trust: the CLI's database rights; see docs/mcp.md).
    Mcp {
        /// The user the agent acts for (the tenant's own user id).
        #[arg(long)]
        user: uuid::Uuid,
        /// The user's tenant.
        #[arg(long, default_value = "default")]
        tenant: String,
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
    /// The application layer failed where the operator's input was fine
    /// (the database, a fault of maas): what failed, with the server's
    /// words (`AppError::detailed`).
    #[error("{0}")]
    App(String),
    #[error("output: {0}")]
    Io(#[from] std::io::Error),
}

impl From<crate::control::Error> for CliError {
    fn from(e: crate::control::Error) -> Self {
        match e {
            crate::control::Error::Db(e) => CliError::Db(e),
            crate::control::Error::Archive(e) => CliError::Archivist(e),
        }
    }
}

impl From<crate::control::tenants::AdminError> for CliError {
    fn from(e: crate::control::tenants::AdminError) -> Self {
        match e {
            crate::control::tenants::AdminError::Refused(why) => CliError::Usage(why),
            crate::control::tenants::AdminError::Db(e) => CliError::Db(e),
        }
    }
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
            requests::run(&cfg, command, &actor(cli.operator), cli.json).await
        }
        Command::Stats { window } => {
            let cfg = Config::load(cli.config.as_deref())?;
            stats::run(&cfg, window, cli.json).await
        }
        Command::Doctor => {
            let cfg = Config::load(cli.config.as_deref())?;
            doctor::run(&cfg, cli.config.as_deref(), cli.json).await
        }
        Command::Prompts { command } => {
            let cfg = Config::load(cli.config.as_deref())?;
            prompts::run(&cfg, command, &actor(cli.operator), cli.json).await
        }
        Command::Pause { reason } => {
            let cfg = Config::load(cli.config.as_deref())?;
            control::pause(&cfg, &actor(cli.operator), reason.as_deref(), cli.json).await
        }
        Command::Resume { reason } => {
            let cfg = Config::load(cli.config.as_deref())?;
            control::resume(&cfg, &actor(cli.operator), reason.as_deref(), cli.json).await
        }
        Command::Archivist { command } => {
            let cfg = Config::load(cli.config.as_deref())?;
            archivist::run(&cfg, command, &actor(cli.operator), cli.json).await
        }
        Command::Users { command } => {
            let cfg = Config::load(cli.config.as_deref())?;
            users::run(&cfg, command, &actor(cli.operator), cli.json).await
        }
        Command::Tenants { command } => {
            let cfg = Config::load(cli.config.as_deref())?;
            tenants::tenants(&cfg, command, &actor(cli.operator), cli.json).await
        }
        Command::Tokens { command } => {
            let cfg = Config::load(cli.config.as_deref())?;
            tenants::tokens(&cfg, command, &actor(cli.operator), cli.json).await
        }
        Command::Mcp { user, tenant } => {
            let cfg = Config::load(cli.config.as_deref())?;
            mcp::run(&cfg, user, &tenant).await
        }
    }
}

fn actor(flag: Option<String>) -> String {
    flag.map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(crate::control::default_actor)
}

/// Parses `90s`, `15m`, `2h`, `3d` (or a plain number of seconds).
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 90s, 15m, 2h, 3d)"))?;
    let mult = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "m" | "min" | "mins" => 60.0,
        "h" | "hour" | "hours" => 3600.0,
        "d" | "day" | "days" => 86400.0,
        other => return Err(format!("unknown unit {other:?} in {text:?} (use s, m, h or d)")),
    };
    std::time::Duration::try_from_secs_f64(n * mult).map_err(|_| format!("{text:?} is out of range"))
}

/// Parses the id of a `what` ("request", "user") given as an argument.
pub(crate) fn parse_id(id: &str, what: &str) -> Result<uuid::Uuid, CliError> {
    id.trim()
        .parse()
        .map_err(|_| CliError::Usage(format!("{id:?} is not a {what} id (expected a uuid)")))
}

/// Whether `c` would act on a terminal instead of showing: a control
/// character or a bidirectional override.
fn is_unsafe(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// User-supplied text made safe for a terminal or a log: every control
/// character and bidirectional override escaped (`\u{1b}`), so a stored
/// query, answer, reason or name cannot move the cursor, recolour the
/// screen or fake a line of output.
pub(crate) fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_unsafe(c) {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Flattens a string to one line of at most `max` characters: line breaks
/// and tabs become spaces, every other control character is escaped
/// ([`shown`]).
pub(crate) fn one_line(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if matches!(c, '\n' | '\r' | '\t') { ' ' } else { c })
        .collect();
    let flat = shown(&flat).into_owned();
    if flat.chars().count() > max {
        format!("{}…", flat.chars().take(max).collect::<String>())
    } else {
        flat
    }
}

/// A short human age: `42s`, `7m`, `3h12m`, `2d4h`.
pub(crate) fn age(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "-".into();
    }
    let s = secs.round();
    if s < 60.0 {
        format!("{s:.0}s")
    } else if s < 3600.0 {
        format!("{:.0}m", (s / 60.0).floor())
    } else if s < 86400.0 {
        let (h, m) = ((s / 3600.0).floor(), ((s % 3600.0) / 60.0).floor());
        if m == 0.0 {
            format!("{h:.0}h")
        } else {
            format!("{h:.0}h{m:.0}m")
        }
    } else {
        let (d, h) = ((s / 86400.0).floor(), ((s % 86400.0) / 3600.0).floor());
        if h == 0.0 {
            format!("{d:.0}d")
        } else {
            format!("{d:.0}d{h:.0}h")
        }
    }
}

/// Seconds from `t` until now.
pub(crate) fn since(t: chrono::DateTime<chrono::Utc>) -> f64 {
    (chrono::Utc::now() - t).num_milliseconds() as f64 / 1000.0
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
    // Migrations may rewrite a table and wait for another runner's lock:
    // no statement or lock limit (db.*_timeout_ms bind other sessions).
    let unbounded = Config {
        db: cfg.db.for_migrations(),
        ..cfg.clone()
    };
    let mut client = connect(&unbounded).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        let d = |s| parse_duration(s).ok().map(|d| d.as_secs());
        assert_eq!(d("90"), Some(90));
        assert_eq!(d("90s"), Some(90));
        assert_eq!(d("15m"), Some(900));
        assert_eq!(d("2h"), Some(7200));
        assert_eq!(d("3d"), Some(259_200));
        assert_eq!(d(" 1.5h "), Some(5400));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5w").is_err());
    }

    #[test]
    fn ages_are_short() {
        assert_eq!(age(5.2), "5s");
        assert_eq!(age(125.0), "2m");
        assert_eq!(age(3.0 * 3600.0 + 12.0 * 60.0), "3h12m");
        assert_eq!(age(2.0 * 86400.0 + 4.0 * 3600.0), "2d4h");
        assert_eq!(age(3600.0), "1h");
        assert_eq!(age(86400.0), "1d");
    }
}
