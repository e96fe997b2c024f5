//! System prompts (`system_prompts`): versioned per role, one active. A
//! change takes the role's advisory lock, in the caller's transaction, so
//! changes of one role are serialised.

use super::GenericClient;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::db::Error;
use crate::model::{PromptRole, Prompts};

super::statements! {
    ACTIVE = "active_prompts",
    LIST = "prompts_list",
    SHOW = "prompts_show",
    LOCK = "prompts_lock",
    DEACTIVATE = "prompts_deactivate",
    INSERT = "prompts_insert",
    ACTIVATE = "prompts_activate",
    VERSIONS = "prompts_versions",
}

super::row_struct! {
    /// A row of `active_prompts.sql`.
    struct Active {
        role = "role_name": PromptRole,
        text = "prompt_template": String,
    }
}

/// The active prompt of every role.
pub async fn active_prompts(client: &impl GenericClient) -> Result<Prompts, Error> {
    let mut prompts = Prompts::default();
    for a in super::query_as::<Active>(client, ACTIVE, &[]).await? {
        prompts.set(a.role, a.text);
    }
    Ok(prompts)
}

super::row_struct! {
    /// The prompts of one role.
    #[derive(Debug, Clone, Serialize)]
    pub struct PromptSummary {
        pub role = "role_name": PromptRole,
        pub versions: i64,
        pub active_version: Option<i32>,
        pub latest_version: i32,
        pub active_since: Option<DateTime<Utc>>,
        pub active_chars: Option<i32>,
    }
}

/// Every role that has prompts, by name.
pub async fn list(client: &impl GenericClient) -> Result<Vec<PromptSummary>, Error> {
    super::query_as(client, LIST, &[]).await
}

super::row_struct! {
    /// One prompt version.
    #[derive(Debug, Clone, Serialize)]
    pub struct Prompt {
        pub role = "role_name": PromptRole,
        pub version: i32,
        pub active = "is_active": bool,
        pub created_at: DateTime<Utc>,
        pub text = "prompt_template": String,
    }
}

/// Version `version` of `role`'s prompt, or the active one.
pub async fn show(
    client: &impl GenericClient,
    role: PromptRole,
    version: Option<i32>,
) -> Result<Option<Prompt>, Error> {
    super::query_opt_as(client, SHOW, &[&role, &version]).await
}

/// Locks `role` for this transaction and deactivates its active version;
/// returns that version.
async fn lock_and_deactivate(client: &impl GenericClient, role: PromptRole) -> Result<Option<i32>, Error> {
    super::execute(client, LOCK, &[&role]).await?;
    super::query_opt_value(client, DEACTIVATE, &[&role], "version").await
}

/// Adds `text` as the next version of `role`'s prompt and activates it, in
/// the caller's transaction. Returns (previously active version, new version).
pub async fn set(client: &impl GenericClient, role: PromptRole, text: &str) -> Result<(Option<i32>, i32), Error> {
    let was = lock_and_deactivate(client, role).await?;
    let new = super::query_one_value(client, INSERT, &[&role, &text], "version").await?;
    Ok((was, new))
}

/// Activates an existing version of `role`'s prompt, in the caller's
/// transaction. Returns (previously active version, whether the version exists).
pub async fn activate(
    client: &impl GenericClient,
    role: PromptRole,
    version: i32,
) -> Result<(Option<i32>, bool), Error> {
    let was = lock_and_deactivate(client, role).await?;
    let found = super::query_found(client, ACTIVATE, &[&role, &version]).await?;
    Ok((was, found))
}

// ---- the operator console's prompts page --------------------------------

super::row_struct! {
    /// One kept version of a role's prompt (without its text).
    #[derive(Debug, Clone, Serialize)]
    pub struct PromptVersion {
        pub version: i32,
        pub active = "is_active": bool,
        pub created_at: DateTime<Utc>,
        pub chars: i32,
    }
}

/// Every version of `role`'s prompt, newest first.
pub async fn versions(client: &impl GenericClient, role: PromptRole) -> Result<Vec<PromptVersion>, Error> {
    super::query_as(client, VERSIONS, &[&role]).await
}
