//! Every SQL statement the program runs, one file per table (or group of
//! tables that one statement changes together), behind typed functions.
//!
//! Guarantees:
//! - No SQL text leaves this module: statements are private to their file
//!   (embedded from `sql/queries/` at build time) and callers see only
//!   functions and row types. [`all`] lists every statement for the test
//!   that prepares them against the schema.
//! - Each statement is prepared once per connection and cached
//!   (`prepare_cached`); a function makes the round trips its doc says,
//!   usually one.
//! - Rows are read by column name into small typed structs ([`FromRow`]),
//!   never by position; a renamed or missing column is an error naming it.
//! - Statements with many inputs bind them from a struct declared with
//!   `statement_params!`, whose field order a unit test checks against the
//!   `-- $n name` comments of the SQL.
//! - Functions accept any `GenericClient`, so callers choose between a
//!   pooled connection and a transaction.
//!
//! Files: [`requests`] (`pipeline_runs`: submit, read, operator
//! transitions), [`attempts`] (`pipeline_runs` and `pipeline_steps`: claim,
//! lease renewal, finish, reclaim — the dispatcher's hot path), [`steps`],
//! [`prompts`], [`control`], [`audit`] (`operator_actions`), [`callbacks`]
//! (`callback_outbox`), [`retention`], [`idempotency`], [`archive`]
//! (`archive_*`, `raw_logs`, `lsm_storage`), [`memory`] (a request's
//! memory from `raw_logs` and `lsm_storage`, read only), [`stats`] (aggregates and
//! server state for `maasctl stats` and `doctor`).

use std::time::Duration;

use tokio_postgres::Row;

use crate::db::Error;

pub mod archive;
pub mod attempts;
pub mod audit;
pub mod callbacks;
pub mod control;
pub mod idempotency;
pub mod memory;
pub mod prompts;
pub mod requests;
pub mod retention;
pub mod stats;
pub mod steps;

// The dispatcher's statements, at the paths it calls them by.
pub use attempts::{
    Applied, Claimed, Finished, FusedAssemble, Reclaimed, claim_next, claim_sql, extend_leases, finish_batch,
    reclaim_expired,
};
pub use prompts::active_prompts;
pub use requests::{due_counts, ring_due};

/// A row of one statement, read by column name.
pub trait FromRow: Sized {
    fn from_row(row: &Row) -> Result<Self, Error>;
}

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
        stats::STATEMENTS,
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
