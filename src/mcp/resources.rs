//! The MCP resources of a user: `maas://users/{id}/memory` (the records,
//! newest first, with what is pending) and `maas://users/{id}/threads` (the
//! most recent threads). Listed for the caller's bound user; any user of
//! the caller's tenant is readable by URI unless the caller is bound.

use rmcp::model::{ReadResourceResult, Resource, ResourceContents};

use super::Server;
use crate::app::{AppError, Principal};
use crate::users::{self, Page};

/// Records per read of the memory resource.
const RECORDS: usize = 100;
/// Threads per read of the threads resource.
const THREADS: usize = 20;

/// The resources the caller is bound to (none for an unbound caller, who
/// names a user in the URI).
pub fn list(who: &Principal) -> Vec<Resource> {
    let Some(user) = who.user else {
        return Vec::new();
    };
    vec![
        Resource::new(format!("maas://users/{user}/memory"), "memory")
            .with_title("The user's long-term memory")
            .with_description("The records maas keeps about the user (summaries of their turns, newest first) and the turns not summarised yet.")
            .with_mime_type("application/json"),
        Resource::new(format!("maas://users/{user}/threads"), "threads")
            .with_title("The user's recent conversations")
            .with_description("The user's most recent threads: when each started and last changed, its turns and its newest turn.")
            .with_mime_type("application/json"),
    ]
}

/// Reads resource `uri` for the caller.
pub async fn read(server: &Server, who: &Principal, uri: &str) -> Result<ReadResourceResult, AppError> {
    let rest = uri
        .strip_prefix("maas://users/")
        .ok_or_else(|| AppError::not_found(format!("no resource {uri}")))?;
    let (id, what) = rest
        .split_once('/')
        .ok_or_else(|| AppError::not_found(format!("no resource {uri}")))?;
    let user = server.user(who, Some(id)).await?;
    let client = server.app.pool.get().await.map_err(AppError::from)?;
    let body = match what {
        "memory" => {
            let page = Page {
                limit: RECORDS,
                ..Page::default()
            };
            serde_json::to_string_pretty(&users::view(&client, user, &page).await?)
        }
        "threads" => serde_json::to_string_pretty(&serde_json::json!({
            "user_id": user,
            "threads": users::threads(&client, user, THREADS).await?,
        })),
        _ => return Err(AppError::not_found(format!("no resource {uri}"))),
    }
    .map_err(|e| AppError::internal(e.to_string()))?;
    Ok(ReadResourceResult::new(vec![
        ResourceContents::text(body, uri).with_mime_type("application/json"),
    ]))
}
