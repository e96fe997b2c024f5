//! The embedder's statements (`sql/queries/embed_*.sql`): which users have
//! turns to embed, the next turns with the turn before each, and storing
//! embeddings with the user's mark in one statement (`turn_embeddings`,
//! `archive_marks.embedded_seq`).
//!
//! Guarantee: a mark moves only in the statement that stores the
//! embeddings it covers, so a crash between two batches loses nothing and
//! at worst embeds a batch twice (an overwrite).

use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{GenericClient, as_limit};
use crate::db::Error;

super::statements! {
    PENDING = "embed_pending",
    TURNS = "embed_turns",
    STORE = "embed_store",
    BACKLOG = "embed_backlog",
    PENDING_SINCE = "embed_pending_since",
    TOP = "embed_top",
}

super::row_struct! {
    /// A user with turns to embed: those with `embedded_seq < user_seq <=
    /// logged_seq`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Pending {
        pub user_id: Uuid,
        pub embedded_seq: i64,
        pub logged_seq: i64,
    }
}

super::row_struct! {
    /// A turn to embed, with the text of the turns on either side of it
    /// in its thread.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct TurnText {
        pub id: i64,
        pub user_seq: i64,
        /// Embedded before, without the turn after it (now there).
        pub again: bool,
        pub content: String,
        pub previous: Option<String>,
        pub next: Option<String>,
    }
}

super::row_struct! {
    /// What is left to embed with one model (`maasctl doctor`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Backlog {
        /// Users with turns not yet embedded.
        pub users: i64,
        /// Their turns not yet embedded (by sequence number).
        pub turns: i64,
    }
}

/// What is left to embed with `model`.
pub async fn backlog(client: &impl GenericClient, model: &str) -> Result<Backlog, Error> {
    super::query_one_as(client, BACKLOG, &[&model]).await
}

/// Up to `limit` users with turns not yet embedded with `model`.
pub async fn pending(client: &impl GenericClient, model: &str, limit: usize) -> Result<Vec<Pending>, Error> {
    super::query_as(client, PENDING, &[&model, &as_limit(limit)]).await
}

/// Up to `limit` users with turns not yet embedded with `model`, among the
/// users of the turns whose id is over `after_id` only.
pub async fn pending_since(
    client: &impl GenericClient,
    model: &str,
    limit: usize,
    after_id: i64,
) -> Result<Vec<Pending>, Error> {
    super::query_as(client, PENDING_SINCE, &[&model, &as_limit(limit), &after_id]).await
}

/// The newest turn's id (0 when there is none).
pub async fn top(client: &impl GenericClient) -> Result<i64, Error> {
    super::query_one_value(client, TOP, &[], "top").await
}

/// The next `limit` turns of `user` after `after`, oldest first, with the
/// turns before them to embed again (see `embed_turns.sql`).
pub async fn turns(client: &impl GenericClient, user: Uuid, after: i64, limit: usize) -> Result<Vec<TurnText>, Error> {
    super::query_as(client, TURNS, &[&user, &after, &as_limit(limit)]).await
}

/// Stores one embedding per turn of `ids` (same order, all of one length)
/// and moves `user`'s mark to `mark`; the number stored (a turn deleted
/// meanwhile is skipped).
pub async fn store(
    client: &impl GenericClient,
    user: Uuid,
    model: &str,
    ids: &[i64],
    vectors: &[Vec<f32>],
    mark: i64,
) -> Result<i64, Error> {
    let dims = vectors.first().map_or(0, Vec::len);
    if vectors.len() != ids.len() || vectors.iter().any(|v| v.len() != dims) {
        return Err(Error::Unexpected(format!(
            "{} embeddings for {} turns, or of differing lengths",
            vectors.len(),
            ids.len()
        )));
    }
    let flat: Vec<f32> = vectors.iter().flatten().copied().collect();
    let dims = i32::try_from(dims).unwrap_or(i32::MAX);
    let params: [&(dyn ToSql + Sync); 6] = [&user, &model, &ids, &flat, &dims, &mark];
    let row = super::one_row(client, STORE, &params).await?;
    Ok(row.try_get("stored")?)
}
