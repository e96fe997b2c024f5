//! A user's data, for the HTTP API, the console and `maasctl users`
//! alike: see it ([`view`], [`search`]), correct it ([`correct`]), forget
//! it ([`forget_now`], [`forget_in_background`]). Every front end reaches a
//! correction or a forget through these functions only; each writes its
//! record of who and why (the `operator_actions` row of a correction, the
//! tombstone's actor and reason of a forget) in the statement that acts.
//!
//! Guarantees:
//! - Every function takes the user as a [`UserKey`]; the SQL filters by it
//!   (invariant 7).
//! - A user is *unknown* when nothing is held (no archive mark, request or
//!   record) and no tombstone exists; *forgotten* once a tombstone exists;
//!   *erasing* while its erase has not finished. Corrections and views
//!   answer [`UserError::Unknown`], [`UserError::Forgotten`] or
//!   [`UserError::Erasing`] accordingly.
//! - [`forget`] commits the tombstone first (from then on the guard
//!   triggers of `sql/0010_user_data.sql` refuse the user's requests and
//!   drop its turns and records), waits for the writers that passed the
//!   guard before it, then deletes in batches of at most `batch` rows, each
//!   its own short statement, until every table is empty of the user; only
//!   then is the tombstone marked finished. An erase that stopped half-way
//!   (a crash) is resumed by [`Eraser`] or by calling [`erase`] again: every
//!   step is idempotent.

pub mod export;
mod retrieve;

use std::sync::Arc;
use std::time::Duration;

use crate::repo::GenericClient;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde::Serialize;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::Config;
use crate::db::{self, Pool};
use crate::model::MemoryItem;
use crate::repo;
pub use crate::repo::users::{Corrected, EraseTable, RecordView, TurnView, UserKey, UserState, Why};
use crate::service::Service;
pub use retrieve::{Embedded, Searcher, retrieve};

/// SQLSTATE of a request refused because its user was forgotten.
pub const REFUSED_SQLSTATE: &str = "MA410";

/// Rows per erase statement.
pub const ERASE_BATCH: usize = 500;

/// Pause between erase batches, so a large erase does not hog I/O.
const BETWEEN_BATCHES: Duration = Duration::from_millis(5);

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("user {0}: nothing is held about this user")]
    Unknown(Uuid),
    #[error("user {user} was forgotten at {at} by {by}")]
    Forgotten {
        user: Uuid,
        at: chrono::DateTime<chrono::Utc>,
        by: String,
    },
    #[error("user {0} is being forgotten; try again when the erase has finished")]
    Erasing(Uuid),
    #[error("user {user}: no {what} {id}")]
    NoSuch { user: Uuid, what: &'static str, id: i64 },
    #[error(transparent)]
    Db(#[from] db::Error),
}

impl From<deadpool_postgres::PoolError> for UserError {
    fn from(e: deadpool_postgres::PoolError) -> UserError {
        UserError::Db(e.into())
    }
}

/// True when `e` is the guard's refusal of a request for a forgotten user.
pub fn is_refusal(e: &db::Error) -> bool {
    matches!(e, db::Error::Postgres(p) if p.code().is_some_and(|c| c.code() == REFUSED_SQLSTATE))
}

/// Where a user stands that is neither unknown nor forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// Something is held and no erase happened or runs.
    Held,
    /// An erase was begun and has not finished (running, or stopped by a crash).
    Erasing,
}

/// Where `user` stands by its state `st`: refused when it was forgotten
/// (the erase finished) or nothing is held.
fn standing(st: &UserState, user: UserKey) -> Result<Standing, UserError> {
    match (&st.forgotten_at, &st.erase_finished_at) {
        (Some(_), None) => Ok(Standing::Erasing),
        (Some(at), Some(_)) => Err(UserError::Forgotten {
            user: user.shown,
            at: *at,
            by: st.forgotten_by.clone().unwrap_or_default(),
        }),
        _ if !st.is_known() => Err(UserError::Unknown(user.shown)),
        _ => Ok(Standing::Held),
    }
}

/// The state of `user`, refused unless something is held and no erase
/// happened or runs.
async fn live_state(client: &impl GenericClient, user: UserKey) -> Result<UserState, UserError> {
    let st = repo::users::state(client, user).await?;
    match standing(&st, user)? {
        Standing::Held => Ok(st),
        Standing::Erasing => Err(UserError::Erasing(user.shown)),
    }
}

/// Which page of the user's memory to show.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// Records with a smaller id than this (the `next_before` of the last page).
    pub before: Option<i64>,
    /// Pending turns with a smaller `user_seq` than this.
    pub turns_before: Option<i64>,
    pub limit: usize,
}

/// The user's memory: one page of records (newest first) and of the turns
/// not archived yet.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryView {
    pub user_id: Uuid,
    pub memory_version: i64,
    /// Turns logged, archived, and pending (logged − archived).
    pub logged_seq: i64,
    pub archived_seq: i64,
    pub pending: i64,
    pub records: Vec<RecordView>,
    /// Pass as `before` for the next page of records; `None` on the last.
    pub next_before: Option<i64>,
    pub pending_turns: Vec<TurnView>,
    /// Pass as `turns_before` for the next page of pending turns.
    pub next_turns_before: Option<i64>,
}

/// One page of `user`'s memory.
pub async fn view(client: &impl GenericClient, user: UserKey, page: &Page) -> Result<MemoryView, UserError> {
    let st = live_state(client, user).await?;
    let limit = page.limit.max(1);
    let mut records = repo::users::records(client, user, page.before, limit + 1).await?;
    let next_before = more(&mut records, limit)
        .then(|| records.last().map(|r| r.id))
        .flatten();
    let mut turns = repo::users::pending_turns(client, user, page.turns_before, limit + 1).await?;
    let next_turns_before = more(&mut turns, limit)
        .then(|| turns.last().map(|t| t.user_seq))
        .flatten();
    let logged = st.logged_seq.unwrap_or(0);
    let archived = st.archived_seq.unwrap_or(0);
    Ok(MemoryView {
        user_id: user.shown,
        memory_version: st.memory_version.unwrap_or(0),
        logged_seq: logged,
        archived_seq: archived,
        pending: logged - archived,
        records,
        next_before,
        pending_turns: turns,
        next_turns_before,
    })
}

/// Cuts `rows` to `limit`; true when there were more.
fn more<T>(rows: &mut Vec<T>, limit: usize) -> bool {
    let more = rows.len() > limit;
    rows.truncate(limit);
    more
}

/// What `?q=` found: the hits of the pipeline's own retrieval, with scores.
#[derive(Debug, Clone, Serialize)]
pub struct SearchView {
    pub user_id: Uuid,
    pub memory_version: i64,
    pub query: String,
    /// The period the time phrase named (`when`), whose items come first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_range: Option<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)>,
    pub hits: Vec<MemoryItem>,
}

/// What to search a user's memory for: the text, an optional time phrase
/// (`last week`, `in May 2023`, `вчера`: the forms of
/// [`crate::timescope::range()`]) and at most how many items.
#[derive(Debug, Clone, Copy, Default)]
pub struct Search<'a> {
    pub query: &'a str,
    pub when: Option<&'a str>,
    pub limit: Option<usize>,
}

/// Runs the retrieval the pipeline runs for a request of `user` whose
/// search text is `s.query` (long-term memory only: no thread, no request):
/// the same plan ([`crate::stage::memory::plan`], with `s.when` as the
/// analysis' time scope, so items inside that period come first) and the
/// same ranking, with its semantic part when `embedder` is given; a query
/// that cannot be embedded is searched on full text alone, as in the
/// pipeline. At most `s.limit` items, in the order the assembler packs them.
pub async fn search(
    client: &deadpool_postgres::Client,
    cfg: &Config,
    user: UserKey,
    s: Search<'_>,
    embedder: Option<&crate::llm::embed::Embedder>,
) -> Result<SearchView, UserError> {
    let st = live_state(client, user).await?;
    let analysis = crate::stage::Analysis::from_json(&serde_json::json!({
        "needs_context": true,
        "context_type": "topic",
        "time_scope": s.when.unwrap_or("none"),
    }))
    .map_err(|e| UserError::Db(db::Error::Unexpected(format!("the search's plan: {e}"))))?;
    let plan = crate::stage::memory::plan(Some(&analysis), s.query, None, chrono::Utc::now());
    let embedding = crate::llm::embed::Embedder::for_search(embedder, &plan.query)
        .await
        .map(|(e, model)| (e, model.to_owned()));
    let who = Searcher {
        user_id: user.user_id,
        request_id: Uuid::nil(),
    };
    let mut hits = retrieve(client, &cfg.memory, &plan, who, &embedding, &[]).await?;
    if let Some(limit) = s.limit {
        hits.truncate(limit);
    }
    Ok(SearchView {
        user_id: user.shown,
        memory_version: st.memory_version.unwrap_or(0),
        query: s.query.to_owned(),
        time_range: plan.time_range,
        hits,
    })
}

/// Stores `content` as a turn the user said (`user_query`) in `thread`, or
/// in a new thread: a row of `raw_logs` like the turns of the SQL
/// interface, which the archivist and the embedder take up like any other.
/// Refused for a user that was forgotten or is being forgotten.
pub async fn remember(
    client: &impl GenericClient,
    user: UserKey,
    thread: Option<Uuid>,
    content: &str,
) -> Result<repo::users::Remembered, UserError> {
    let st = repo::users::state(client, user).await?;
    if standing(&st, user).or_else(|e| match e {
        UserError::Unknown(_) => Ok(Standing::Held),
        e => Err(e),
    })? == Standing::Erasing
    {
        return Err(UserError::Erasing(user.shown));
    }
    let thread = thread.unwrap_or_else(Uuid::new_v4);
    repo::users::remember(client, user, thread, content)
        .await?
        .ok_or(UserError::Erasing(user.shown))
}

/// The user's most recent threads (newest first), at most `limit`.
pub async fn threads(
    client: &impl GenericClient,
    user: UserKey,
    limit: usize,
) -> Result<Vec<repo::users::ThreadView>, UserError> {
    live_state(client, user).await?;
    Ok(repo::users::threads(client, user, limit).await?)
}

/// One correction of a user's memory.
#[derive(Debug, Clone, Copy)]
pub enum Correction<'a> {
    DeleteRecord(i64),
    DeleteTurn(i64),
    ReplaceSummary { record: i64, summary: &'a str },
}

/// Applies `c` to `user`'s memory, bumps the memory version and records
/// who and why in `operator_actions`, in one statement.
pub async fn correct(
    client: &impl GenericClient,
    user: UserKey,
    c: Correction<'_>,
    why: Why<'_>,
) -> Result<Corrected, UserError> {
    live_state(client, user).await?;
    let (done, what, id) = match c {
        Correction::DeleteRecord(id) => (repo::users::delete_record(client, user, id, why).await?, "record", id),
        Correction::DeleteTurn(id) => (repo::users::delete_turn(client, user, id, why).await?, "turn", id),
        Correction::ReplaceSummary { record, summary } => (
            repo::users::replace_summary(client, user, record, summary, why).await?,
            "record",
            record,
        ),
    };
    done.ok_or(UserError::NoSuch {
        user: user.shown,
        what,
        id,
    })
}

/// What [`forget`] did before the erase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begun {
    /// The tombstone is new: erase now.
    Started,
    /// An erase was begun before and has not finished (running, or stopped
    /// by a crash): [`erase`] resumes it.
    Unfinished,
}

/// Writes the tombstone of `user`. Unknown users and users forgotten
/// already are refused.
pub async fn forget(client: &impl GenericClient, user: UserKey, why: Why<'_>) -> Result<Begun, UserError> {
    let st = repo::users::state(client, user).await?;
    if standing(&st, user)? == Standing::Erasing {
        return Ok(Begun::Unfinished);
    }
    if repo::users::forget_begin(client, user, why).await? {
        tracing::info!(user = %user, actor = why.actor, "users: forgetting a user");
        Ok(Begun::Started)
    } else {
        // Another caller wrote the tombstone in between.
        Ok(Begun::Unfinished)
    }
}

/// Forgets `user` now, in the caller's task (`maasctl users forget`):
/// writes the tombstone ([`forget`]), then erases ([`erase`]), resuming an
/// erase begun before. Takes a connection of `pool` for the tombstone and
/// gives it back before the erase, so a pool of one connection does.
pub async fn forget_now(pool: &Pool, user: UserKey, why: Why<'_>) -> Result<(Begun, Erased), UserError> {
    let begun = forget(&pool.get().await?, user, why).await?;
    let erased = erase(pool, user, ERASE_BATCH).await?;
    Ok((begun, erased))
}

/// Forgets `user` with the erase in a task of its own (the API answers at
/// once): writes the tombstone ([`forget`]) and starts [`erase`]; an erase
/// that stops is resumed by [`Eraser`]. An erase begun before is refused
/// as [`UserError::Erasing`].
pub async fn forget_in_background(pool: &Pool, user: UserKey, why: Why<'_>) -> Result<(), UserError> {
    if forget(&pool.get().await?, user, why).await? == Begun::Unfinished {
        return Err(UserError::Erasing(user.shown));
    }
    let pool = pool.clone();
    tokio::spawn(async move {
        if let Err(e) = erase(&pool, user, ERASE_BATCH).await {
            tracing::warn!(user = %user, error = %e, "users: erase stopped; the eraser service resumes it");
        }
    });
    Ok(())
}

/// Rows deleted by an erase, by table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Erased(pub std::collections::BTreeMap<&'static str, i64>);

impl Erased {
    pub fn to_json(&self) -> Value {
        Value::Object(
            self.0
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
                .collect::<Map<_, _>>(),
        )
    }
}

/// Erases everything held about `user` after its tombstone: waits for the
/// writers that passed the guard before it, deletes table by table in
/// batches of `batch` rows, repeats until a whole pass deletes nothing,
/// then marks the tombstone finished. Idempotent; safe to run twice at once.
pub async fn erase(pool: &Pool, user: UserKey, batch: usize) -> Result<Erased, UserError> {
    let batch = batch.max(1);
    let client = pool.get().await?;
    repo::users::forget_barrier(&client, user).await?;
    let full = i64::try_from(batch).unwrap_or(i64::MAX);
    let mut erased = Erased::default();
    loop {
        let mut pass = 0;
        for table in EraseTable::ALL {
            loop {
                let n = repo::users::erase_batch(&client, user, table, batch).await?;
                *erased.0.entry(table.as_str()).or_default() += n;
                pass += n;
                if n < full {
                    break;
                }
                tokio::time::sleep(BETWEEN_BATCHES).await;
            }
        }
        if pass == 0 {
            break;
        }
    }
    repo::users::forget_finish(&client, user, &erased.to_json()).await?;
    tracing::info!(user = %user, erased = %erased.to_json(), "users: user forgotten");
    Ok(erased)
}

/// Resumes erases left unfinished (a daemon that died mid-erase), as a
/// daemon service: every `interval`, each tombstone unfinished for longer
/// than `interval` is erased again.
pub struct Eraser {
    pool: Pool,
    interval: Duration,
}

impl Eraser {
    pub fn new(pool: Pool, interval: Duration) -> Eraser {
        Eraser { pool, interval }
    }
}

impl Service for Eraser {
    fn name(&self) -> &'static str {
        "eraser"
    }

    fn run(self: Arc<Self>, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(self.interval) => {}
                }
                if let Err(e) = self.resume_once().await {
                    tracing::warn!(error = %e, "users: resuming unfinished erases failed; trying again later");
                }
            }
        }
        .boxed()
    }
}

impl Eraser {
    async fn resume_once(&self) -> Result<(), UserError> {
        let stale = {
            let client = self.pool.get().await?;
            repo::users::unfinished(&client, self.interval).await?
        };
        for user in stale {
            erase(&self.pool, UserKey::new(user), ERASE_BATCH).await?;
        }
        Ok(())
    }
}
