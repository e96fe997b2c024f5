//! Export: everything held about a user as one JSON document, streamed.
//!
//! ```text
//! {"user_id": …, "exported_at": …, "archive_state": {…} | null,
//!  "requests": [{…every column…, "steps": [{…}, …]}, …],
//!  "turns": [{…}, …], "records": [{…}, …],
//!  "counts": {"requests": n, "steps": n, "turns": n, "records": n}}
//! ```
//!
//! Guarantees: one consistent snapshot (a read-only REPEATABLE READ
//! transaction, so the counts agree with the rows); memory bounded by one
//! page of rows ([`PAGE`]) plus the chunks in flight (a bounded channel of
//! chunks of about [`CHUNK`] bytes), whatever the user's size: rows are read
//! by keyset pages and written out as they come. A consumer that goes away
//! ends the export; a failure mid-way ends the stream with an error, so the
//! document is visibly cut (never a valid-looking partial one).

use std::collections::HashMap;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::{UserError, UserKey, live_state};
use crate::db::{self, Pool};
use crate::repo::{self, GenericClient, users::ExportStep};

/// Rows per page.
pub const PAGE: usize = 500;
/// Bytes per chunk sent to the consumer (about).
pub const CHUNK: usize = 64 << 10;
/// Chunks queued for the consumer.
pub const QUEUE: usize = 4;

/// One chunk of the document, or the error that cut it.
pub type Chunk = Result<Vec<u8>, std::io::Error>;

/// How many of each were exported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub requests: u64,
    pub steps: u64,
    pub turns: u64,
    pub records: u64,
}

/// Checks that `user` can be exported (known, not forgotten, no erase
/// running): call before committing to a response.
pub async fn check(pool: &Pool, user: UserKey) -> Result<(), UserError> {
    let client = pool.get().await?;
    live_state(&client, user).await.map(|_| ())
}

/// Why writing stopped early: the consumer went away, or a read failed.
enum Stop {
    Gone,
    Failed(UserError),
}

impl From<UserError> for Stop {
    fn from(e: UserError) -> Stop {
        Stop::Failed(e)
    }
}

impl From<db::Error> for Stop {
    fn from(e: db::Error) -> Stop {
        Stop::Failed(e.into())
    }
}

impl From<deadpool_postgres::PoolError> for Stop {
    fn from(e: deadpool_postgres::PoolError) -> Stop {
        Stop::Failed(e.into())
    }
}

/// Writes the document into chunks.
struct Writer {
    buf: Vec<u8>,
    tx: mpsc::Sender<Chunk>,
}

impl Writer {
    async fn raw(&mut self, s: &str) -> Result<(), Stop> {
        self.buf.extend_from_slice(s.as_bytes());
        self.maybe_flush().await
    }

    async fn value(&mut self, v: &impl Serialize) -> Result<(), Stop> {
        // Serialising plain row structs cannot fail; a failure writes null.
        if serde_json::to_writer(&mut self.buf, v).is_err() {
            self.buf.extend_from_slice(b"null");
        }
        self.maybe_flush().await
    }

    /// `v` as the next element of an array that holds `written` already.
    async fn element(&mut self, written: u64, v: &impl Serialize) -> Result<(), Stop> {
        if written > 0 {
            self.raw(",").await?;
        }
        self.value(v).await
    }

    async fn maybe_flush(&mut self) -> Result<(), Stop> {
        if self.buf.len() >= CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), Stop> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK + 4096));
        self.tx.send(Ok(chunk)).await.map_err(|_| Stop::Gone)
    }
}

/// Streams the export of `user` into `tx`. On a database failure the
/// stream ends with an error chunk.
pub async fn export(pool: &Pool, user: UserKey, tx: mpsc::Sender<Chunk>) -> Result<Counts, UserError> {
    let mut w = Writer {
        buf: Vec::with_capacity(CHUNK + 4096),
        tx: tx.clone(),
    };
    match write(pool, user, &mut w).await {
        Ok(counts) => Ok(counts),
        // The consumer left: nothing to report to it.
        Err(Stop::Gone) => Ok(Counts::default()),
        Err(Stop::Failed(e)) => {
            let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
            Err(e)
        }
    }
}

/// The whole document, read in one read-only REPEATABLE READ transaction.
async fn write(pool: &Pool, user: UserKey, w: &mut Writer) -> Result<Counts, Stop> {
    let mut client = pool.get().await?;
    let t = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(db::Error::from)?;
    live_state(&t, user).await?;
    let mut counts = Counts::default();
    write_head(&t, user, w).await?;
    w.raw(",\"requests\":[").await?;
    write_requests(&t, user, w, &mut counts).await?;
    w.raw("],\"turns\":[").await?;
    write_turns(&t, user, w, &mut counts).await?;
    w.raw("],\"records\":[").await?;
    write_records(&t, user, w, &mut counts).await?;
    w.raw("],\"counts\":").await?;
    w.value(&counts).await?;
    w.raw("}\n").await?;
    w.flush().await?;
    t.commit().await.map_err(db::Error::from)?;
    Ok(counts)
}

/// The user, the time of the export and the archive state.
async fn write_head(t: &impl GenericClient, user: UserKey, w: &mut Writer) -> Result<(), Stop> {
    let mark = repo::archive::show_mark(t, user.user_id).await?;
    w.raw("{\"user_id\":").await?;
    w.value(&user.shown).await?;
    w.raw(",\"exported_at\":").await?;
    w.value(&chrono::Utc::now()).await?;
    w.raw(",\"archive_state\":").await?;
    w.value(&mark).await
}

/// Every request, oldest first, each with its steps.
async fn write_requests(
    t: &impl GenericClient,
    user: UserKey,
    w: &mut Writer,
    counts: &mut Counts,
) -> Result<(), Stop> {
    let mut after = None;
    loop {
        let page = repo::users::export_requests(t, user, after, PAGE).await?;
        let ids: Vec<Uuid> = page.iter().map(|r| r.id).collect();
        let steps = repo::users::export_steps(t, user, &ids).await?;
        let mut by_request: HashMap<Uuid, Vec<&ExportStep>> = HashMap::new();
        for s in &steps {
            by_request.entry(s.request_id).or_default().push(s);
        }
        for r in &page {
            let mine = by_request.remove(&r.id).unwrap_or_default();
            let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
            if let Some(obj) = v.as_object_mut() {
                obj.insert("steps".into(), serde_json::to_value(&mine).unwrap_or(Value::Null));
            }
            w.element(counts.requests, &v).await?;
            counts.requests += 1;
            counts.steps += u64::try_from(mine.len()).unwrap_or(u64::MAX);
        }
        match page.last() {
            Some(last) if page.len() >= PAGE => after = Some((last.created_at, last.id)),
            _ => return Ok(()),
        }
    }
}

/// Every turn, in the user's order.
async fn write_turns(t: &impl GenericClient, user: UserKey, w: &mut Writer, counts: &mut Counts) -> Result<(), Stop> {
    let mut after = 0;
    loop {
        let page = repo::users::export_turns(t, user, after, PAGE).await?;
        for turn in &page {
            w.element(counts.turns, turn).await?;
            counts.turns += 1;
        }
        match page.last() {
            Some(last) if page.len() >= PAGE => after = last.user_seq,
            _ => return Ok(()),
        }
    }
}

/// Every record, oldest first.
async fn write_records(t: &impl GenericClient, user: UserKey, w: &mut Writer, counts: &mut Counts) -> Result<(), Stop> {
    let mut after = 0;
    loop {
        let page = repo::users::export_records(t, user, after, PAGE).await?;
        for rec in &page {
            w.element(counts.records, rec).await?;
            counts.records += 1;
        }
        match page.last() {
            Some(last) if page.len() >= PAGE => after = last.id,
            _ => return Ok(()),
        }
    }
}
