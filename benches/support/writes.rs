//! The writes section of `bin/bench` (`--only=writes`): what one request
//! costs the database in writes, counted rather than timed, so the figures
//! hold on a busy machine too.
//!
//! A daemon works off `n` requests inserted in one statement (as the
//! throughput run does); around that, per request:
//!
//! - `wal_bytes_per_request`: WAL written, from the insert position's
//!   difference (`pg_current_wal_insert_lsn`), after a `CHECKPOINT`, so that
//!   the first change of each page after it (a full-page image) is always
//!   in the figure, not only when a checkpoint happened to fall in the run.
//! - `heap_row_versions_per_request`: row versions written to every table
//!   (`n_tup_ins + n_tup_upd + n_tup_del` of `pg_stat_user_tables`), and
//!   `hot_update_share`: the updates that wrote no index entry
//!   (`n_tup_hot_upd ÷ n_tup_upd`, every table).
//! - `index_entries_per_request`: entries inserted into every index, read
//!   from the WAL itself (`pg_walinspect`): a B-tree's leaf inserts
//!   (`INSERT_LEAF`, `INSERT_POST` and leaf splits, which carry the new
//!   entry), a GIN index's fast-update inserts (one record per row: its
//!   pending list takes a row's entries at once) and the records that move
//!   the pending list into the tree, a BRIN index's summary updates. A physical replication slot keeps the WAL of the run until it
//!   has been read.
//! - `function_calls_per_request`: calls of PL/pgSQL and SQL functions
//!   (`track_functions = all`, `pg_stat_user_functions`): mostly trigger
//!   functions, each an executor start and a statement of its own; the
//!   note lists them per function.
//! - per table, `rows.<table>` (its row versions: inserts, updates, HOT
//!   updates and deletes in the note) and `index_entries.<table>` (the
//!   entries per index in the note).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_postgres::Client;

use super::support::daemon::Opts;
use super::{Bench, THROUGHPUT_CONCURRENCY, connect, insert_requests, round, start_daemon, wait_all_completed};

/// The slot that holds the run's WAL until it has been read.
const SLOT: &str = "maas_bench_writes";

/// Row counters of one table: inserts, updates, HOT updates, deletes.
#[derive(Default, Clone, Copy)]
struct Rows {
    ins: i64,
    upd: i64,
    hot: i64,
    del: i64,
}

/// The counters before or after a run.
struct Snapshot {
    lsn: String,
    tables: BTreeMap<String, Rows>,
    calls: BTreeMap<String, i64>,
}

/// The WAL records that insert an entry into an index, per table and index,
/// between two insert positions of this database.
const INDEX_ENTRIES: &str = "
WITH w AS (
    SELECT resource_manager AS rm, record_type AS ty, description AS d,
           substring(block_ref FROM 'blkref #0: rel [0-9]+/([0-9]+)/[0-9]+')::oid AS db,
           substring(block_ref FROM 'blkref #0: rel [0-9]+/[0-9]+/([0-9]+)')::oid AS node
    FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
    WHERE resource_manager IN ('Btree', 'Gin', 'BRIN', 'Hash', 'Gist', 'SPGist')
)
SELECT t.relname::text, i.relname::text, count(*)::int8
FROM w
JOIN pg_class i ON i.relfilenode = w.node
JOIN pg_index x ON x.indexrelid = i.oid
JOIN pg_class t ON t.oid = x.indrelid
WHERE w.db = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND CASE w.rm
          WHEN 'Btree' THEN w.ty IN ('INSERT_LEAF', 'INSERT_POST')
                            OR (w.ty IN ('SPLIT_L', 'SPLIT_R') AND w.d LIKE 'level 0,%')
          WHEN 'Gin' THEN w.ty IN ('UPDATE_META_PAGE', 'INSERT')
          WHEN 'BRIN' THEN w.ty LIKE 'INSERT%' OR w.ty LIKE '%UPDATE%'
          ELSE w.ty LIKE 'INSERT%'
      END
GROUP BY 1, 2
ORDER BY 1, 2";

impl Snapshot {
    async fn take(c: &Client) -> Snapshot {
        let lsn: String = c
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .unwrap()
            .get(0);
        let mut tables = BTreeMap::new();
        for r in c
            .query(
                "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables",
                &[],
            )
            .await
            .unwrap()
        {
            let rows = Rows {
                ins: r.get(1),
                upd: r.get(2),
                hot: r.get(3),
                del: r.get(4),
            };
            tables.insert(r.get::<_, String>(0), rows);
        }
        let calls = c
            .query("SELECT funcname::text, calls FROM pg_stat_user_functions", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        Snapshot { lsn, tables, calls }
    }
}

/// Row inserts and updates of the request tables so far
/// (`pg_stat_user_tables`): the throughput run's `writes_per_request`.
pub async fn rows_written(c: &Client) -> i64 {
    c.query_one(
        "SELECT coalesce(sum(n_tup_ins + n_tup_upd), 0)::int8 FROM pg_stat_user_tables
         WHERE relname IN ('pipeline_runs', 'pipeline_steps', 'raw_logs')",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

pub async fn writes(b: &mut Bench) {
    let n: i64 = if b.quick { 2_000 } else { 10_000 };
    let url = b.fresh_db("writes").await;
    let opts = Opts::default()
        .env("RUST_LOG", "warn")
        .env("MAAS_CONCURRENCY__ANALYZE", THROUGHPUT_CONCURRENCY)
        .env("MAAS_CONCURRENCY__ASSEMBLE", THROUGHPUT_CONCURRENCY)
        .env("MAAS_CONCURRENCY__RESPOND", THROUGHPUT_CONCURRENCY);
    connect(&url)
        .await
        .batch_execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = ''all''', current_database()); END $$",
        )
        .await
        .unwrap();
    let mut d = start_daemon(&url, opts).await;
    let c = connect(&url).await;
    c.batch_execute(&format!(
        "CREATE EXTENSION IF NOT EXISTS pg_walinspect;
         SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{SLOT}';
         SELECT pg_create_physical_replication_slot('{SLOT}', true);
         CHECKPOINT;"
    ))
    .await
    .unwrap();
    let before = Snapshot::take(&c).await;
    insert_requests(&c, n, "benchmark query number ").await;
    wait_all_completed(&c, &d, n, "writes").await;
    d.kill();
    // The daemon's sessions report their counters as they end; give them
    // time to, and the bench's own session a second of idleness.
    let gone = super::wait_count(
        &c,
        "SELECT 1 - count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'maasd%'",
        1,
        Duration::from_secs(30),
    )
    .await;
    assert!(gone, "the daemon's sessions did not end");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = Snapshot::take(&c).await;
    // pg_walinspect reads only flushed WAL: a durable commit after the
    // snapshot flushes everything before it (its record lies past the range).
    c.batch_execute("SET synchronous_commit = on; CREATE TEMP TABLE flush_mark AS SELECT 1 AS x")
        .await
        .unwrap();
    let entries = c.query(INDEX_ENTRIES, &[&before.lsn, &after.lsn]).await.unwrap();
    c.batch_execute(&format!("SELECT pg_drop_replication_slot('{SLOT}')"))
        .await
        .unwrap();
    record(b, n, &before, &after, &entries);
}

fn record(b: &mut Bench, n: i64, before: &Snapshot, after: &Snapshot, entries: &[tokio_postgres::Row]) {
    let per = |x: i64| round(x as f64 / n as f64, 2);
    let wal = lsn_bytes(&after.lsn) - lsn_bytes(&before.lsn);
    let mut by_table: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    for r in entries {
        by_table.entry(r.get(0)).or_default().push((r.get(1), r.get(2)));
    }
    let mut total = Rows::default();
    let mut lines = Vec::new();
    for (table, a) in &after.tables {
        let z = before.tables.get(table).copied().unwrap_or_default();
        let d = Rows {
            ins: a.ins - z.ins,
            upd: a.upd - z.upd,
            hot: a.hot - z.hot,
            del: a.del - z.del,
        };
        let idx = by_table.remove(table).unwrap_or_default();
        if d.ins + d.upd + d.del == 0 && idx.is_empty() {
            continue;
        }
        total.ins += d.ins;
        total.upd += d.upd;
        total.hot += d.hot;
        total.del += d.del;
        let idx_note: Vec<String> = idx.iter().map(|(i, k)| format!("{i} {}", per(*k))).collect();
        let rows_note = format!(
            "ins {} upd {} (HOT {}) del {}",
            per(d.ins),
            per(d.upd),
            per(d.hot),
            per(d.del)
        );
        let idx_sum: i64 = idx.iter().map(|(_, k)| k).sum();
        lines.push((format!("rows.{table}"), per(d.ins + d.upd + d.del), rows_note));
        if !idx.is_empty() {
            lines.push((format!("index_entries.{table}"), per(idx_sum), idx_note.join(", ")));
        }
    }
    let index_total: i64 = entries.iter().map(|r| r.get::<_, i64>(2)).sum();
    b.record(
        "wal_bytes_per_request",
        round(wal as f64 / n as f64, 0),
        &format!("{n} requests, WAL insert position difference after a CHECKPOINT (full-page images included)"),
    );
    b.record(
        "index_entries_per_request",
        per(index_total),
        "entries inserted into every index (WAL records: B-tree leaf inserts, GIN and BRIN inserts)",
    );
    b.record(
        "heap_row_versions_per_request",
        per(total.ins + total.upd + total.del),
        "row versions inserted, updated or deleted, every table (pg_stat_user_tables)",
    );
    b.record(
        "hot_update_share",
        if total.upd == 0 {
            0.0
        } else {
            round(total.hot as f64 / total.upd as f64, 3)
        },
        &format!(
            "HOT updates ÷ updates, every table ({} of {} per request)",
            per(total.hot),
            per(total.upd)
        ),
    );
    let calls: Vec<(String, i64)> = after
        .calls
        .iter()
        .map(|(f, k)| (f.clone(), k - before.calls.get(f).copied().unwrap_or(0)))
        .filter(|(_, k)| *k > 0)
        .collect();
    let call_note: Vec<String> = calls.iter().map(|(f, k)| format!("{f} {}", per(*k))).collect();
    b.record(
        "function_calls_per_request",
        per(calls.iter().map(|(_, k)| k).sum()),
        &call_note.join(", "),
    );
    for (key, value, note) in lines {
        b.record(&key, value, &note);
    }
}

/// The byte position of an LSN written `X/Y` (hexadecimal halves).
fn lsn_bytes(lsn: &str) -> i64 {
    let (hi, lo) = lsn.split_once('/').unwrap();
    (i64::from_str_radix(hi, 16).unwrap() << 32) + i64::from_str_radix(lo, 16).unwrap()
}
