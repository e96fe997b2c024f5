//! `maasctl requests ...`: inspect requests and their step history.

use clap::Subcommand;
use uuid::Uuid;

use super::{CliError, Outcome, connect};
use crate::config::Config;
use crate::repo;

#[derive(Subcommand, Debug)]
pub enum RequestsCommand {
    /// Show one request and its step history.
    Show {
        /// The request id (uuid).
        id: String,
    },
}

pub async fn run(cfg: &Config, cmd: RequestsCommand, json: bool) -> Result<Outcome, CliError> {
    match cmd {
        RequestsCommand::Show { id } => show(cfg, &id, json).await,
    }
}

async fn show(cfg: &Config, id: &str, json: bool) -> Result<Outcome, CliError> {
    let id: Uuid = id
        .trim()
        .parse()
        .map_err(|_| CliError::Usage(format!("{id:?} is not a request id (expected a uuid)")))?;
    let client = connect(cfg).await?;
    let Some(run) = repo::show_run(&client, id).await? else {
        if json {
            println!("{}", serde_json::json!({"error": "not found", "id": id}));
        } else {
            eprintln!("no request {id}");
        }
        return Ok(Outcome::Finding);
    };
    let steps = repo::show_steps(&client, id).await?;
    if json {
        println!("{}", serde_json::json!({"request": run, "steps": steps}));
        return Ok(Outcome::Ok);
    }
    println!("request   {}", run.id);
    println!("status    {}", run.status);
    println!("user      {}", run.user_id);
    if let Some(t) = run.thread_id {
        println!("thread    {t}");
    }
    println!("created   {}", run.created_at.to_rfc3339());
    println!("updated   {}", run.updated_at.to_rfc3339());
    println!("attempt   {} (of the current stage)", run.attempt);
    if let (Some(owner), Some(until)) = (&run.lease_owner, run.lease_expires_at) {
        println!("lease     held by {owner} until {}", until.to_rfc3339());
    }
    if run.run_after > run.updated_at {
        println!("waiting   until {} (backoff)", run.run_after.to_rfc3339());
    }
    if run.debug {
        println!("debug     yes");
    }
    println!("query     {}", one_line(&run.user_query, 200));
    if let Some(a) = &run.analysis_result {
        println!("analysis  {}", one_line(&a.to_string(), 200));
    }
    if let Some(c) = &run.final_context_payload {
        println!("context   {} characters", c.chars().count());
    }
    if let Some(a) = &run.final_answer {
        println!("answer    {}", one_line(a, 500));
    }
    if let Some(e) = &run.error {
        println!("error     {e}");
    }
    println!();
    println!(
        "{:<9} {:>7} {:<14} {:>9} {:<24} {:<28} error",
        "stage", "attempt", "outcome", "ms", "started", "worker"
    );
    for s in &steps {
        let err = match (&s.error_class, &s.error_message) {
            (Some(c), Some(m)) => format!("{c}: {}", one_line(m, 160)),
            (Some(c), None) => c.clone(),
            _ => String::new(),
        };
        println!(
            "{:<9} {:>7} {:<14} {:>9} {:<24} {:<28} {}",
            s.stage,
            s.attempt,
            s.outcome,
            s.latency_ms.map(|l| l.to_string()).unwrap_or_else(|| "-".into()),
            s.started_at.format("%Y-%m-%d %H:%M:%S%.3f"),
            s.worker,
            err
        );
    }
    if steps.is_empty() {
        println!("(no finished stage attempts yet)");
    }
    Ok(Outcome::Ok)
}

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if flat.chars().count() > max {
        format!("{}…", flat.chars().take(max).collect::<String>())
    } else {
        flat
    }
}
