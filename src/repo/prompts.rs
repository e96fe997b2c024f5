//! System prompts (`system_prompts`): versioned per role, one active. A
//! change takes the role's advisory lock, in the caller's transaction, so
//! changes of one role are serialised.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde::Serialize;
use tokio_postgres::Row;

use super::{FromRow, rows_as};
use crate::db::Error;
use crate::model::{PromptRole, Prompts};

const ACTIVE: &str = include_str!("../../sql/queries/active_prompts.sql");
const LIST: &str = include_str!("../../sql/queries/prompts_list.sql");
const SHOW: &str = include_str!("../../sql/queries/prompts_show.sql");
const LOCK: &str = include_str!("../../sql/queries/prompts_lock.sql");
const DEACTIVATE: &str = include_str!("../../sql/queries/prompts_deactivate.sql");
const INSERT: &str = include_str!("../../sql/queries/prompts_insert.sql");
const ACTIVATE: &str = include_str!("../../sql/queries/prompts_activate.sql");

/// This file's statements, for [`super::all`].
pub(super) const STATEMENTS: &[(&str, &str)] = &[
    ("active_prompts", ACTIVE),
    ("prompts_list", LIST),
    ("prompts_show", SHOW),
    ("prompts_lock", LOCK),
    ("prompts_deactivate", DEACTIVATE),
    ("prompts_insert", INSERT),
    ("prompts_activate", ACTIVATE),
];

/// The active prompt of every role.
pub async fn active_prompts(client: &impl GenericClient) -> Result<Prompts, Error> {
    let stmt = client.prepare_cached(ACTIVE).await?;
    let mut prompts = Prompts::default();
    for r in client.query(&stmt, &[]).await? {
        let role: String = r.try_get("role_name")?;
        let text: String = r.try_get("prompt_template")?;
        if let Ok(role) = role.parse::<PromptRole>() {
            prompts.set(role, text);
        }
    }
    Ok(prompts)
}

/// The prompts of one role.
#[derive(Debug, Clone, Serialize)]
pub struct PromptSummary {
    pub role: String,
    pub versions: i64,
    pub active_version: Option<i32>,
    pub latest_version: i32,
    pub active_since: Option<DateTime<Utc>>,
    pub active_chars: Option<i32>,
}

impl FromRow for PromptSummary {
    fn from_row(r: &Row) -> Result<PromptSummary, Error> {
        Ok(PromptSummary {
            role: r.try_get("role_name")?,
            versions: r.try_get("versions")?,
            active_version: r.try_get("active_version")?,
            latest_version: r.try_get("latest_version")?,
            active_since: r.try_get("active_since")?,
            active_chars: r.try_get("active_chars")?,
        })
    }
}

/// Every role that has prompts, by name.
pub async fn list(client: &impl GenericClient) -> Result<Vec<PromptSummary>, Error> {
    let stmt = client.prepare_cached(LIST).await?;
    rows_as(&client.query(&stmt, &[]).await?)
}

/// One prompt version.
#[derive(Debug, Clone, Serialize)]
pub struct Prompt {
    pub role: String,
    pub version: i32,
    pub active: bool,
    pub created_at: DateTime<Utc>,
    pub text: String,
}

/// Version `version` of `role`'s prompt, or the active one.
pub async fn show(client: &impl GenericClient, role: &str, version: Option<i32>) -> Result<Option<Prompt>, Error> {
    let stmt = client.prepare_cached(SHOW).await?;
    let Some(r) = client.query_opt(&stmt, &[&role, &version]).await? else {
        return Ok(None);
    };
    Ok(Some(Prompt {
        role: role.to_owned(),
        version: r.try_get("version")?,
        active: r.try_get("is_active")?,
        created_at: r.try_get("created_at")?,
        text: r.try_get("prompt_template")?,
    }))
}

/// Locks `role` for this transaction and deactivates its active version;
/// returns that version.
async fn lock_and_deactivate(client: &impl GenericClient, role: &str) -> Result<Option<i32>, Error> {
    let lock = client.prepare_cached(LOCK).await?;
    client.execute(&lock, &[&role]).await?;
    let off = client.prepare_cached(DEACTIVATE).await?;
    Ok(client
        .query_opt(&off, &[&role])
        .await?
        .map(|r| r.try_get("version"))
        .transpose()?)
}

/// Adds `text` as the next version of `role`'s prompt and activates it, in
/// the caller's transaction. Returns (previously active version, new version).
pub async fn set(client: &impl GenericClient, role: &str, text: &str) -> Result<(Option<i32>, i32), Error> {
    let was = lock_and_deactivate(client, role).await?;
    let ins = client.prepare_cached(INSERT).await?;
    let new: i32 = client.query_one(&ins, &[&role, &text]).await?.try_get("version")?;
    Ok((was, new))
}

/// Activates an existing version of `role`'s prompt, in the caller's
/// transaction. Returns (previously active version, whether the version exists).
pub async fn activate(client: &impl GenericClient, role: &str, version: i32) -> Result<(Option<i32>, bool), Error> {
    let was = lock_and_deactivate(client, role).await?;
    let on = client.prepare_cached(ACTIVATE).await?;
    let found = client.query_opt(&on, &[&role, &version]).await?.is_some();
    Ok((was, found))
}
