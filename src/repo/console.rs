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

/// Filters of the console's list; `None` means any.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub statuses: Option<Vec<String>>,
    pub user_id: Option<Uuid>,
    pub thread_id: Option<Uuid>,
    /// A substring of the query, case-insensitive.
    pub text: Option<String>,
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
        limit: i64,
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

/// One page of requests matching `f`, newest first.
pub async fn list(client: &impl GenericClient, f: &Filter) -> Result<Vec<Line>, Error> {
    let p = ListParams {
        statuses: &f.statuses,
        user_id: &f.user_id,
        thread_id: &f.thread_id,
        text: &f.text,
        before_created: f.before.map(|b| b.0),
        before_id: f.before.map(|b| b.1),
        limit: as_limit(f.limit),
    };
    super::query_as(client, LIST, &p.params()).await
}

#[cfg(test)]
mod tests {
    #[test]
    fn list_params_match_the_sql() {
        super::super::params_check::check(super::LIST, super::ListParams::NAMES);
    }
}
