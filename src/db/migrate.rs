//! The migration runner: `sql/NNNN_*.sql` in order, then the idempotent
//! trigger files of `triggers/`.
//!
//! - Versioned and checksummed: `maas_migrations` records each applied file
//!   with the SHA-256 of its text. A changed file, a gap, or a version this
//!   binary does not know is refused with a message that names it.
//! - All-or-nothing: pending migrations and their records commit in one
//!   transaction, so a migration is never half-applied.
//! - Safe when several daemons start at once: the transaction first takes a
//!   transaction-scoped advisory lock, so the others wait and then find
//!   nothing left to do.
//! - Outside that transaction, every read is an unnamed statement
//!   (`query_typed`), so the state check works through a transaction-mode
//!   pooler.
//! - Trigger files are re-applied when their text changed or a trigger they
//!   create is missing (`maasctl migrate` re-applies them always).

use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use super::Error;

/// Advisory lock key taken by every migration run ("maas" in ASCII).
const LOCK_KEY: i64 = 0x6d61_6173;

/// A migration embedded at build time.
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// An idempotent trigger file and the triggers it creates.
pub struct TriggerFile {
    pub name: &'static str,
    pub sql: &'static str,
    pub creates: &'static [&'static str],
}

/// Embeds each `sql/` file as a [`Migration`] of the version written before it.
macro_rules! migrations {
    ($($version:literal => $file:literal,)+) => {
        &[$(Migration {
            version: $version,
            name: $file,
            sql: include_str!(concat!("../../sql/", $file)),
        }),+]
    };
}

/// Embeds each `triggers/` file as a [`TriggerFile`] creating the triggers
/// listed after it.
macro_rules! trigger_files {
    ($($file:literal => [$($trigger:literal),+],)+) => {
        &[$(TriggerFile {
            name: $file,
            sql: include_str!(concat!("../../triggers/", $file)),
            creates: &[$($trigger),+],
        }),+]
    };
}

pub const MIGRATIONS: &[Migration] = migrations![
    1 => "0001_pipeline.sql",
    2 => "0002_memory.sql",
    3 => "0003_http.sql",
    4 => "0004_ops.sql",
    5 => "0005_archivist.sql",
    6 => "0006_steps_without_fk.sql",
    7 => "0007_assembler_memory.sql",
    8 => "0008_memory_search.sql",
    9 => "0009_row_bounds.sql",
    10 => "0010_user_data.sql",
    11 => "0011_memory_search_pending_list.sql",
    12 => "0012_tenants.sql",
    13 => "0013_console_lists.sql",
    14 => "0014_metadata_and_run_lease.sql",
    15 => "0015_console_actions.sql",
    16 => "0016_context_compression.sql",
    17 => "0017_turn_embeddings.sql",
    18 => "0018_embedding_parts.sql",
    19 => "0019_token_operator.sql",
    20 => "0020_tenant_roles.sql",
    21 => "0021_analyzer_earlier_turns.sql",
    22 => "0022_answer_streaming.sql",
    23 => "0023_token_user.sql",
    24 => "0024_embedding_codes.sql",
    25 => "0025_fewer_index_writes.sql",
    26 => "0026_answer_logs_in_finish.sql",
    27 => "0027_size_checks_without_detoasting.sql",
    28 => "0028_embedding_lists.sql",
    29 => "0029_common_lexemes.sql",
    30 => "0030_steps_keyed_by_run.sql",
    31 => "0031_event_payloads.sql",
    32 => "0032_tenant_revoke.sql",
    33 => "0033_time_ordered_request_ids.sql",
    34 => "0034_request_bounds_where_written.sql",
    35 => "0035_no_trust_in_the_caller.sql",
    36 => "0036_tenant_turns.sql",
    37 => "0037_person_in_the_loop.sql",
    38 => "0038_review.sql",
    39 => "0039_analyzer_sub_queries.sql",
];

pub const TRIGGERS: &[TriggerFile] = trigger_files![
    "0001_notify_pipeline_change.sql" => ["pipeline_runs_notify_insert", "pipeline_runs_notify_update"],
    "0002_log_user_query.sql" => ["pipeline_runs_log_user_query"],
    "0003_callback_outbox.sql" => ["pipeline_runs_enqueue_callback"],
    "0004_track_raw_logs.sql" => ["raw_logs_track"],
    "0005_delete_run_steps.sql" => ["pipeline_runs_delete_steps"],
    "0006_assign_tenant.sql" => ["pipeline_runs_assign_tenant", "raw_logs_assign_tenant"],
    "0007_request_bounds.sql" => ["pipeline_runs_producer_bounds"],
];

/// What a migration run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub applied: Vec<String>,
    pub triggers: Vec<String>,
    pub current_version: i32,
}

/// How the schema compares with this binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaState {
    pub current_version: i32,
    pub latest_version: i32,
    pub missing_triggers: Vec<String>,
}

impl SchemaState {
    pub fn is_current(&self) -> bool {
        self.current_version == self.latest_version && self.missing_triggers.is_empty()
    }
}

/// The recorded migrations (version, name, checksum), in order, checked
/// against this binary's ([`verify_applied`]).
async fn read_applied(client: &impl tokio_postgres::GenericClient) -> Result<Vec<(i32, String, String)>, Error> {
    let applied: Vec<(i32, String, String)> = client
        .query_typed(
            "SELECT version, name, checksum FROM maas_migrations ORDER BY version",
            &[],
        )
        .await?
        .iter()
        .map(|r| Ok((r.try_get("version")?, r.try_get("name")?, r.try_get("checksum")?)))
        .collect::<Result<_, Error>>()?;
    verify_applied(&applied)?;
    Ok(applied)
}

/// Migrations whose comments were reworded after release, with the
/// checksum of the text that databases recorded before: the statements
/// are unchanged, so either checksum is the same migration.
const REWORDED: &[(i32, &str)] = &[
    (4, "c790bf65168cda387289fc1a55dce44ac01a0de5cf72b1928f4bda20b6ee9464"),
    (5, "f545d297e3a57510447de06dec5d98bf31d4726002470c659f6649a61ffbd956"),
    (8, "c2e2f67439fe664f53aa54a0c9729a48479c180b25dcddb6e7c5e4693154d01b"),
    (15, "357258e33cfdea42748dd970af40d9a2fed7bac91fa7c220496ab281e58cfa84"),
];

/// `sum` is the checksum migration `version` had before its comments were
/// reworded.
fn reworded(version: i32, sum: &str) -> bool {
    REWORDED.iter().any(|(v, s)| *v == version && *s == sum)
}

pub fn checksum(sql: &str) -> String {
    let digest = Sha256::digest(sql.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn latest_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// Brings the schema up to date. `force_triggers` re-applies every trigger
/// file even when unchanged.
pub async fn migrate(client: &mut Client, force_triggers: bool) -> Result<Report, Error> {
    let tx = client.transaction().await?;
    // No statement or lock limit for a migration, also where the session's
    // own settings say otherwise (a pooled session cannot be given options).
    tx.batch_execute("SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0")
        .await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY]).await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS maas_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             checksum   text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now());
         CREATE TABLE IF NOT EXISTS maas_triggers (
             name       text PRIMARY KEY,
             checksum   text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now());",
    )
    .await?;

    let applied = read_applied(&tx).await?;

    let mut report = Report::default();
    let done = applied.len();
    for m in MIGRATIONS.iter().skip(done) {
        tx.batch_execute(m.sql)
            .await
            .map_err(|e| Error::Migration(format!("{} failed: {}", m.name, describe(&e))))?;
        tx.execute(
            "INSERT INTO maas_migrations (version, name, checksum) VALUES ($1, $2, $3)",
            &[&m.version, &m.name, &checksum(m.sql)],
        )
        .await?;
        report.applied.push(m.name.to_owned());
    }

    let recorded: Vec<(String, String)> = tx
        .query_typed("SELECT name, checksum FROM maas_triggers", &[])
        .await?
        .iter()
        .map(|r| Ok((r.try_get("name")?, r.try_get("checksum")?)))
        .collect::<Result<_, Error>>()?;
    let present = present_triggers(&tx).await?;
    for t in TRIGGERS {
        let sum = checksum(t.sql);
        let unchanged = recorded.iter().any(|(n, c)| n == t.name && *c == sum);
        let complete = t.creates.iter().all(|name| present.iter().any(|p| p == name));
        if force_triggers || !unchanged || !complete {
            tx.batch_execute(t.sql)
                .await
                .map_err(|e| Error::Migration(format!("trigger file {} failed: {}", t.name, describe(&e))))?;
            tx.execute(
                "INSERT INTO maas_triggers (name, checksum) VALUES ($1, $2)
                 ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()",
                &[&t.name, &sum],
            )
            .await?;
            report.triggers.push(t.name.to_owned());
        }
    }
    tx.commit().await?;
    report.current_version = latest_version();
    Ok(report)
}

/// Reads the schema state without changing anything.
pub async fn state(client: &Client) -> Result<SchemaState, Error> {
    let exists: bool = client
        .query_typed_one("SELECT to_regclass('maas_migrations') IS NOT NULL AS installed", &[])
        .await?
        .try_get("installed")?;
    let current_version = if exists {
        read_applied(client).await?.last().map_or(0, |a| a.0)
    } else {
        0
    };
    let present = present_triggers(client).await?;
    let missing_triggers = TRIGGERS
        .iter()
        .flat_map(|t| t.creates.iter())
        .filter(|name| !present.iter().any(|p| p == *name))
        .map(|s| (*s).to_owned())
        .collect();
    Ok(SchemaState {
        current_version,
        latest_version: latest_version(),
        missing_triggers,
    })
}

async fn present_triggers(client: &impl tokio_postgres::GenericClient) -> Result<Vec<String>, Error> {
    client
        .query_typed(
            "SELECT t.tgname::text AS name FROM pg_trigger t
             WHERE t.tgrelid IN (to_regclass('pipeline_runs'), to_regclass('raw_logs')) AND NOT t.tgisinternal",
            &[],
        )
        .await?
        .iter()
        .map(|r| Ok(r.try_get("name")?))
        .collect()
}

/// The applied records must be exactly a prefix of [`MIGRATIONS`]: same
/// versions, no gaps, unchanged text.
fn verify_applied(applied: &[(i32, String, String)]) -> Result<(), Error> {
    for (i, (version, name, sum)) in applied.iter().enumerate() {
        let Some(known) = MIGRATIONS.get(i) else {
            return Err(Error::Migration(format!(
                "the database has migration {version} ({name}), which this binary does not know; \
                 it was migrated by a newer maas — upgrade this binary"
            )));
        };
        if known.version != *version {
            return Err(Error::Migration(format!(
                "the database records migration {version} ({name}) where {} ({}) was expected; \
                 the history has a gap or was edited by hand",
                known.version, known.name
            )));
        }
        if checksum(known.sql) != *sum && !reworded(known.version, sum) {
            return Err(Error::Migration(format!(
                "migration {version} ({name}) was changed after it was applied \
                 (recorded checksum {sum}, file has {}); add a new migration instead",
                checksum(known.sql)
            )));
        }
    }
    Ok(())
}

fn describe(e: &tokio_postgres::Error) -> String {
    super::describe(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of the files in folder `dir` of the crate, sorted.
    fn files_in(dir: &str) -> Vec<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn migrations_are_numbered_without_gaps_and_match_sql_dir() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            let expected = i32::try_from(i + 1).unwrap_or(i32::MAX);
            assert_eq!(m.version, expected, "{} out of sequence", m.name);
            assert!(m.name.starts_with(&format!("{:04}_", m.version)), "{}", m.name);
        }
        let on_disk: Vec<String> = files_in("sql").into_iter().filter(|n| n.ends_with(".sql")).collect();
        let embedded: Vec<&str> = MIGRATIONS.iter().map(|m| m.name).collect();
        assert_eq!(on_disk, embedded, "every file in sql/ must be embedded, in order");
    }

    #[test]
    fn trigger_files_match_triggers_dir() {
        let on_disk = files_in("triggers");
        let embedded: Vec<&str> = TRIGGERS.iter().map(|t| t.name).collect();
        assert_eq!(on_disk, embedded);
        for t in TRIGGERS {
            for name in t.creates {
                assert!(t.sql.contains(name), "{} does not create {name}", t.name);
            }
        }
    }

    #[test]
    fn a_changed_migration_is_refused() {
        let Some(first) = MIGRATIONS.first() else {
            return;
        };
        let ok = vec![(first.version, first.name.to_owned(), checksum(first.sql))];
        assert!(verify_applied(&ok).is_ok());
        let changed = vec![(first.version, first.name.to_owned(), checksum("-- edited"))];
        let err = verify_applied(&changed)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("changed after it was applied"), "{err}");
        let unknown = vec![(99, "0099_future.sql".to_owned(), "x".to_owned())];
        assert!(verify_applied(&unknown).is_err());
    }

    #[test]
    fn a_database_migrated_before_a_comment_was_reworded_is_accepted() {
        // Recorded as released: every migration up to 15, with the
        // checksums of the text before its comments were reworded.
        let recorded: Vec<(i32, String, String)> = MIGRATIONS
            .iter()
            .take(15)
            .map(|m| {
                let old = REWORDED
                    .iter()
                    .find(|(v, _)| *v == m.version)
                    .map(|(_, s)| (*s).to_owned());
                (m.version, m.name.to_owned(), old.unwrap_or_else(|| checksum(m.sql)))
            })
            .collect();
        assert_eq!(recorded.len(), 15);
        assert!(verify_applied(&recorded).is_ok());
        // The old checksum of one migration is not accepted for another.
        let mut swapped = recorded.clone();
        swapped[5].2 = REWORDED[0].1.to_owned();
        assert!(verify_applied(&swapped).is_err());
    }
}
