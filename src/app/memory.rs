//! A user's memory as every door reaches it: the caller's user id mapped
//! to the stored one, the pipeline's own search over it, and a turn
//! remembered outside a request. The caps on searches running at once are
//! the door's to take ([`super::caps`]) and are held here until the search
//! ends.

use uuid::Uuid;

use super::caller::{self, Principal};
use super::caps::Pass;
use super::error::{AppError, Code};
use super::input::query_text;
use super::{App, limits};
use crate::users::{self, UserKey};

/// Longest memory search, in characters.
pub const MAX_SEARCH_CHARS: usize = 2000;

/// The user `shown` of the caller's tenant, given in `field`: refused
/// (`user_not_allowed`, naming the field) when the caller is bound to
/// another user; else its [`UserKey`] ([`user_of`]). The one check of a
/// user id on every door.
pub async fn user(app: &App, who: &Principal, shown: Uuid, field: &str) -> Result<UserKey, AppError> {
    who.acts_for(shown, field)?;
    user_of(app, who, shown).await
}

/// The caller's user `shown` as a [`UserKey`] (stored id mapped in SQL for
/// a tenant); the caller's user binding is the caller's to check first.
pub async fn user_of(app: &App, who: &Principal, shown: Uuid) -> Result<UserKey, AppError> {
    if who.is_default() && shown.get_version_num() != 8 {
        return Ok(UserKey::new(shown));
    }
    let client = app.pool.get().await?;
    Ok(UserKey::of_tenant(
        caller::stored_user(&client, who, shown).await?,
        shown,
    ))
}

/// Searches `user`'s memory as the pipeline does ([`users::search`]),
/// holding `place` meanwhile: the one search of the HTTP route and of the
/// MCP tool `recall`. `q` must be 1 to [`MAX_SEARCH_CHARS`] characters.
pub async fn search(
    app: &App,
    user: UserKey,
    s: users::Search<'_>,
    place: Pass,
) -> Result<users::SearchView, AppError> {
    let _place = place;
    if s.query.trim().is_empty() {
        return Err(AppError::bad_request(Code::InvalidQuery, "q must not be empty"));
    }
    if s.query.chars().count() > MAX_SEARCH_CHARS {
        return Err(AppError::bad_request(
            Code::InvalidQuery,
            format!("q is longer than {MAX_SEARCH_CHARS} characters"),
        ));
    }
    let client = app.pool.get().await?;
    Ok(users::search(&client, &app.cfg, user, s, app.embedder.as_ref()).await?)
}

/// Stores `content` as what `user` said, a turn of `thread` (a new thread
/// when `None`), counted against the caller's tenant's
/// `requests_per_minute` as a request is ([`limits::check_limits`], in
/// the transaction that stores it): the one write of the MCP tool
/// `remember`. `content` is checked as a query is
/// ([`query_text`]).
pub async fn remember(
    app: &App,
    who: &Principal,
    user: UserKey,
    thread: Option<Uuid>,
    content: &str,
) -> Result<crate::repo::users::Remembered, AppError> {
    query_text("content", content)?;
    let mut client = app.pool.get().await?;
    if !who.limited {
        return Ok(users::remember(&client, user, thread, content).await?);
    }
    let tx = client.transaction().await.map_err(crate::db::Error::from)?;
    limits::check_limits(&tx, who, limits::Usage::Turn).await?;
    let turn = users::remember(&tx, user, thread, content).await?;
    tx.commit().await.map_err(crate::db::Error::from)?;
    Ok(turn)
}
