//! `maasctl sweep [--dry-run]`: one catch-up sweep from the command line.
//! It takes back expired leases (with [`reclaim_all`], as the daemon's
//! sweep does) and rings the doorbell on `pipeline_events` for due rows, so
//! the running daemons claim them. It ends the waits for a person whose
//! limit passed ([`expire_all_waits`]). It runs no stage itself.

use super::{CliError, Outcome, connect};
use crate::config::Config;
use crate::dispatcher::sweep::{expire_all_waits, reclaim_all};
use crate::repo;

pub async fn run(cfg: &Config, dry_run: bool, json: bool) -> Result<Outcome, CliError> {
    let client = connect(cfg).await?;
    let expired = repo::requests::count_expired_leases(&client).await?;
    let mut recovered = Vec::new();
    let mut waits = Vec::new();
    if !dry_run {
        reclaim_all(&client, cfg.max_attempts, |batch| recovered.extend_from_slice(batch)).await?;
        expire_all_waits(&client, |batch| waits.extend_from_slice(batch)).await?;
    }
    let due = repo::due_counts(&client).await?;
    let found: i64 = due.iter().map(|d| d.1).sum();
    let rung = if dry_run { 0 } else { repo::ring_due(&client).await? };
    if json {
        println!(
            "{}",
            serde_json::json!({
                "dry_run": dry_run,
                "expired_leases": expired,
                "recovered": recovered.iter().map(|r| serde_json::json!({"id": r.id, "was": r.was, "now": r.new_status})).collect::<Vec<_>>(),
                "waits_expired": waits.iter().map(|w| serde_json::json!({"id": w.id, "was": w.was, "now": w.new_status})).collect::<Vec<_>>(),
                "found": due.iter().map(|(s, n, age)| serde_json::json!({"status": s, "rows": n, "oldest_waiting_secs": age})).collect::<Vec<_>>(),
                "found_total": found,
                "dispatched": rung,
            })
        );
    } else {
        if dry_run {
            println!("dry run: nothing changed");
            println!("expired leases: {expired} (would be taken back)");
        } else {
            println!("recovered: {} expired lease(s) taken back", recovered.len());
            for r in &recovered {
                println!("  {}  {} -> {}", r.id, r.was, r.new_status);
            }
            println!("expired: {} wait(s) past their limit ended", waits.len());
            for w in &waits {
                println!("  {}  {} -> {}", w.id, w.was, w.new_status);
            }
        }
        println!("found: {found} due row(s)");
        for (status, n, age) in &due {
            println!("  {status:<9} {n:>8}  oldest waiting {age:.1} s");
        }
        if dry_run {
            println!("dispatched: none (dry run)");
        } else {
            println!("dispatched: rang the doorbell for {rung} status(es) with due rows");
        }
    }
    Ok(Outcome::Ok)
}
