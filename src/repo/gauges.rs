//! Database-wide figures for the metrics refresh (`crate::metrics`'s
//! on-call gauges): table sizes from the statistics views and the last
//! archive run. Read-only; each function is one round trip that scans no
//! big table (the other gauges reuse [`super::stats`] and
//! [`super::requests`]).

use super::GenericClient;

use crate::db::Error;

super::statements! {
    TABLES = "gauges_tables",
    ARCHIVIST = "gauges_archivist",
    WAITING = "gauges_waiting",
}

super::row_struct! {
    /// Requests in one waiting status.
    #[derive(Debug, Clone)]
    pub struct Waiting {
        pub status: crate::model::Status,
        pub n: i64,
        /// Past their limit, not yet ended by a sweep.
        pub overdue: i64,
    }
}

/// Requests waiting for a person, by status, and how many are overdue.
pub async fn waiting(client: &impl GenericClient) -> Result<Vec<Waiting>, Error> {
    super::query_as(client, WAITING, &[]).await
}

super::row_struct! {
    /// One watched table's size.
    #[derive(Debug, Clone)]
    pub struct TableSize {
        pub table_name: String,
        /// `pg_stat_user_tables.n_live_tup`.
        pub live_rows: i64,
        /// `pg_total_relation_size`.
        pub bytes: i64,
    }
}

/// `pipeline_runs`, `raw_logs` and `lsm_storage`: live rows and bytes.
pub async fn table_sizes(client: &impl GenericClient) -> Result<Vec<TableSize>, Error> {
    super::query_as(client, TABLES, &[]).await
}

super::row_struct! {
    /// The last finished archive run.
    #[derive(Debug, Clone)]
    pub struct LastArchiveRun {
        /// Unix seconds.
        pub finished_at: f64,
        /// Users that failed in it.
        pub failures: i64,
    }
}

/// The last finished archive run, if any.
pub async fn last_archive_run(client: &impl GenericClient) -> Result<Option<LastArchiveRun>, Error> {
    super::query_opt_as(client, ARCHIVIST, &[]).await
}
