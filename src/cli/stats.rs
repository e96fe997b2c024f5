//! `maasctl stats`: backlog by status, the oldest waiting age, the failure
//! rate over a window, in-flight leases by daemon, daemons listening,
//! callbacks and whether claiming is paused.

use std::time::Duration;

use super::{CliError, Outcome, age, connect, since};
use crate::config::Config;
use crate::control;
use crate::model::Status;
use crate::repo::stats;

/// The figures of the report, read at once.
struct Snapshot {
    control: control::ControlState,
    backlog: Vec<stats::Backlog>,
    leases: Vec<stats::Leases>,
    callbacks: stats::CallbackStats,
    daemons: Vec<stats::DaemonSession>,
    window: Duration,
    /// Requests finished in the window: completed, failed, cancelled.
    finished: (i64, i64, i64),
}

impl Snapshot {
    /// Failed among completed and failed, when any finished.
    fn failure_rate(&self) -> Option<f64> {
        let (completed, failed, _) = self.finished;
        (completed + failed > 0).then(|| failed as f64 / (completed + failed) as f64)
    }

    /// How long the longest-waiting due request has waited.
    fn oldest_due(&self) -> Option<f64> {
        self.backlog
            .iter()
            .filter_map(|b| b.oldest_due_secs)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    }
}

pub async fn run(cfg: &Config, window: Duration, json: bool) -> Result<Outcome, CliError> {
    let client = connect(cfg).await?;
    let control = control::state(&client).await?;
    let backlog = stats::backlog(&client).await?;
    let finished = stats::finished(&client, window).await?;
    let leases = stats::leases(&client).await?;
    let callbacks = stats::callbacks(&client).await?;
    let daemons = stats::daemons(&client).await?;
    let count = |s: Status| finished.iter().find(|f| f.0 == s).map_or(0, |f| f.1);
    let s = Snapshot {
        control,
        backlog,
        leases,
        callbacks,
        daemons,
        window,
        finished: (
            count(Status::Completed),
            count(Status::Failed),
            count(Status::Cancelled),
        ),
    };
    if json {
        print_json(&s);
    } else {
        print_claiming_and_daemons(&s);
        print_backlog(&s);
        print_leases(&s);
        print_callbacks(&s);
    }
    Ok(Outcome::Ok)
}

fn print_json(s: &Snapshot) {
    let (completed, failed, cancelled) = s.finished;
    println!(
        "{}",
        serde_json::json!({
            "paused": s.control.paused,
            "control": s.control,
            "daemons_listening": s.daemons.len(),
            "daemons": s.daemons,
            "backlog": s.backlog,
            "oldest_due_secs": s.oldest_due(),
            "window_secs": s.window.as_secs_f64(),
            "finished": {"completed": completed, "failed": failed, "cancelled": cancelled},
            "failure_rate": s.failure_rate(),
            "leases": s.leases,
            "callbacks": s.callbacks,
        })
    );
}

fn print_claiming_and_daemons(s: &Snapshot) {
    let control = &s.control;
    if control.paused {
        println!(
            "claiming  PAUSED {} ago by {}{}",
            control.changed_at.map(|t| age(since(t))).unwrap_or_default(),
            control.changed_by.as_deref().unwrap_or("?"),
            control.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default()
        );
    } else {
        println!("claiming  active");
    }
    println!(
        "daemons   {} listening{}",
        s.daemons.len(),
        if s.daemons.is_empty() {
            " (no maasd is connected to this database)".to_owned()
        } else {
            format!(
                " ({})",
                s.daemons
                    .iter()
                    .map(|d| format!("{} up {}", d.client, age(since(d.since))))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
    println!();
}

/// The backlog by status, then what finished in the window.
fn print_backlog(s: &Snapshot) {
    println!(
        "{:<11} {:>9} {:>9} {:>6} {:>12}",
        "backlog", "requests", "due now", "held", "oldest due"
    );
    if s.backlog.is_empty() {
        println!("(nothing unfinished)");
    }
    for b in &s.backlog {
        println!(
            "{:<11} {:>9} {:>9} {:>6} {:>12}",
            b.status,
            b.total,
            b.due,
            b.held,
            b.oldest_due_secs.map(age).unwrap_or_else(|| "-".into())
        );
    }
    println!();
    let (completed, failed, cancelled) = s.finished;
    println!(
        "finished in the last {}: {completed} completed, {failed} failed, {cancelled} cancelled; failure rate {}",
        age(s.window.as_secs_f64()),
        s.failure_rate()
            .map(|r| format!("{:.1} %", r * 100.0))
            .unwrap_or_else(|| "-".into())
    );
    println!();
}

fn print_leases(s: &Snapshot) {
    if s.leases.is_empty() {
        println!("leases    none in flight");
    } else {
        println!(
            "{:<40} {:>9} {:>8} {:>16}",
            "leases by daemon", "in flight", "expired", "next expiry in"
        );
        for l in &s.leases {
            println!(
                "{:<40} {:>9} {:>8} {:>16}",
                l.owner,
                l.held,
                l.expired,
                age(-since(l.earliest_expiry)).replace('-', "overdue")
            );
        }
    }
    println!();
}

fn print_callbacks(s: &Snapshot) {
    let callbacks = &s.callbacks;
    println!(
        "callbacks {} pending{}, {} dead",
        callbacks.pending,
        callbacks
            .oldest_pending_secs
            .map(|s| format!(" (oldest {})", age(s)))
            .unwrap_or_default(),
        callbacks.dead
    );
}
