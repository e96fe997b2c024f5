//! `maasctl archivist run [--user ID] [--dry-run]` and `maasctl archivist
//! show --user ID`.
//!
//! `run` without `--user` archives every user the thresholds select, as the
//! schedule in `maasd` does; with `--user` it archives that user regardless
//! of thresholds and cooldown: "archive now" ([`control::archive_now`], as
//! from the console), recorded in `operator_actions` as `archive_run` under
//! the operator's name and `--reason`. On a terminal, progress is a bar
//! (users done, logs and records so far; failures printed above it);
//! otherwise one plain line per user. Either way a final summary line follows; `--json` prints
//! the run report instead. Exit 1 when a user failed.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use clap::Subcommand;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{CliError, Outcome, connect, parse_id};
use crate::archivist::{Archivist, Progress, RunOptions, RunReport, Trigger, UserOutcome, UserReport};
use crate::config::Config;
use crate::control;
use crate::db;
use crate::llm::Llm;
use crate::repo;

#[derive(Subcommand, Debug)]
pub enum ArchivistCommand {
    /// Archive pending raw logs into long-term memory (LSM records).
    Run {
        /// Only this user, regardless of thresholds and cooldown.
        #[arg(long)]
        user: Option<String>,
        /// Show who would be archived and how many records it would make;
        /// call no model, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Why (recorded with a run of one user).
        #[arg(long)]
        reason: Option<String>,
    },
    /// A user's archive state and memory version.
    Show {
        #[arg(long)]
        user: String,
    },
}

/// What `archivist run` does: to whom, as whom, and whether for real.
struct Ask {
    user: Option<Uuid>,
    dry_run: bool,
    actor: String,
    reason: Option<String>,
}

pub async fn run(cfg: &Config, command: ArchivistCommand, actor: &str, json: bool) -> Result<Outcome, CliError> {
    match command {
        ArchivistCommand::Show { user } => show(cfg, parse_id(&user, "user")?, json).await,
        ArchivistCommand::Run { user, dry_run, reason } => {
            let ask = Ask {
                user: user.as_deref().map(|u| parse_id(u, "user")).transpose()?,
                dry_run,
                actor: actor.to_owned(),
                reason,
            };
            run_once(cfg, &ask, json).await
        }
    }
}

/// One line per user on stdout, as each finishes.
struct Lines {
    out: Mutex<std::io::Stdout>,
}

impl Progress for Lines {
    fn user_done(&self, r: &UserReport) {
        let line = describe(r);
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(out, "{line}");
    }
}

struct Silent;
impl Progress for Silent {}

/// A progress bar on stderr, for a terminal.
struct Bar {
    bar: indicatif::ProgressBar,
    logs: AtomicI64,
    records: AtomicI64,
}

impl Bar {
    fn new() -> Bar {
        let bar = indicatif::ProgressBar::new(0);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} archiving [{bar:30}] {pos}/{len} users, {msg} ({elapsed})",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        Bar {
            bar,
            logs: AtomicI64::new(0),
            records: AtomicI64::new(0),
        }
    }
}

impl Progress for Bar {
    fn add_users(&self, n: usize) {
        self.bar.inc_length(u64::try_from(n).unwrap_or(u64::MAX));
    }

    fn user_done(&self, r: &UserReport) {
        let logs = self.logs.fetch_add(r.logs, Ordering::Relaxed) + r.logs;
        let records = self.records.fetch_add(r.records, Ordering::Relaxed) + r.records;
        if matches!(r.outcome, UserOutcome::Failed | UserOutcome::Raced | UserOutcome::Busy) {
            self.bar.println(describe(r));
        }
        self.bar.set_message(format!("{logs} logs, {records} records"));
        self.bar.inc(1);
    }
}

fn describe(r: &UserReport) -> String {
    let version = r
        .memory_version
        .map(|v| format!(" (memory version {v})"))
        .unwrap_or_default();
    match r.outcome {
        UserOutcome::Archived => format!(
            "user {}: archived {} logs into {} records{version}",
            r.user_id, r.logs, r.records
        ),
        UserOutcome::Planned => format!(
            "user {}: {} logs pending; the first batch would make {} records",
            r.user_id, r.logs, r.records
        ),
        UserOutcome::Nothing => format!("user {}: nothing pending{version}", r.user_id),
        UserOutcome::Busy => format!("user {}: busy (another runner holds it)", r.user_id),
        UserOutcome::Raced => format!("user {}: another runner archived it first", r.user_id),
        UserOutcome::Cancelled => format!("user {}: interrupted; nothing of the open batch written", r.user_id),
        UserOutcome::Failed => format!(
            "user {}: failed: {}: {}",
            r.user_id,
            r.error_class.as_deref().unwrap_or("error"),
            r.error.as_deref().unwrap_or("")
        ),
    }
}

/// The archivist of this command: a pool of its own, sized for its users.
fn archivist(cfg: &Config) -> Result<Archivist, CliError> {
    let llm = Arc::new(Llm::from_config(&cfg.llm, &cfg.llm_provider)?);
    let mut sized = cfg.clone();
    sized.pool_size = cfg.archivist.concurrency + 2;
    let pool = db::connect_pool(&sized, "maasctl-archivist")?;
    let worker = format!("maasctl:{}", crate::sys::worker_id());
    Ok(Archivist::new(pool, llm, Arc::new(cfg.clone()), worker))
}

/// One run, its progress on the terminal (a bar), as lines, or silent
/// with `--json`; Ctrl-C stops it between batches.
async fn run_once(cfg: &Config, ask: &Ask, json: bool) -> Result<Outcome, CliError> {
    let archivist = archivist(cfg)?;
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_signal.cancel();
        }
    });
    let report = if json {
        run_with(&archivist, ask, &Silent, &cancel).await?
    } else if std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
        let bar = Bar::new();
        let report = run_with(&archivist, ask, &bar, &cancel).await;
        bar.bar.finish_and_clear();
        report?
    } else {
        let lines = Lines {
            out: Mutex::new(std::io::stdout()),
        };
        run_with(&archivist, ask, &lines, &cancel).await?
    };
    print_report(&report, json)?;
    Ok(if report.failures > 0 {
        Outcome::Finding
    } else {
        Outcome::Ok
    })
}

/// A run of one user is "archive now" (recorded); of every candidate, or a
/// dry run, a plain run.
async fn run_with(
    archivist: &Archivist,
    ask: &Ask,
    progress: &dyn Progress,
    cancel: &CancellationToken,
) -> Result<RunReport, CliError> {
    if let (Some(user), false) = (ask.user, ask.dry_run) {
        return Ok(control::archive_now(archivist, user, &ask.actor, ask.reason.as_deref(), progress, cancel).await?);
    }
    let opts = RunOptions {
        trigger: Trigger::Manual,
        user: ask.user,
        dry_run: ask.dry_run,
        tick: None,
    };
    Ok(archivist.run(opts, progress, cancel).await?)
}

fn print_report(report: &RunReport, json: bool) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string(report).unwrap_or_default())?;
        return Ok(());
    }
    if report.dry_run {
        writeln!(
            out,
            "dry run: {} users selected, {} logs pending, nothing written",
            report.users.len(),
            report.logs
        )?;
    } else {
        writeln!(
            out,
            "run {}: {} users, {} archived, {} logs, {} records, {} failed, {} ms",
            report.archive_run_id.unwrap_or_default(),
            report.users.len(),
            report.users_archived,
            report.logs,
            report.records,
            report.failures,
            report.duration_ms
        )?;
    }
    Ok(())
}

async fn show(cfg: &Config, user: Uuid, json: bool) -> Result<Outcome, CliError> {
    let client = connect(cfg).await?;
    let Some(mark) = repo::archive::show_mark(&client, user).await? else {
        if json {
            println!(
                "{}",
                serde_json::json!({"user_id": user, "memory_version": 0, "known": false})
            );
        } else {
            println!("user {user}: no logs yet (memory version 0)");
        }
        return Ok(Outcome::Finding);
    };
    if json {
        println!("{}", serde_json::to_string(&mark).unwrap_or_default());
        return Ok(Outcome::Ok);
    }
    let t = |v: Option<chrono::DateTime<chrono::Utc>>| v.map_or("-".to_owned(), |t| t.to_rfc3339());
    println!("user            {}", mark.user_id);
    println!("memory version  {}", mark.memory_version);
    println!(
        "logs            {} logged, {} archived, {} pending",
        mark.logged_seq, mark.archived_seq, mark.pending
    );
    println!("pending since   {}", t(mark.pending_since));
    println!("last active     {}", t(mark.last_active_at));
    println!("last archived   {}", t(mark.last_archived_at));
    if let Some(owner) = &mark.lease_owner {
        println!("leased to       {owner} until {}", t(mark.lease_expires_at));
    }
    if mark.failures > 0 || mark.last_error.is_some() {
        println!(
            "failures        {} (retry after {}): {}",
            mark.failures,
            t(mark.retry_after),
            mark.last_error.as_deref().unwrap_or("")
        );
    }
    Ok(Outcome::Ok)
}
