//! `maasctl prompts list|show|set|activate`: the versioned system prompts of
//! each role. `set` adds a new version and activates it in one transaction
//! (the old versions are kept); `activate` rolls back to any kept version.
//! Changes are serialised per role and recorded in `operator_actions`.

use std::io::Read;
use std::path::PathBuf;

use clap::Subcommand;

use super::{CliError, Outcome, connect};
use crate::config::Config;
use crate::repo::{audit, prompts};

/// The roles of `system_prompts.role_name`.
pub const ROLES: [&str; 4] = crate::model::PromptRole::NAMES;

#[derive(Subcommand, Debug)]
pub enum PromptsCommand {
    /// Every role with its active version and how many are kept.
    List,
    /// Print a role's active prompt (or --version N).
    Show {
        /// Analyzer, Assembler, FinalResponder (or responder), Archivist.
        role: String,
        #[arg(long)]
        version: Option<i32>,
    },
    /// Add FILE ("-" for standard input) as a role's new prompt version and
    /// activate it atomically; the previous version is kept.
    Set {
        role: String,
        file: PathBuf,
        /// Why (recorded).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Make a kept version active again (roll back).
    Activate {
        role: String,
        version: i32,
        /// Why (recorded).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Accepts the stored names case-insensitively, plus `responder`.
pub fn parse_role(text: &str) -> Result<&'static str, CliError> {
    let t = text.trim().to_ascii_lowercase().replace(['_', '-'], "");
    let t = if t == "responder" {
        "finalresponder".to_owned()
    } else {
        t
    };
    ROLES
        .into_iter()
        .find(|r| r.to_ascii_lowercase() == t)
        .ok_or_else(|| CliError::Usage(format!("unknown role {text:?} (one of {})", ROLES.join(", "))))
}

pub async fn run(cfg: &Config, cmd: PromptsCommand, actor: &str, json: bool) -> Result<Outcome, CliError> {
    match cmd {
        PromptsCommand::List => {
            let client = connect(cfg).await?;
            let rows = prompts::list(&client).await?;
            if json {
                println!("{}", serde_json::to_string(&rows).map_err(std::io::Error::other)?);
                return Ok(Outcome::Ok);
            }
            println!(
                "{:<15} {:>7} {:>8} {:>7} {:>8}  active since",
                "role", "active", "versions", "latest", "chars"
            );
            for r in &rows {
                println!(
                    "{:<15} {:>7} {:>8} {:>7} {:>8}  {}",
                    r.role,
                    r.active_version.map(|v| v.to_string()).unwrap_or_else(|| "NONE".into()),
                    r.versions,
                    r.latest_version,
                    r.active_chars.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
                    r.active_since.map(|t| t.to_rfc3339()).unwrap_or_default()
                );
            }
            let missing: Vec<&str> = ROLES
                .into_iter()
                .filter(|role| !rows.iter().any(|r| r.role == *role && r.active_version.is_some()))
                .collect();
            if !missing.is_empty() {
                println!("no active prompt: {}", missing.join(", "));
                return Ok(Outcome::Finding);
            }
            Ok(Outcome::Ok)
        }
        PromptsCommand::Show { role, version } => {
            let role = parse_role(&role)?;
            let client = connect(cfg).await?;
            let Some(p) = prompts::show(&client, role, version).await? else {
                match version {
                    Some(v) => eprintln!("{role} has no version {v}"),
                    None => eprintln!("{role} has no active prompt"),
                }
                return Ok(Outcome::Finding);
            };
            if json {
                println!("{}", serde_json::to_string(&p).map_err(std::io::Error::other)?);
            } else {
                eprintln!(
                    "# {} version {}{}, created {}",
                    p.role,
                    p.version,
                    if p.active { " (active)" } else { "" },
                    p.created_at.to_rfc3339()
                );
                println!("{}", p.text);
            }
            Ok(Outcome::Ok)
        }
        PromptsCommand::Set { role, file, reason } => {
            let role = parse_role(&role)?;
            let text = if file.as_os_str() == "-" {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s)?;
                s
            } else {
                std::fs::read_to_string(&file)
                    .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", file.display())))?
            };
            if text.trim().is_empty() {
                return Err(CliError::Usage(format!(
                    "{} is empty; a prompt needs text",
                    file.display()
                )));
            }
            let mut client = connect(cfg).await?;
            let tx = client.transaction().await.map_err(crate::db::Error::from)?;
            let (was, new) = prompts::set(&tx, role, &text).await?;
            let detail =
                serde_json::json!({"role": role, "version": new, "previous": was, "chars": text.chars().count()});
            audit::record(&tx, "prompt_set", actor, reason.as_deref(), &detail).await?;
            tx.commit().await.map_err(crate::db::Error::from)?;
            if json {
                println!("{detail}");
            } else {
                println!(
                    "{role}: version {new} is active ({} characters){}",
                    text.chars().count(),
                    was.map(|v| format!("; version {v} kept (`maasctl prompts activate {role} {v}` rolls back)"))
                        .unwrap_or_default()
                );
            }
            Ok(Outcome::Ok)
        }
        PromptsCommand::Activate { role, version, reason } => {
            let role = parse_role(&role)?;
            let mut client = connect(cfg).await?;
            let tx = client.transaction().await.map_err(crate::db::Error::from)?;
            let (was, found) = prompts::activate(&tx, role, version).await?;
            if !found {
                drop(tx); // rolls back: the previous version stays active
                eprintln!("{role} has no version {version}; nothing changed");
                return Ok(Outcome::Finding);
            }
            let detail = serde_json::json!({"role": role, "version": version, "previous": was});
            audit::record(&tx, "prompt_activate", actor, reason.as_deref(), &detail).await?;
            tx.commit().await.map_err(crate::db::Error::from)?;
            if json {
                println!("{detail}");
            } else {
                println!("{role}: version {version} is active");
            }
            Ok(Outcome::Ok)
        }
    }
}
