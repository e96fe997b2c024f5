//! `maasctl stats`: backlog by status, the oldest waiting age, the failure
//! rate over a window, in-flight leases by daemon, daemons listening,
//! callbacks and whether claiming is paused.

use std::time::Duration;

use super::{CliError, Outcome, age, connect, since};
use crate::config::Config;
use crate::control;
use crate::model::Status;
use crate::repo::stats;

pub async fn run(cfg: &Config, window: Duration, json: bool) -> Result<Outcome, CliError> {
    let client = connect(cfg).await?;
    let control = control::state(&client).await?;
    let backlog = stats::backlog(&client).await?;
    let finished = stats::finished(&client, window).await?;
    let leases = stats::leases(&client).await?;
    let callbacks = stats::callbacks(&client).await?;
    let daemons = stats::daemons(&client).await?;
    let count = |s: Status| finished.iter().find(|f| f.0 == s).map_or(0, |f| f.1);
    let (completed, failed, cancelled) = (
        count(Status::Completed),
        count(Status::Failed),
        count(Status::Cancelled),
    );
    let failure_rate = if completed + failed > 0 {
        Some(failed as f64 / (completed + failed) as f64)
    } else {
        None
    };
    let oldest_due = backlog
        .iter()
        .filter_map(|b| b.oldest_due_secs)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    if json {
        println!(
            "{}",
            serde_json::json!({
                "paused": control.paused,
                "control": control,
                "daemons_listening": daemons.len(),
                "daemons": daemons,
                "backlog": backlog,
                "oldest_due_secs": oldest_due,
                "window_secs": window.as_secs_f64(),
                "finished": {"completed": completed, "failed": failed, "cancelled": cancelled},
                "failure_rate": failure_rate,
                "leases": leases,
                "callbacks": callbacks,
            })
        );
        return Ok(Outcome::Ok);
    }
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
        daemons.len(),
        if daemons.is_empty() {
            " (no maasd is connected to this database)".to_owned()
        } else {
            format!(
                " ({})",
                daemons
                    .iter()
                    .map(|d| format!("{} up {}", d.client, age(since(d.since))))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
    println!();
    println!(
        "{:<11} {:>9} {:>9} {:>6} {:>12}",
        "backlog", "requests", "due now", "held", "oldest due"
    );
    if backlog.is_empty() {
        println!("(nothing unfinished)");
    }
    for b in &backlog {
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
    println!(
        "finished in the last {}: {completed} completed, {failed} failed, {cancelled} cancelled; failure rate {}",
        age(window.as_secs_f64()),
        failure_rate
            .map(|r| format!("{:.1} %", r * 100.0))
            .unwrap_or_else(|| "-".into())
    );
    println!();
    if leases.is_empty() {
        println!("leases    none in flight");
    } else {
        println!(
            "{:<40} {:>9} {:>8} {:>16}",
            "leases by daemon", "in flight", "expired", "next expiry in"
        );
        for l in &leases {
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
    println!(
        "callbacks {} pending{}, {} dead",
        callbacks.pending,
        callbacks
            .oldest_pending_secs
            .map(|s| format!(" (oldest {})", age(s)))
            .unwrap_or_default(),
        callbacks.dead
    );
    Ok(Outcome::Ok)
}
