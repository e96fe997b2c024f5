//! The embedder: a daemon service that gives every turn its embedding for
//! the semantic part of the memory search, when `[llm.embedding]` is on.
//!
//! Each pass takes up to [`USERS_PER_PASS`] users with turns past their
//! mark (`archive_marks.embedded_seq`), and for each the next batch of
//! turns, oldest first. A turn is embedded together with the turns on
//! either side of it in its thread (`previous`, `content`, `next`, a line
//! each): a reply is often meaningless alone ("Yes, in March!"), and on
//! LoCoMo this window beat the turn with only its previous one (recall of
//! all evidence 0.808 against 0.797 in the replay; BENCHMARKS.md, session
//! 8). So the turn before a new one is embedded again, now with its next
//! turn. The embeddings and the mark are written in one statement
//! ([`repo::embeddings::store`]), so a crash loses nothing.
//! Passes follow each other at once while there is work, then every
//! [`IDLE`]; several daemons may run it: they at worst embed a batch twice.
//!
//! Finding the users with work: a full pass reads `archive_marks`, one row
//! per user, to the end when nothing is left, which every second would be
//! a scan of every user. So only the first pass, and one every
//! [`FULL_EVERY`], is full; in between a pass looks only at the users of
//! the turns logged since the newest turn id seen before the last pass
//! that left nothing behind (`raw_logs_pkey`). The full passes catch what
//! that misses: a turn whose transaction took a lower id but committed
//! after that id was read, and a change of model.
//!
//! A failure (the provider is down, the database) is logged with its cause
//! and the pass ends; the next one, after [`IDLE`] (longer after repeated
//! failures), tries again: no turn is skipped for it. A text the provider
//! refuses (a non-retryable error: too long for its model, say) leaves only
//! that turn without an embedding, logged with its id; it holds up no other
//! turn and no other user.
//! Until a turn has its embedding, the memory search finds it by full text
//! alone.
//!
//! A large user's inverted lists ([`lists`]) are kept here too: after a
//! user's batch is stored, its lists are trained when it has crossed the
//! size for them, and every pass assigns a batch of embeddings of lists
//! not yet complete. So are its common lexemes
//! ([`repo::memory::count_common_lexemes`]): counted when it has
//! [`repo::memory::COMMON_LEXEMES_FROM`] logged turns and again each time
//! it has doubled, so the full-text part of its search skips their lookups.

pub mod lists;

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::db::Pool;
use crate::llm::embed::Embedder;
use crate::repo;
use crate::service::Service;

/// Users taken by one pass.
pub const USERS_PER_PASS: usize = 16;
/// Pause when there is nothing to embed.
pub const IDLE: Duration = Duration::from_secs(1);
/// Time between full passes (see the module's docs).
pub const FULL_EVERY: Duration = Duration::from_secs(60);
/// Longest pause after repeated failures.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// Users whose turns were read.
    pub users: usize,
    /// Embeddings stored.
    pub embedded: i64,
    /// Every user it found is embedded to the end, and it found fewer than
    /// it could take: nothing is left of what it looked at.
    pub complete: bool,
    /// The newest turn id, read before it looked: a complete pass has
    /// seen every turn up to it.
    pub top: i64,
    /// Embeddings assigned to a list ([`lists::assign`]).
    pub assigned: i64,
    /// Lists are left with embeddings to assign.
    pub lists_left: bool,
}

/// The embedder service.
pub struct EmbedderService {
    pool: Pool,
    embedder: Embedder,
}

impl EmbedderService {
    pub fn new(pool: Pool, embedder: Embedder) -> EmbedderService {
        EmbedderService { pool, embedder }
    }
}

/// The text a turn is embedded from.
fn text_of(turn: &repo::embeddings::TurnText) -> String {
    [
        turn.previous.as_deref(),
        Some(turn.content.as_str()),
        turn.next.as_deref(),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join("\n")
}

/// Why a pass stopped.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("{0}")]
    Db(#[from] crate::db::Error),
    #[error("{0}")]
    Embed(#[from] crate::llm::embed::EmbedError),
}

/// One pass: up to [`USERS_PER_PASS`] users, one batch of turns each. A
/// provider that is down (a retryable error) or a database error ends the
/// pass; a text the provider refuses (any other error) costs only that
/// turn its embedding (it is embedded alone, and left out).
///
/// `after_id`: look only at the users of the turns with a greater id
/// (`None`: at every user).
pub async fn pass(pool: &Pool, embedder: &Embedder, after_id: Option<i64>) -> Result<Pass, PassError> {
    let client = pool.get().await.map_err(crate::db::Error::from)?;
    let top = repo::embeddings::top(&client).await?;
    let users = match after_id {
        None => repo::embeddings::pending(&client, embedder.model(), USERS_PER_PASS).await?,
        Some(id) => repo::embeddings::pending_since(&client, embedder.model(), USERS_PER_PASS, id).await?,
    };
    let mut done = Pass {
        complete: users.len() < USERS_PER_PASS,
        top,
        ..Pass::default()
    };
    for user in users {
        let turns = repo::embeddings::turns(&client, user.user_id, user.embedded_seq, embedder.batch()).await?;
        // No new turn left (deleted ones leave gaps): the mark goes to the end.
        let mark = turns
            .iter()
            .filter(|t| !t.again)
            .map(|t| t.user_seq)
            .max()
            .unwrap_or(user.logged_seq);
        let texts: Vec<String> = turns.iter().map(text_of).collect();
        let embedded: Vec<(i64, Vec<f32>)> = match embedder.embed(&texts).await {
            Ok(vectors) => turns.iter().map(|t| t.id).zip(vectors).collect(),
            Err(e) if e.retryable() => return Err(e.into()),
            Err(e) => {
                tracing::warn!(user = %user.user_id, error = %e,
                    "the provider refused a batch of turns; embedding them one at a time");
                embed_refusing(embedder, &turns, &texts).await?
            }
        };
        let refused = turns.len().saturating_sub(embedded.len());
        let (ids, vectors): (Vec<i64>, Vec<Vec<f32>>) = embedded.into_iter().unzip();
        let stored = repo::embeddings::store(&client, user.user_id, embedder.model(), &ids, &vectors, mark).await?;
        crate::metrics::embedder_pass(stored, refused);
        if let Some(dims) = vectors.first().and_then(|v| i32::try_from(v.len()).ok()) {
            lists::keep(&client, user.user_id, embedder.model(), dims, user.logged_seq).await?;
        }
        repo::memory::count_common_lexemes(
            &client,
            user.user_id,
            user.logged_seq,
            repo::memory::COMMON_LEXEMES_FROM,
        )
        .await?;
        // A full batch may have left turns behind.
        done.complete &= turns.len() < embedder.batch();
        done.embedded += stored;
        done.users += 1;
    }
    (done.assigned, done.lists_left) = lists::assign(&client, embedder.model()).await?;
    Ok(done)
}

/// The turns' embeddings one text at a time, leaving out (and logging)
/// each turn whose text the provider refuses: such a turn is found by full
/// text alone, and it can hold up no other turn or user. A retryable error
/// (the provider is down) still ends the pass.
async fn embed_refusing(
    embedder: &Embedder,
    turns: &[repo::embeddings::TurnText],
    texts: &[String],
) -> Result<Vec<(i64, Vec<f32>)>, PassError> {
    let mut out = Vec::with_capacity(turns.len());
    for (turn, text) in turns.iter().zip(texts) {
        match embedder.embed(std::slice::from_ref(text)).await {
            Ok(mut v) => {
                if let Some(v) = v.pop() {
                    out.push((turn.id, v));
                }
            }
            Err(e) if e.retryable() => return Err(e.into()),
            Err(e) => tracing::warn!(turn = turn.id, error = %e,
                "the provider refused this turn's text; it stays without an embedding"),
        }
    }
    Ok(out)
}

impl Service for EmbedderService {
    fn name(&self) -> &'static str {
        "embedder"
    }

    fn run(self: Arc<Self>, shutdown: CancellationToken) -> BoxFuture<'static, ()> {
        async move {
            tracing::info!(
                provider = self.embedder.provider_name(),
                model = self.embedder.model(),
                "embedder started"
            );
            let mut failures: u32 = 0;
            // The newest turn id before the last pass that left nothing
            // behind; `None` until a full pass has done so.
            let mut seen: Option<i64> = None;
            let mut last_full: Option<tokio::time::Instant> = None;
            loop {
                let full = seen.is_none() || last_full.is_none_or(|t| t.elapsed() >= FULL_EVERY);
                let pause = match pass(&self.pool, &self.embedder, if full { None } else { seen }).await {
                    Ok(p) => {
                        failures = 0;
                        if full {
                            last_full = Some(tokio::time::Instant::now());
                        }
                        if p.complete {
                            seen = Some(p.top);
                        }
                        if p.embedded > 0 {
                            tracing::debug!(users = p.users, embedded = p.embedded, full, "turns embedded");
                        }
                        if p.users == 0 && !p.lists_left {
                            IDLE
                        } else {
                            Duration::ZERO
                        }
                    }
                    Err(e) => {
                        crate::metrics::embedder_failure(match e {
                            PassError::Db(_) => "database",
                            PassError::Embed(_) => "provider",
                        });
                        failures = failures.saturating_add(1);
                        let pause = IDLE
                            .saturating_mul(2u32.saturating_pow(failures.min(6)))
                            .min(MAX_BACKOFF);
                        tracing::warn!(error = %e, failures, retry_in_secs = pause.as_secs(),
                            "embedding turns failed; the turns stay to embed");
                        pause
                    }
                };
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
        .boxed()
    }
}
