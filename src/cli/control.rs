//! `maasctl pause` / `maasctl resume`: stop and restart claiming in every
//! daemon at once, through the one-row `maas_control` table that the claim
//! statement reads. No restart; running stages finish.

use super::{CliError, Outcome, connect};
use crate::config::Config;
use crate::control;

pub async fn pause(cfg: &Config, actor: &str, reason: Option<&str>, json: bool) -> Result<Outcome, CliError> {
    set_paused(cfg, true, actor, reason, json).await
}

pub async fn resume(cfg: &Config, actor: &str, reason: Option<&str>, json: bool) -> Result<Outcome, CliError> {
    set_paused(cfg, false, actor, reason, json).await
}

/// Pauses or resumes and says what changed.
async fn set_paused(
    cfg: &Config,
    pause: bool,
    actor: &str,
    reason: Option<&str>,
    json: bool,
) -> Result<Outcome, CliError> {
    let client = connect(cfg).await?;
    let was = if pause {
        control::pause(&client, actor, reason).await?
    } else {
        control::resume(&client, actor, reason).await?
    };
    if json {
        println!("{}", serde_json::json!({"paused": pause, "was_paused": was}));
        return Ok(Outcome::Ok);
    }
    let lines: &[&str] = match (pause, was) {
        (true, true) => &["claiming was already paused; the reason is now updated"],
        (true, false) => &[
            "paused: no daemon claims new work from its next claim on; running stages finish",
            "resume with `maasctl resume`",
        ],
        (false, true) => &["resumed: daemons claim again (rang the doorbell for due requests)"],
        (false, false) => &["claiming was not paused"],
    };
    for line in lines {
        println!("{line}");
    }
    Ok(Outcome::Ok)
}
