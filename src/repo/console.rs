//! The operator console's own reads of `pipeline_runs` (the overview's
//! recent requests, the filtered list); everything else the console shows
//! comes from the files that own those tables. Read-only.

use super::GenericClient;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::as_limit;
use crate::db::Error;

super::statements! {
    RECENT = "console_recent",
    LIST = "console_list",
}

super::row_struct! {
    /// A recently finished request.
    #[derive(Debug, Clone, Serialize)]
    pub struct Recent {
        pub id: Uuid,
        pub status: String,
        pub user_id: Uuid,
        pub updated_at: DateTime<Utc>,
        pub error: Option<String>,
        pub query: String,
    }
}

/// The `limit` most recently finished requests (index-only on the finished index).
pub async fn recent(client: &impl GenericClient, limit: usize) -> Result<Vec<Recent>, Error> {
    super::query_as(client, RECENT, &[&as_limit(limit)]).await
}

/// Rows a text search reads at most for one page (`console_list.sql`):
/// bounds its cost on a table of any size; the page says how far it got.
pub const TEXT_SCAN: usize = 2_000;

/// Filters of the console's list; `None` means any.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub statuses: Option<Vec<String>>,
    pub user_id: Option<Uuid>,
    pub thread_id: Option<Uuid>,
    /// A substring of the query, case-insensitive.
    pub text: Option<String>,
    /// Created at or after this.
    pub since: Option<DateTime<Utc>>,
    /// Created before this.
    pub until: Option<DateTime<Utc>>,
    /// The page starts after this (created_at, id).
    pub before: Option<(DateTime<Utc>, Uuid)>,
    pub limit: usize,
}

super::statement_params! {
    struct ListParams<'a> {
        statuses: &'a Option<Vec<String>>,
        user_id: &'a Option<Uuid>,
        thread_id: &'a Option<Uuid>,
        text: &'a Option<String>,
        before_created: Option<DateTime<Utc>>,
        before_id: Option<Uuid>,
        since: Option<DateTime<Utc>>,
        until: Option<DateTime<Utc>>,
        limit: i64,
        scan: i64,
    }
}

super::row_struct! {
    /// One line of the console's list.
    #[derive(Debug, Clone, Serialize)]
    pub struct Line {
        pub id: Uuid,
        pub status: String,
        pub user_id: Uuid,
        pub thread_id: Option<Uuid>,
        pub attempt: i32,
        pub debug: bool,
        pub held: bool,
        pub created_at: DateTime<Utc>,
        pub updated_at: DateTime<Utc>,
        pub error: Option<String>,
        pub query: String,
    }
}

super::row_struct! {
    /// A row of `console_list.sql`: a line, or the edge of a text search.
    struct ListRow {
        id: Uuid,
        status: String,
        user_id: Uuid,
        thread_id: Option<Uuid>,
        attempt: i32,
        debug: bool,
        held: bool,
        created_at: DateTime<Utc>,
        updated_at: DateTime<Utc>,
        error: Option<String>,
        query: String,
        edge: bool,
        scanned: i64,
    }
}

/// One page of the list.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Page {
    pub lines: Vec<Line>,
    /// Where the next page starts, `None` when this is the last.
    pub next: Option<(DateTime<Utc>, Uuid)>,
    /// A text search that stopped before the end: how many requests it
    /// read and the creation time of the oldest (the page may show fewer
    /// than `limit` lines and still have a next one).
    pub searched: Option<(usize, DateTime<Utc>)>,
}

/// One page of requests matching `f`, newest first (one statement, one
/// snapshot).
pub async fn list(client: &impl GenericClient, f: &Filter) -> Result<Page, Error> {
    let p = ListParams {
        statuses: &f.statuses,
        user_id: &f.user_id,
        thread_id: &f.thread_id,
        text: &f.text,
        before_created: f.before.map(|b| b.0),
        before_id: f.before.map(|b| b.1),
        since: f.since,
        until: f.until,
        limit: as_limit(f.limit),
        scan: as_limit(TEXT_SCAN.max(f.limit)),
    };
    let mut rows: Vec<ListRow> = super::query_as(client, LIST, &p.params()).await?;
    // Matches come in the order read (`scanned` is the row's place in the
    // window); the SQL does not sort them.
    rows.sort_by_key(|r| (r.edge, r.scanned));
    let mut page = Page::default();
    let mut edge = None;
    for r in rows {
        if r.edge {
            edge = Some((r.created_at, r.id, r.scanned));
            continue;
        }
        page.lines.push(Line {
            id: r.id,
            status: r.status,
            user_id: r.user_id,
            thread_id: r.thread_id,
            attempt: r.attempt,
            debug: r.debug,
            held: r.held,
            created_at: r.created_at,
            updated_at: r.updated_at,
            error: r.error,
            query: r.query,
        });
    }
    let full = page.lines.len() >= f.limit;
    let last = page.lines.last().map(|l| (l.created_at, l.id));
    page.next = match edge {
        // A text search: the edge row says how far it read.
        Some((created, id, scanned)) => {
            let scanned = usize::try_from(scanned).unwrap_or(usize::MAX);
            if full {
                last
            } else if scanned >= TEXT_SCAN.max(f.limit) {
                page.searched = Some((scanned, created));
                Some((created, id))
            } else {
                None
            }
        }
        None => {
            if full {
                last
            } else {
                None
            }
        }
    };
    Ok(page)
}

#[cfg(test)]
mod tests {
    #[test]
    fn list_params_match_the_sql() {
        super::super::params_check::check(super::LIST, super::ListParams::NAMES);
    }
}
