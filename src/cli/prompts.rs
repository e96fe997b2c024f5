//! `maasctl prompts list|show|set|activate`: the versioned system prompts of
//! each role. `set` adds a new version and activates it in one transaction
//! (the old versions are kept); `activate` rolls back to any kept version.
//! Changes are serialised per role and recorded in `operator_actions`.

use std::io::Read;
use std::path::{Path, PathBuf};

use clap::Subcommand;

use super::{CliError, Outcome, connect};
use crate::config::Config;
use crate::control;
use crate::model::PromptRole;
use crate::repo::prompts::{self, PromptSummary};

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

/// The role an operator names ([`control::parse_role`]), or a usage error.
fn parse_role(text: &str) -> Result<PromptRole, CliError> {
    control::parse_role(text).map_err(|_| {
        CliError::Usage(format!(
            "unknown role {text:?} (one of {})",
            PromptRole::NAMES.join(", ")
        ))
    })
}

pub async fn run(cfg: &Config, cmd: PromptsCommand, actor: &str, json: bool) -> Result<Outcome, CliError> {
    match cmd {
        PromptsCommand::List => list(cfg, json).await,
        PromptsCommand::Show { role, version } => show(cfg, parse_role(&role)?, version, json).await,
        PromptsCommand::Set { role, file, reason } => {
            let role = parse_role(&role)?;
            let text = read_prompt(&file)?;
            set(cfg, role, &text, actor, reason.as_deref(), json).await
        }
        PromptsCommand::Activate { role, version, reason } => {
            activate(cfg, parse_role(&role)?, version, actor, reason.as_deref(), json).await
        }
    }
}

/// One line of `list` for a role's prompts.
fn summary_line(r: &PromptSummary) -> String {
    let or = |v: Option<String>, none: &str| v.unwrap_or_else(|| none.to_owned());
    format!(
        "{:<15} {:>7} {:>8} {:>7} {:>8}  {}",
        r.role,
        or(r.active_version.map(|v| v.to_string()), "NONE"),
        r.versions,
        r.latest_version,
        or(r.active_chars.map(|c| c.to_string()), "-"),
        or(r.active_since.map(|t| t.to_rfc3339()), "")
    )
}

/// `prompts list`: a finding when a role has no active prompt.
async fn list(cfg: &Config, json: bool) -> Result<Outcome, CliError> {
    let client = connect(cfg).await?;
    let rows = prompts::list(&client).await?;
    if json {
        println!("{}", serde_json::to_string(&rows).map_err(std::io::Error::other)?);
        return Ok(Outcome::Ok);
    }
    let header = format!(
        "{:<15} {:>7} {:>8} {:>7} {:>8}  active since",
        "role", "active", "versions", "latest", "chars"
    );
    println!("{header}");
    rows.iter().map(summary_line).for_each(|line| println!("{line}"));
    let missing: Vec<&str> = PromptRole::ALL
        .into_iter()
        .filter(|role| !rows.iter().any(|r| r.role == *role && r.active_version.is_some()))
        .map(PromptRole::as_str)
        .collect();
    if missing.is_empty() {
        return Ok(Outcome::Ok);
    }
    println!("no active prompt: {}", missing.join(", "));
    Ok(Outcome::Finding)
}

/// `prompts show`: the text on stdout, what it is on stderr.
async fn show(cfg: &Config, role: PromptRole, version: Option<i32>, json: bool) -> Result<Outcome, CliError> {
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

/// The text of a prompt file (`-`: standard input); empty text is refused.
fn read_prompt(file: &Path) -> Result<String, CliError> {
    let text = if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(file).map_err(|e| CliError::Usage(format!("cannot read {}: {e}", file.display())))?
    };
    if text.trim().is_empty() {
        return Err(CliError::Usage(format!(
            "{} is empty; a prompt needs text",
            file.display()
        )));
    }
    Ok(text)
}

/// `prompts set`: [`control::set_prompt`].
async fn set(
    cfg: &Config,
    role: PromptRole,
    text: &str,
    actor: &str,
    reason: Option<&str>,
    json: bool,
) -> Result<Outcome, CliError> {
    let mut client = connect(cfg).await?;
    let change = control::set_prompt(&mut client, role, text, actor, reason).await?;
    let chars = text.chars().count();
    if json {
        let mut detail = change.detail();
        detail["chars"] = serde_json::json!(chars);
        println!("{detail}");
    } else {
        println!(
            "{role}: version {} is active ({chars} characters){}",
            change.version,
            change
                .previous
                .map(|v| format!("; version {v} kept (`maasctl prompts activate {role} {v}` rolls back)"))
                .unwrap_or_default()
        );
    }
    Ok(Outcome::Ok)
}

/// `prompts activate`: [`control::activate_prompt`]; a finding when the
/// role has no such version.
async fn activate(
    cfg: &Config,
    role: PromptRole,
    version: i32,
    actor: &str,
    reason: Option<&str>,
    json: bool,
) -> Result<Outcome, CliError> {
    let mut client = connect(cfg).await?;
    let Some(change) = control::activate_prompt(&mut client, role, version, actor, reason).await? else {
        eprintln!("{role} has no version {version}; nothing changed");
        return Ok(Outcome::Finding);
    };
    if json {
        println!("{}", change.detail());
    } else {
        println!("{role}: version {version} is active");
    }
    Ok(Outcome::Ok)
}
