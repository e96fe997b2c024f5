//! `maasctl users show ID [--q TEXT]` and `maasctl users forget ID --reason
//! TEXT`: a user's memory as the API shows it, and forgetting a user (the
//! erase runs in this process, in bounded batches; a forget that stopped
//! half-way is resumed by running it again).
//!
//! Exit 1 when nothing is held about the user, it was forgotten, or an
//! erase of it is running (for `show`).

use chrono::{DateTime, Utc};
use clap::Subcommand;
use uuid::Uuid;

use super::{CliError, Outcome, connect};
use crate::config::Config;
use crate::db;
use crate::users::{self, Begun, MemoryView, Page, UserError, UserKey, Why};

#[derive(Subcommand, Debug)]
pub enum UsersCommand {
    /// A user's records (newest first) and turns not archived yet; with
    /// --q, the hits of the pipeline's retrieval with their scores.
    Show {
        id: String,
        /// Search text: show what the pipeline's retrieval finds for it.
        #[arg(long)]
        q: Option<String>,
        /// Records with a smaller id (the previous page's next_before).
        #[arg(long)]
        before: Option<i64>,
        /// Records and pending turns per page.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Everything held about a user as one JSON document on stdout
    /// (requests with their steps, turns, records, archive state), written
    /// as it is read.
    Export { id: String },
    /// Forget a user: erase its requests (in flight too), steps, turns,
    /// records, archive state, idempotency keys and callbacks, leaving one
    /// tombstone; later requests for the user are refused.
    Forget {
        id: String,
        /// Why, kept on the tombstone.
        #[arg(long)]
        reason: String,
    },
}

fn parse_user(s: &str) -> Result<UserKey, CliError> {
    s.trim()
        .parse::<Uuid>()
        .map(UserKey::new)
        .map_err(|_| CliError::Usage(format!("{s:?} is not a user id (a UUID)")))
}

pub async fn run(cfg: &Config, command: UsersCommand, actor: &str, json: bool) -> Result<Outcome, CliError> {
    match command {
        UsersCommand::Show { id, q, before, limit } => show(cfg, parse_user(&id)?, q, before, limit, json).await,
        UsersCommand::Export { id } => export(cfg, parse_user(&id)?).await,
        UsersCommand::Forget { id, reason } => forget(cfg, parse_user(&id)?, actor, &reason, json).await,
    }
}

/// A refusal the operator reads (exit 1), or the database error (exit 2).
fn finding(e: UserError) -> Result<Outcome, CliError> {
    match e {
        UserError::Db(d) => Err(CliError::Db(d)),
        other => {
            eprintln!("{other}");
            Ok(Outcome::Finding)
        }
    }
}

fn print_json(v: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

async fn show(
    cfg: &Config,
    user: UserKey,
    q: Option<String>,
    before: Option<i64>,
    limit: usize,
    json: bool,
) -> Result<Outcome, CliError> {
    let client = connect(cfg).await?;
    if let Some(q) = q {
        return show_search(cfg, &client, user, &q, json).await;
    }
    let page = Page {
        before,
        turns_before: None,
        limit,
    };
    let view = match users::view(&client, user, &page).await {
        Ok(v) => v,
        Err(e) => return finding(e),
    };
    if json {
        print_json(&view);
    } else {
        print_view(&view);
    }
    Ok(Outcome::Ok)
}

/// `show --q`: the hits of the pipeline's retrieval for `q`.
async fn show_search(
    cfg: &Config,
    client: &deadpool_postgres::Client,
    user: UserKey,
    q: &str,
    json: bool,
) -> Result<Outcome, CliError> {
    let embedder = crate::llm::embed::configured(&cfg.llm).map_err(|e| CliError::Usage(format!("embeddings: {e}")))?;
    let found = match users::search(
        client,
        cfg,
        user,
        users::Search {
            query: q,
            ..Default::default()
        },
        embedder.as_ref(),
    )
    .await
    {
        Ok(v) => v,
        Err(e) => return finding(e),
    };
    if json {
        print_json(&found);
        return Ok(Outcome::Ok);
    }
    let hits = found.hits.len();
    println!(
        "user {user} (memory version {}): {hits} hits for {q:?}",
        found.memory_version
    );
    for h in &found.hits {
        let (score, kind, id, why) = (h.score, &h.kind, h.id, &h.why);
        let text = one_line(&h.content, 100);
        println!(
            "{score:>7.3}  {kind:<6} {id:>8}  {why:<9} {}  {text}",
            minute(h.created_at)
        );
    }
    Ok(Outcome::Ok)
}

/// A page of the user's memory, for reading.
fn print_view(view: &MemoryView) {
    println!("user            {}", view.user_id);
    println!("memory version  {}", view.memory_version);
    println!(
        "turns           {} logged, {} archived, {} pending",
        view.logged_seq, view.archived_seq, view.pending
    );
    println!("records ({} shown, newest first):", view.records.len());
    for r in &view.records {
        let span = format!("{} .. {}", minute(r.time_bucket_start), minute(r.time_bucket_end));
        let text = one_line(&r.summary, 100);
        println!(
            "  #{:<8} {span}  {:>4} turns  [{}]  {text}",
            r.id,
            r.turns,
            r.tags.join(", ")
        );
    }
    if let Some(next) = view.next_before {
        println!("  more: --before {next}");
    }
    println!("pending turns ({} shown, newest first):", view.pending_turns.len());
    for t in &view.pending_turns {
        let text = one_line(&t.content, 100);
        println!(
            "  turn {:<8} {}  {:<18} {text}",
            t.id,
            minute(t.created_at),
            t.message_type
        );
    }
}

/// A time to the minute.
fn minute(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M").to_string()
}

/// `text` on one line, at most `max` characters.
fn one_line(text: &str, max: usize) -> String {
    super::one_line(&text.split_whitespace().collect::<Vec<_>>().join(" "), max)
}

async fn forget(cfg: &Config, user: UserKey, actor: &str, reason: &str, json: bool) -> Result<Outcome, CliError> {
    if reason.trim().is_empty() {
        return Err(CliError::Usage("--reason must not be empty".into()));
    }
    let why = Why {
        actor,
        reason: Some(reason),
    };
    let (begun, erased) = match users::forget_now(&one_connection(cfg)?, user, why).await {
        Ok(done) => done,
        Err(e) => return finding(e),
    };
    if json {
        print_json(&serde_json::json!({ "user_id": user, "forgotten": true, "erased": erased.to_json() }));
        return Ok(Outcome::Ok);
    }
    if begun == Begun::Unfinished {
        println!("user {user}: an erase was begun before and has not finished; resumed it");
    }
    let parts: Vec<String> = erased.0.iter().map(|(k, v)| format!("{v} {k}")).collect();
    println!("user {user} forgotten: erased {}", parts.join(", "));
    Ok(Outcome::Ok)
}

/// A pool of one connection: the erase and the export run one statement
/// at a time.
fn one_connection(cfg: &Config) -> Result<db::Pool, CliError> {
    let mut one = cfg.clone();
    one.pool_size = 1;
    Ok(db::connect_pool(&one, "maasctl")?)
}

async fn export(cfg: &Config, user: UserKey) -> Result<Outcome, CliError> {
    use std::io::Write;
    let pool = one_connection(cfg)?;
    if let Err(e) = users::export::check(&pool, user).await {
        return finding(e);
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel(users::export::QUEUE);
    let producer = tokio::spawn(async move { users::export::export(&pool, user, tx).await });
    // The CLI does nothing else meanwhile: a blocking write is fine.
    let mut out = std::io::stdout().lock();
    while let Some(chunk) = rx.recv().await {
        match chunk {
            Ok(bytes) => out.write_all(&bytes)?,
            Err(_) => break,
        }
    }
    out.flush()?;
    drop(rx);
    match producer.await {
        Ok(Ok(counts)) => {
            eprintln!(
                "user {user}: exported {} requests, {} steps, {} turns, {} records",
                counts.requests, counts.steps, counts.turns, counts.records
            );
            Ok(Outcome::Ok)
        }
        Ok(Err(e)) => finding(e),
        Err(e) => Err(CliError::Usage(format!("export of user {user} stopped: {e}"))),
    }
}
