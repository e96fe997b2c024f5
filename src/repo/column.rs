//! Reading rows by column name: [`column()`], the [`row_struct!`] that
//! declares a row type with it, and the vocabulary types of
//! [`crate::model`] ([`Status`], [`StageKind`], [`Outcome`], [`PromptRole`],
//! [`OperatorAction`], [`DeliveryState`], …) read straight from their text
//! columns, so a row struct declares them as they are. A value that is not one of a type's names is an error naming
//! the value and the column, never a panic nor a string passed on.

use bytes::BytesMut;
use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};

use crate::db::Error;
use crate::model::{DeliveryState, FoundAs, MemoryKind, OperatorAction, Outcome, PromptRole, Scope, StageKind, Status};

/// Column `name` of `r` as a `T`. A vocabulary value the program does not
/// know (see [`UnknownName`]) is an [`Error::Unexpected`] naming the column
/// and the value; other failures are the driver's errors.
pub(crate) fn column<'a, T: FromSql<'a>>(r: &'a Row, name: &str) -> Result<T, Error> {
    r.try_get(name).map_err(
        |e| match std::error::Error::source(&e).and_then(|s| s.downcast_ref::<UnknownName>()) {
            Some(unknown) => Error::Unexpected(format!("column {name}: {unknown}")),
            None => Error::Postgres(e),
        },
    )
}

/// A text column held a value that is not one of the names of its type
/// (a row written by something else than this program).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}")]
pub struct UnknownName {
    /// What the column holds: `status`, `stage`, `outcome`, `prompt role`, ….
    pub what: &'static str,
    /// The value read (at most 64 characters of it).
    pub value: String,
}

/// Reads the vocabulary types of [`crate::model`] from text columns:
/// exactly their names (`as_str`); anything else is an [`UnknownName`].
/// Binds them as their names too, so a statement takes the type itself
/// (a `Vec` of them as a `text[]`).
macro_rules! text_columns {
    ($($ty:ident = $what:literal,)+) => {$(
        impl ToSql for $ty {
            fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
                self.as_str().to_sql(ty, out)
            }

            fn accepts(ty: &Type) -> bool {
                <&str as ToSql>::accepts(ty)
            }

            to_sql_checked!();
        }

        impl<'a> FromSql<'a> for $ty {
            fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<$ty, Box<dyn std::error::Error + Sync + Send>> {
                let name = <&str as FromSql>::from_sql(ty, raw)?;
                $ty::from_name(name).ok_or_else(|| {
                    let value = name.chars().take(64).collect();
                    UnknownName { what: $what, value }.into()
                })
            }

            fn accepts(ty: &Type) -> bool {
                <&str as FromSql>::accepts(ty)
            }
        }
    )+};
}

text_columns! {
    Status = "status",
    StageKind = "stage",
    Outcome = "outcome",
    PromptRole = "prompt role",
    Scope = "scope",
    MemoryKind = "memory kind",
    FoundAs = "reason a memory item was found",
    OperatorAction = "operator action",
    DeliveryState = "callback delivery state",
}

/// Declares a row type and its [`super::FromRow`] from one field list: each field
/// is read with [`column()`] from the column of its name, or from the column
/// written after it as `field = "column"` (a vocabulary type such as
/// [`Status`] straight from its text column). A field cannot be left out of
/// the reading, nor read from a column it does not name.
macro_rules! row_struct {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $($(#[$fmeta:meta])* $fvis:vis $field:ident $(= $col:literal)?: $ty:ty,)+
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $($(#[$fmeta])* $fvis $field: $ty,)+
        }

        impl $crate::repo::FromRow for $name {
            fn from_row(r: &tokio_postgres::Row) -> Result<$name, $crate::db::Error> {
                Ok($name {
                    $($field: $crate::repo::column(r, {
                        #[allow(unused_variables)]
                        let column = stringify!($field);
                        $(let column = $col;)?
                        column
                    })?,)+
                })
            }
        }
    };
}
pub(crate) use row_struct;

#[cfg(test)]
mod text_column_tests {
    use tokio_postgres::types::{FromSql, Type};

    use super::UnknownName;
    use crate::model::{Outcome, PromptRole, StageKind, Status};

    #[test]
    fn vocabulary_values_read_exactly_their_names() {
        for st in Status::ALL {
            assert_eq!(Status::from_sql(&Type::TEXT, st.as_str().as_bytes()).ok(), Some(st));
        }
        for o in Outcome::ALL {
            assert_eq!(Outcome::from_sql(&Type::VARCHAR, o.as_str().as_bytes()).ok(), Some(o));
        }
        assert_eq!(
            PromptRole::from_sql(&Type::TEXT, b"FinalResponder").ok(),
            Some(PromptRole::Responder)
        );
        assert!(<StageKind as FromSql>::accepts(&Type::TEXT));
        assert!(!<StageKind as FromSql>::accepts(&Type::INT4));
    }

    #[test]
    fn an_unknown_value_is_a_typed_error_naming_it() {
        let Err(e) = StageKind::from_sql(&Type::TEXT, b"Analyze") else {
            panic!("a name in the wrong case was read");
        };
        let unknown = e.downcast_ref::<UnknownName>().cloned();
        assert_eq!(
            unknown,
            Some(UnknownName {
                what: "stage",
                value: "Analyze".into()
            })
        );
        assert_eq!(e.to_string(), r#"unknown stage "Analyze""#);
    }
}
