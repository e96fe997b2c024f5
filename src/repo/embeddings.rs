//! The embedder's statements (`sql/queries/embed_*.sql`): which users have
//! turns to embed, the next turns with the turn before each, and storing
//! embeddings with the user's mark in one statement (`turn_embeddings`,
//! `archive_marks.embedded_seq`).
//!
//! A large user's lists (`embedding_lists`, `embedding_centroids`,
//! `turn_embeddings.list`: sql/0028_embedding_lists.sql): their state, a
//! sample to train them from, storing them, assigning embeddings in
//! batches, and dropping them.
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
    LISTS_STATE = "embed_lists_state",
    LISTS_SAMPLE = "embed_lists_sample",
    LISTS_TRAIN = "embed_lists_train",
    LISTS_ASSIGN = "embed_lists_assign",
    LISTS_INCOMPLETE = "embed_lists_incomplete",
    LISTS_DROP = "embed_lists_drop",
    LISTS_CENTROIDS = "embed_lists_centroids",
    LISTS_BATCH = "embed_lists_batch",
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

super::row_struct! {
    /// A user's lists of one model and dimensions, and its embeddings of
    /// those.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct ListsState {
        /// The user's embeddings of the model and dimensions.
        pub turns: i64,
        /// Its lists (`None`: not trained).
        pub lists: Option<i32>,
        /// The embeddings they were trained at.
        pub trained_turns: Option<i64>,
        /// Every embedding has its list.
        pub complete: Option<bool>,
    }
}

super::row_struct! {
    /// Lists with embeddings left to assign.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Incomplete {
        pub user_id: Uuid,
        pub dims: i32,
    }
}

super::row_struct! {
    /// An embedding to assign, its parts as text (see [`parse_parts`]).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct ToAssign {
        pub id: i64,
        pub user_seq: i64,
        pub parts: String,
    }
}

super::row_struct! {
    /// A user's centroid, its parts as text, and when its lists were
    /// trained.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Centroid {
        pub parts: String,
        pub trained_at: chrono::DateTime<chrono::Utc>,
    }
}

/// The components of an embedding from the text of its parts (a cube[]:
/// `{"(0.1, -0.2, …)","(…)"}`), in order.
pub fn parse_parts(text: &str) -> Result<Vec<f32>, Error> {
    text.split([',', '{', '}', '"', '(', ')'])
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse::<f32>()
                .map_err(|e| Error::Unexpected(format!("an embedding's part {x:?}: {e}")))
        })
        .collect()
}

/// `user`'s lists of `model` and `dims`, and its count of such embeddings.
pub async fn lists_state(client: &impl GenericClient, user: Uuid, model: &str, dims: i32) -> Result<ListsState, Error> {
    super::query_one_as(client, LISTS_STATE, &[&user, &model, &dims]).await
}

/// `limit` of `user`'s embeddings of `model` and `dims` drawn at random
/// (the same for the same turns), as vectors.
pub async fn lists_sample(
    client: &impl GenericClient,
    user: Uuid,
    model: &str,
    dims: i32,
    limit: usize,
) -> Result<Vec<Vec<f32>>, Error> {
    let parts: Vec<String> =
        super::query_column(client, LISTS_SAMPLE, &[&user, &model, &dims, &as_limit(limit)], "parts").await?;
    parts.iter().map(|p| parse_parts(p)).collect()
}

/// Stores `user`'s lists of `model`: `centroids` (unit length, all of one
/// length), trained from `turns` embeddings; its embeddings are then to be
/// assigned from the first.
pub async fn lists_train(
    client: &impl GenericClient,
    user: Uuid,
    model: &str,
    centroids: &[Vec<f32>],
    turns: i64,
) -> Result<i64, Error> {
    let dims = centroids.first().map_or(0, Vec::len);
    if centroids.is_empty() || centroids.iter().any(|v| v.len() != dims) {
        return Err(Error::Unexpected(format!(
            "{} centroids, none or of differing lengths",
            centroids.len()
        )));
    }
    let flat: Vec<f32> = centroids.iter().flatten().copied().collect();
    let dims = i32::try_from(dims).unwrap_or(i32::MAX);
    let lists = i32::try_from(centroids.len()).unwrap_or(i32::MAX);
    let params: [&(dyn ToSql + Sync); 6] = [&user, &model, &dims, &lists, &flat, &turns];
    super::query_one_value(client, LISTS_TRAIN, &params, "centroids").await
}

/// `user`'s centroids of `model` and `dims`, in list order.
pub async fn lists_centroids(
    client: &impl GenericClient,
    user: Uuid,
    model: &str,
    dims: i32,
) -> Result<Vec<Centroid>, Error> {
    super::query_as(client, LISTS_CENTROIDS, &[&user, &model, &dims]).await
}

/// The next `limit` of `user`'s embeddings to assign to their lists.
pub async fn lists_batch(
    client: &impl GenericClient,
    user: Uuid,
    model: &str,
    dims: i32,
    limit: usize,
) -> Result<Vec<ToAssign>, Error> {
    super::query_as(client, LISTS_BATCH, &[&user, &model, &dims, &as_limit(limit)]).await
}

/// A batch of assignments (`embed_lists_assign.sql`).
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment<'a> {
    pub user_id: Uuid,
    pub model: &'a str,
    pub dims: i32,
    /// Embeddings (turn ids), and their lists in the same order.
    pub ids: &'a [i64],
    pub lists: &'a [i32],
    /// The lists' training the assignments were made with.
    pub trained_at: chrono::DateTime<chrono::Utc>,
    /// The user_seq they reach.
    pub assigned_seq: i64,
    /// No embedding is left to assign after them.
    pub complete: bool,
}

/// Stores a batch of assignments while the lists are those trained at
/// `a.trained_at`: the embeddings assigned, and whether the lists were
/// still those.
pub async fn lists_assign(client: &impl GenericClient, a: &Assignment<'_>) -> Result<(i64, bool), Error> {
    let params: [&(dyn ToSql + Sync); 8] = [
        &a.user_id,
        &a.model,
        &a.dims,
        &a.ids,
        &a.lists,
        &a.trained_at,
        &a.assigned_seq,
        &a.complete,
    ];
    let row = super::one_row(client, LISTS_ASSIGN, &params).await?;
    Ok((row.try_get("assigned")?, row.try_get("current")?))
}

/// Up to `limit` lists of `model` with embeddings left to assign.
pub async fn lists_incomplete(
    client: &impl GenericClient,
    model: &str,
    limit: usize,
) -> Result<Vec<Incomplete>, Error> {
    super::query_as(client, LISTS_INCOMPLETE, &[&model, &as_limit(limit)]).await
}

/// Deletes `user`'s lists of `model` and `dims` (and their centroids).
pub async fn lists_drop(client: &impl GenericClient, user: Uuid, model: &str, dims: i32) -> Result<u64, Error> {
    super::execute(client, LISTS_DROP, &[&user, &model, &dims]).await
}
