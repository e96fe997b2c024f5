//! `maasctl pause` / `maasctl resume`: stop and restart claiming in every
//! daemon at once, through the one-row `maas_control` table that the claim
//! statement reads. No restart; running stages finish.

use super::{CliError, Outcome, connect};
use crate::config::Config;
use crate::control;

pub async fn pause(cfg: &Config, actor: &str, reason: Option<&str>, json: bool) -> Result<Outcome, CliError> {
    let client = connect(cfg).await?;
    let was = control::pause(&client, actor, reason).await?;
    if json {
        println!("{}", serde_json::json!({"paused": true, "was_paused": was}));
    } else if was {
        println!("claiming was already paused; the reason is now updated");
    } else {
        println!("paused: no daemon claims new work from its next claim on; running stages finish");
        println!("resume with `maasctl resume`");
    }
    Ok(Outcome::Ok)
}

pub async fn resume(cfg: &Config, actor: &str, reason: Option<&str>, json: bool) -> Result<Outcome, CliError> {
    let client = connect(cfg).await?;
    let was = control::resume(&client, actor, reason).await?;
    if json {
        println!("{}", serde_json::json!({"paused": false, "was_paused": was}));
    } else if was {
        println!("resumed: daemons claim again (rang the doorbell for due requests)");
    } else {
        println!("claiming was not paused");
    }
    Ok(Outcome::Ok)
}
