//! Every SQL statement the program runs, one file per table (or group of
//! tables that one statement changes together), behind typed functions.
//!
//! Guarantees:
//! - No SQL text leaves this module: statements are private to their file
//!   (embedded from `sql/queries/` at build time, declared with
//!   `statements!` so a file's constants and its list cannot disagree) and
//!   callers see only functions and row types. [`all`] lists every
//!   statement for the test that prepares them against the schema.
//! - Straight to PostgreSQL, each statement is prepared once per connection
//!   and cached (`prepare_cached`), so its plan is cached too. Behind a
//!   transaction-mode pooler (`db.pooler = "transaction"`, see
//!   [`crate::db::unnamed_statements`]) every statement runs instead as the
//!   unnamed statement with its parameters' types given (`query_typed`):
//!   parse, bind and execute in one round trip, nothing left on the server
//!   connection afterwards, so it works through PgBouncer of any version,
//!   on a pooled connection or inside a transaction alike. The parameters'
//!   types are then read from the Rust values ([`param_type`]): the type
//!   each value's `ToSql` accepts, `jsonb` for JSON, `text` for strings.
//!   A function makes the round trips its doc says, usually one.
//! - Rows are read by column name into small typed structs ([`FromRow`]),
//!   never by position; a renamed or missing column is an error naming it.
//!   A plain row struct and its reading are one `row_struct!` declaration,
//!   and the `query_*` helpers prepare, run and read in one call.
//! - Statements with many inputs bind them from a struct declared with
//!   `statement_params!`, whose field order a unit test checks against the
//!   `-- $n name` comments of the SQL.
//! - Functions accept any [`GenericClient`] (a pooled connection or a
//!   transaction on one), so callers choose.
//!
//! Files: [`requests`] (`pipeline_runs`: submit, read, operator
//! transitions), [`attempts`] (`pipeline_runs` and `pipeline_steps`: claim,
//! lease renewal, finish, reclaim — the dispatcher's hot path), [`steps`],
//! [`prompts`], [`control`], [`audit`] (`operator_actions`), [`callbacks`]
//! (`callback_outbox`), [`retention`], [`idempotency`], [`archive`]
//! (`archive_*`, `raw_logs`, `lsm_storage`), [`memory`] (a request's
//! memory from `raw_logs` and `lsm_storage`, read only), [`stats`]
//! (aggregates and server state for `maasctl stats`, `doctor` and the
//! console's charts), [`gauges`] (table sizes and the last archive run, for
//! the metrics), [`users`] (one user's data: view, corrections, export
//! pages, erase batches, `forgotten_users`), [`tenants`] (`tenants`,
//! `api_tokens`: tokens, limits, stored user ids), [`deltas`]
//! (`answer_deltas`: the pieces of streamed answers), [`waits`] (requests
//! waiting for a person: the sweep's expiries), [`reviews`] (an operator's
//! verdict on an answer awaiting review).

use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::{FromSqlOwned, ToSql, Type, WrongType};

use crate::db::Error;
use crate::model::Status;

/// The values a statement binds, `$1` first.
type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

pub mod archive;
pub mod attempts;
pub mod audit;
pub mod callbacks;
mod column;
pub mod control;
pub mod deltas;
pub mod embeddings;
pub mod gauges;
pub mod idempotency;
pub mod memory;
pub mod prompts;
pub mod requests;
pub mod retention;
pub mod reviews;
pub mod stats;
pub mod steps;
pub mod tenants;
pub mod users;
pub mod waits;

// The dispatcher's statements, at the paths it calls them by.
pub use attempts::{
    Applied, Claimed, Ended, Finished, FusedAssemble, FusedRespond, Output, Reclaimed, StepUsage, Unsuccessful,
    claim_next, claim_sql, extend_leases, finish_batch, reclaim_expired,
};
pub use prompts::active_prompts;
pub use requests::{due_counts, ring_due};

/// What statements run on: a pooled connection or a transaction on one
/// (deadpool's [`deadpool_postgres::GenericClient`], whose methods it
/// keeps), plus the driver's client under it for the unnamed statements.
pub trait GenericClient: deadpool_postgres::GenericClient {
    /// The driver's client of this connection (a transaction's statements
    /// go to its connection, inside the transaction).
    fn driver(&self) -> &tokio_postgres::Client;
}

impl GenericClient for deadpool_postgres::Client {
    fn driver(&self) -> &tokio_postgres::Client {
        self
    }
}

impl GenericClient for deadpool_postgres::Transaction<'_> {
    fn driver(&self) -> &tokio_postgres::Client {
        self.client()
    }
}

/// The PostgreSQL types a parameter is declared as, in order of preference:
/// the first one the Rust value accepts is taken.
const PARAM_TYPES: &[Type] = &[
    Type::UUID,
    Type::TEXT,
    Type::INT8,
    Type::INT4,
    Type::TIMESTAMPTZ,
    Type::BOOL,
    Type::FLOAT8,
    Type::JSONB,
    Type::UUID_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT8_ARRAY,
    Type::INT4_ARRAY,
    Type::INT2,
    Type::FLOAT4,
    Type::BYTEA,
    Type::TIMESTAMPTZ_ARRAY,
    Type::BOOL_ARRAY,
    Type::FLOAT8_ARRAY,
    Type::FLOAT4_ARRAY,
    Type::JSONB_ARRAY,
    Type::INT2_ARRAY,
    Type::TIMESTAMP,
    Type::DATE,
    Type::JSON,
];

/// The type `value` is sent as: the first of `PARAM_TYPES` its `ToSql`
/// accepts (a `None` is typed like its `Some`). A value that accepts none
/// is sent as `unknown`, and binding it fails with the driver's error
/// naming the Rust type.
pub fn param_type(value: &(dyn ToSql + Sync)) -> Type {
    let mut scratch = bytes::BytesMut::new();
    for ty in PARAM_TYPES {
        scratch.clear();
        match value.to_sql_checked(ty, &mut scratch) {
            Ok(_) => return ty.clone(),
            // Accepted, but the value itself is refused: binding reports it.
            Err(e) if !e.is::<WrongType>() => return ty.clone(),
            Err(_) => {}
        }
    }
    Type::UNKNOWN
}

/// `params` with their types, for `query_typed`.
fn typed<'a>(params: Params<'a>) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    params.iter().map(|p| (*p, param_type(*p))).collect()
}

/// Runs `sql` (cached prepared statement, or behind a transaction-mode
/// pooler the unnamed statement: see the module's guarantees); every row.
async fn rows_of(client: &impl GenericClient, sql: &str, params: Params<'_>) -> Result<Vec<Row>, Error> {
    if crate::db::unnamed_statements() {
        Ok(client.driver().query_typed(sql, &typed(params)).await?)
    } else {
        let stmt = client.prepare_cached(sql).await?;
        Ok(client.query(&stmt, params).await?)
    }
}

/// [`rows_of`], for a statement that returns at most one row.
async fn row_of(client: &impl GenericClient, sql: &str, params: Params<'_>) -> Result<Option<Row>, Error> {
    let mut rows = rows_of(client, sql, params).await?;
    match rows.len() {
        0 | 1 => Ok(rows.pop()),
        n => Err(Error::Unexpected(format!("{n} rows where at most one was expected"))),
    }
}

/// [`rows_of`], for a statement that returns exactly one row.
async fn one_row(client: &impl GenericClient, sql: &str, params: Params<'_>) -> Result<Row, Error> {
    row_of(client, sql, params)
        .await?
        .ok_or_else(|| Error::Unexpected("no row where one was expected".into()))
}

/// A row of one statement, read by column name.
pub trait FromRow: Sized {
    fn from_row(row: &Row) -> Result<Self, Error>;
}

pub use column::UnknownName;
pub(crate) use column::{column, row_struct};

/// Reads every row of a result as `T`.
fn rows_as<T: FromRow>(rows: &[Row]) -> Result<Vec<T>, Error> {
    rows.iter().map(T::from_row).collect()
}

/// Reads an optional row as `T`.
fn row_as<T: FromRow>(row: Option<Row>) -> Result<Option<T>, Error> {
    row.as_ref().map(T::from_row).transpose()
}

/// A duration as the seconds `make_interval(secs => ..)` takes.
fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A count as a `LIMIT`.
fn as_limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Runs `sql`, reading every row as `T`.
async fn query_as<T: FromRow>(client: &impl GenericClient, sql: &str, params: Params<'_>) -> Result<Vec<T>, Error> {
    rows_as(&rows_of(client, sql, params).await?)
}

/// Runs `sql`, reading its row, if any, as `T`.
async fn query_opt_as<T: FromRow>(
    client: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
) -> Result<Option<T>, Error> {
    row_as(row_of(client, sql, params).await?)
}

/// Runs `sql`, reading its one row as `T`.
async fn query_one_as<T: FromRow>(client: &impl GenericClient, sql: &str, params: Params<'_>) -> Result<T, Error> {
    T::from_row(&one_row(client, sql, params).await?)
}

/// Runs `sql`, reading column `column` of every row.
async fn query_column<T: FromSqlOwned>(
    client: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
    column: &str,
) -> Result<Vec<T>, Error> {
    let rows = rows_of(client, sql, params).await?;
    rows.iter().map(|r| self::column(r, column)).collect()
}

/// Runs `sql`, reading column `column` of its row, if any.
async fn query_opt_value<T: FromSqlOwned>(
    client: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
    column: &str,
) -> Result<Option<T>, Error> {
    row_of(client, sql, params)
        .await?
        .map(|r| self::column(&r, column))
        .transpose()
}

/// Runs `sql`, reading column `column` of its one row.
async fn query_one_value<T: FromSqlOwned>(
    client: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
    column: &str,
) -> Result<T, Error> {
    self::column(&one_row(client, sql, params).await?, column)
}

/// Runs `sql`; true when it returned a row.
async fn query_found(client: &impl GenericClient, sql: &str, params: Params<'_>) -> Result<bool, Error> {
    Ok(row_of(client, sql, params).await?.is_some())
}

/// Executes `sql`; returns the rows it changed.
async fn execute(client: &impl GenericClient, sql: &str, params: Params<'_>) -> Result<u64, Error> {
    if crate::db::unnamed_statements() {
        Ok(client.driver().execute_typed(sql, &typed(params)).await?)
    } else {
        let stmt = client.prepare_cached(sql).await?;
        Ok(client.execute(&stmt, params).await?)
    }
}

/// Declares a file's statements from one list of `CONST = "name"`: each
/// constant holds `sql/queries/<name>.sql` (or, with `: TEXT`, that text,
/// e.g. a `concat!` of parts); `STATEMENTS` pairs names and texts for [`all`].
macro_rules! statements {
    ($($const:ident = $name:literal $(: $sql:expr)?,)+) => {
        $(const $const: &str = $crate::repo::statements!(@text $name $($sql)?);)+

        /// This file's statements, for [`super::all`].
        pub(super) const STATEMENTS: &[(&str, &str)] = &[$(($name, $const)),+];
    };
    (@text $name:literal) => {
        include_str!(concat!("../../sql/queries/", $name, ".sql"))
    };
    (@text $name:literal $sql:expr) => {
        $sql
    };
}
pub(crate) use statements;

row_struct! {
    /// A row of a statement that counts by status.
    struct StatusCount {
        status: Status,
        n: i64,
    }
}

/// Runs `sql`, a count by status: (status, count).
async fn status_counts(
    client: &impl GenericClient,
    sql: &str,
    params: Params<'_>,
) -> Result<Vec<(Status, i64)>, Error> {
    let rows: Vec<StatusCount> = query_as(client, sql, params).await?;
    Ok(rows.into_iter().map(|r| (r.status, r.n)).collect())
}

/// Declares the inputs of a statement as a struct whose fields are its
/// parameters in `$n` order, with `NAMES` (the field names, in that order,
/// for the test that compares them with the SQL's `-- $n name` comments)
/// and `params()` (the values to bind, in the same order). The struct, the
/// names and the binding come from one field list, so they cannot disagree.
macro_rules! statement_params {
    (
        $(#[$meta:meta])*
        struct $name:ident<$lt:lifetime> {
            $($(#[$fmeta:meta])* $field:ident: $ty:ty,)+
        }
    ) => {
        $(#[$meta])*
        struct $name<$lt> {
            $($(#[$fmeta])* $field: $ty,)+
        }

        impl<$lt> $name<$lt> {
            /// The parameter names, `$1` first.
            #[allow(dead_code)]
            const NAMES: &'static [&'static str] = &[$(stringify!($field)),+];

            /// The values to bind, `$1` first.
            fn params(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
                vec![$(&self.$field),+]
            }
        }
    };
}
pub(crate) use statement_params;

/// Every named statement, for the test that prepares them all.
pub fn all() -> Vec<(&'static str, &'static str)> {
    let mut all = attempts::statements();
    for file in [
        requests::STATEMENTS,
        steps::STATEMENTS,
        prompts::STATEMENTS,
        control::STATEMENTS,
        audit::STATEMENTS,
        callbacks::STATEMENTS,
        retention::STATEMENTS,
        idempotency::STATEMENTS,
        archive::STATEMENTS,
        memory::STATEMENTS,
        embeddings::STATEMENTS,
        deltas::STATEMENTS,
        stats::STATEMENTS,
        gauges::STATEMENTS,
        users::STATEMENTS,
        tenants::STATEMENTS,
        waits::STATEMENTS,
        reviews::STATEMENTS,
    ] {
        all.extend_from_slice(file);
    }
    all
}

/// The text of one named statement (as [`all`] lists it), for tests and
/// benchmarks that look at its plan.
pub fn statement(name: &str) -> Option<&'static str> {
    all().into_iter().find(|(n, _)| *n == name).map(|(_, sql)| sql)
}

#[cfg(test)]
mod param_type_tests {
    use chrono::{DateTime, Utc};
    use serde_json::json;
    use tokio_postgres::types::{ToSql, Type};
    use uuid::Uuid;

    use super::param_type;

    #[test]
    fn each_rust_value_is_sent_as_the_type_it_accepts() {
        let none_i64: Option<i64> = None;
        let none_text: Option<&str> = None;
        let cases: Vec<(Box<dyn ToSql + Sync>, Type)> = vec![
            (Box::new(Uuid::nil()), Type::UUID),
            (Box::new("text"), Type::TEXT),
            (Box::new(String::from("text")), Type::TEXT),
            (Box::new(none_text), Type::TEXT),
            (Box::new(7_i64), Type::INT8),
            (Box::new(none_i64), Type::INT8),
            (Box::new(7_i32), Type::INT4),
            (Box::new(7_i16), Type::INT2),
            (Box::new(1.5_f64), Type::FLOAT8),
            (Box::new(true), Type::BOOL),
            (Box::new(DateTime::<Utc>::UNIX_EPOCH), Type::TIMESTAMPTZ),
            (Box::new(json!({"a": 1})), Type::JSONB),
            (Box::new(vec![Uuid::nil()]), Type::UUID_ARRAY),
            (Box::new(vec![String::from("a")]), Type::TEXT_ARRAY),
            (Box::new(vec![1_i64]), Type::INT8_ARRAY),
            (Box::new(vec![1_i32]), Type::INT4_ARRAY),
            (Box::new(vec![true]), Type::BOOL_ARRAY),
            (Box::new(vec![json!(1)]), Type::JSONB_ARRAY),
        ];
        for (value, expected) in &cases {
            assert_eq!(param_type(value.as_ref()), *expected, "{value:?}");
        }
    }
}

#[cfg(test)]
pub(crate) mod params_check {
    //! Checks a `statement_params!` struct against its SQL.

    /// The `-- $n name` comments of `sql`, in order of `n`; panics on a gap.
    pub fn documented(sql: &str) -> Vec<String> {
        let mut named: Vec<(usize, String)> = sql
            .lines()
            .filter_map(|l| {
                let rest = l.trim().strip_prefix("--")?.trim().strip_prefix('$')?;
                let (n, name) = rest.split_once(char::is_whitespace)?;
                let n: usize = n.parse().ok()?;
                let name = name.split_whitespace().next()?.to_owned();
                Some((n, name))
            })
            .collect();
        named.sort();
        for (i, (n, _)) in named.iter().enumerate() {
            assert_eq!(*n, i + 1, "the parameter comments skip or repeat ${}", i + 1);
        }
        named.into_iter().map(|(_, name)| name).collect()
    }

    /// The highest `$n` the statement itself (comments left out) uses.
    pub fn highest(sql: &str) -> usize {
        let code: String = sql
            .lines()
            .map(|l| l.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let b = code.as_bytes();
        let mut max = 0;
        for (i, c) in b.iter().enumerate() {
            if *c == b'$' {
                let digits: String = code[i + 1..].chars().take_while(char::is_ascii_digit).collect();
                if let Ok(n) = digits.parse::<usize>() {
                    max = max.max(n);
                }
            }
        }
        max
    }

    /// Asserts that `names` are the parameters `sql` documents and uses.
    pub fn check(sql: &str, names: &[&str]) {
        assert_eq!(
            documented(sql),
            names,
            "the struct's fields and the SQL's `-- $n name` comments differ"
        );
        assert_eq!(
            highest(sql),
            names.len(),
            "the statement uses another number of parameters"
        );
    }
}
