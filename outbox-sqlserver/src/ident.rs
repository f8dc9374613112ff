//! SQL identifiers: [`QualifiedName`], the only way a schema or table name reaches a
//! statement, and the names derived from it.
//!
//! Names follow [`validate_identifier`]'s portable rule (`^[a-z_][a-z0-9_]*$`), at most
//! 128 characters (SQL Server's `sysname`), and are always bracket-quoted in SQL. The
//! rule already keeps `]` out of every accepted name; [`quote`] still escapes it (`]`
//! becomes `]]`, as `QUOTENAME` does), so quoting is correct even for a name that did
//! not come through validation. Values are always bound parameters. The type itself
//! is `outbox-core`'s, under [`MssqlRules`].

use outbox_core::backend::{self, SqlDialect};
use outbox_core::{Error, MessageLimits};

#[cfg(test)]
use outbox_core::backend::validate_identifier;

use crate::config::MAX_PARTITION_KEY_LEN;

/// The longest identifier SQL Server keeps (`sysname` is `nvarchar(128)`).
pub(crate) const MAX_IDENTIFIER_LEN: usize = 128;

/// SQL Server's identifier rules (128 characters, bracket-quoted), and so the rules of
/// this crate's table configs: names are [`QualifiedName`]s, the default schema
/// `outbox`, and partition keys must fit the indexed column
/// ([`MAX_PARTITION_KEY_LEN`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MssqlRules;

impl SqlDialect for MssqlRules {
    const MAX_IDENTIFIER_LEN: usize = MAX_IDENTIFIER_LEN;
    fn quote(name: &str) -> String {
        quote(name)
    }
    fn check_limits(limits: &MessageLimits) -> outbox_core::Result<()> {
        if limits.max_partition_key_len > MAX_PARTITION_KEY_LEN {
            return Err(Error::config(format!(
                "partition keys of up to {} bytes do not fit the indexed nvarchar({MAX_PARTITION_KEY_LEN}) column",
                limits.max_partition_key_len
            )));
        }
        Ok(())
    }
}

/// A validated `schema.table` name. `Display` renders it bracket-quoted,
/// `[schema].[table]`, ready for SQL.
///
/// ```
/// use outbox_sqlserver::QualifiedName;
///
/// let name = QualifiedName::new("billing", "outbox_messages")?;
/// assert_eq!(name.to_string(), "[billing].[outbox_messages]");
/// assert!(QualifiedName::new("billing", "x]; DROP TABLE y").is_err());
/// # Ok::<(), outbox_core::Error>(())
/// ```
pub type QualifiedName = backend::QualifiedName<MssqlRules>;

/// `name` bracket-quoted, with `]` doubled (what `QUOTENAME(name)` returns).
pub(crate) fn quote(name: &str) -> String {
    format!("[{}]", name.replace(']', "]]"))
}

/// `text` as a `N'...'` literal with `'` doubled. Used only for identifiers (already
/// validated) in DDL and catalog lookups, never for values.
pub(crate) fn literal(text: &str) -> String {
    format!("N'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn names_are_validated_and_bracket_quoted() {
        let name = QualifiedName::new("s1", "t1").unwrap();
        assert_eq!(name.to_string(), "[s1].[t1]");
        assert_eq!(name.quoted_schema(), "[s1]");
        assert_eq!(literal(&name.to_string()), "N'[s1].[t1]'");
        QualifiedName::new("a".repeat(128), "_").unwrap();
        for (schema, table) in [
            ("s", "a]b"),
            ("a]", "t"),
            ("s", "[t]"),
            ("s", "t' --"),
            ("s", &"t".repeat(129)),
        ] {
            let err = QualifiedName::new(schema, table).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{schema:?}.{table:?}");
        }
    }

    #[test]
    fn quoting_escapes_a_closing_bracket() {
        // Unreachable through validation, but quoting alone must already be safe.
        assert_eq!(quote("a]b"), "[a]]b]");
        assert_eq!(quote("x]; DROP TABLE y; --"), "[x]]; DROP TABLE y; --]");
        assert_eq!(literal("it's"), "N'it''s'");
    }

    #[test]
    fn derived_identifiers_fit_sql_server_length() {
        let long = format!("{}a", "x".repeat(127));
        let name = QualifiedName::new("s", long).unwrap();
        let index = name.derived("due");
        assert!(index.len() <= MAX_IDENTIFIER_LEN && index.ends_with("_due"));
        validate_identifier("index", &index, MAX_IDENTIFIER_LEN).unwrap();
    }
}
