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

use serde::Serialize;
use tokio::sync::mpsc;

use super::{UserError, UserKey, live_state};
use crate::db::{self, Pool};
use crate::repo;

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

/// The consumer went away.
struct Gone;

/// Writes the document into chunks.
struct Writer {
    buf: Vec<u8>,
    tx: mpsc::Sender<Chunk>,
}

impl Writer {
    async fn raw(&mut self, s: &str) -> Result<(), Gone> {
        self.buf.extend_from_slice(s.as_bytes());
        self.maybe_flush().await
    }

    async fn value(&mut self, v: &impl Serialize) -> Result<(), Gone> {
        // Serialising plain row structs cannot fail; a failure writes null.
        if serde_json::to_writer(&mut self.buf, v).is_err() {
            self.buf.extend_from_slice(b"null");
        }
        self.maybe_flush().await
    }

    async fn maybe_flush(&mut self) -> Result<(), Gone> {
        if self.buf.len() >= CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), Gone> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK + 4096));
        self.tx.send(Ok(chunk)).await.map_err(|_| Gone)
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
        Ok(Ok(counts)) => Ok(counts),
        // The consumer left: nothing to report to it.
        Ok(Err(Gone)) => Ok(Counts::default()),
        Err(e) => {
            let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
            Err(e)
        }
    }
}

async fn write(pool: &Pool, user: UserKey, w: &mut Writer) -> Result<Result<Counts, Gone>, UserError> {
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
    macro_rules! out {
        ($e:expr) => {
            if $e.await.is_err() {
                return Ok(Err(Gone));
            }
        };
    }
    let mark = repo::archive::show_mark(&t, user.user_id).await?;
    out!(w.raw("{\"user_id\":"));
    out!(w.value(&user.shown));
    out!(w.raw(",\"exported_at\":"));
    out!(w.value(&chrono::Utc::now()));
    out!(w.raw(",\"archive_state\":"));
    out!(w.value(&mark));

    out!(w.raw(",\"requests\":["));
    let mut after = None;
    loop {
        let page = repo::users::export_requests(&t, user, after, PAGE).await?;
        let ids: Vec<uuid::Uuid> = page.iter().map(|r| r.id).collect();
        let steps = repo::users::export_steps(&t, user, &ids).await?;
        let mut by_run: std::collections::HashMap<uuid::Uuid, Vec<&repo::users::ExportStep>> =
            std::collections::HashMap::new();
        for s in &steps {
            by_run.entry(s.run_id).or_default().push(s);
        }
        for r in &page {
            if counts.requests > 0 {
                out!(w.raw(","));
            }
            counts.requests += 1;
            let mine = by_run.remove(&r.id).unwrap_or_default();
            counts.steps += u64::try_from(mine.len()).unwrap_or(u64::MAX);
            let mut v = serde_json::to_value(r).unwrap_or(serde_json::Value::Null);
            if let Some(obj) = v.as_object_mut() {
                obj.insert(
                    "steps".into(),
                    serde_json::to_value(&mine).unwrap_or(serde_json::Value::Null),
                );
            }
            out!(w.value(&v));
        }
        match page.last() {
            Some(last) if page.len() >= PAGE => after = Some((last.created_at, last.id)),
            _ => break,
        }
    }

    out!(w.raw("],\"turns\":["));
    let mut after = 0;
    loop {
        let page = repo::users::export_turns(&t, user, after, PAGE).await?;
        for turn in &page {
            if counts.turns > 0 {
                out!(w.raw(","));
            }
            counts.turns += 1;
            out!(w.value(turn));
        }
        match page.last() {
            Some(last) if page.len() >= PAGE => after = last.user_seq,
            _ => break,
        }
    }

    out!(w.raw("],\"records\":["));
    let mut after = 0;
    loop {
        let page = repo::users::export_records(&t, user, after, PAGE).await?;
        for rec in &page {
            if counts.records > 0 {
                out!(w.raw(","));
            }
            counts.records += 1;
            out!(w.value(rec));
        }
        match page.last() {
            Some(last) if page.len() >= PAGE => after = last.id,
            _ => break,
        }
    }
    out!(w.raw("],\"counts\":"));
    out!(w.value(&counts));
    out!(w.raw("}\n"));
    out!(w.flush());
    t.commit().await.map_err(db::Error::from)?;
    Ok(Ok(counts))
}
