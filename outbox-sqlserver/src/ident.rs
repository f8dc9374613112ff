//! SQL identifiers: [`QualifiedName`], the only way a schema or table name reaches a
//! statement, and the names derived from it.
//!
//! Names follow [`validate_identifier`]'s portable rule (`^[a-z_][a-z0-9_]*$`), at most
//! 128 characters (SQL Server's `sysname`), and are always bracket-quoted in SQL. The
//! rule already keeps `]` out of every accepted name; [`quote`] still escapes it (`]`
//! becomes `]]`, as `QUOTENAME` does), so quoting is correct even for a name that did
//! not come through validation. Values are always bound parameters.

use std::fmt;

use outbox_core::names::validate_identifier;
use outbox_core::Result;

/// The longest identifier SQL Server keeps (`sysname` is `nvarchar(128)`).
pub(crate) const MAX_IDENTIFIER_LEN: usize = 128;

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
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct QualifiedName {
    schema: String,
    table: String,
}

impl QualifiedName {
    /// Validate `schema` and `table`: 1 to 128 bytes of `a-z`, `0-9` and `_`, not
    /// starting with a digit.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) naming the bad part.
    pub fn new(schema: impl Into<String>, table: impl Into<String>) -> Result<Self> {
        let (schema, table) = (schema.into(), table.into());
        validate("schema", &schema)?;
        validate("table", &table)?;
        Ok(QualifiedName { schema, table })
    }

    /// The schema.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Another table of the same schema: one of this crate's own tables (the version
    /// table), named by a constant that follows the rule.
    pub(crate) fn sibling(&self, table: &'static str) -> QualifiedName {
        debug_assert!(validate("table", table).is_ok(), "{table}");
        QualifiedName {
            schema: self.schema.clone(),
            table: table.to_owned(),
        }
    }

    /// The schema alone, bracket-quoted.
    pub(crate) fn quoted_schema(&self) -> String {
        quote(&self.schema)
    }

    /// A name for an object of this table (an index, a constraint):
    /// `<table>_<suffix>`, shortened with a hash when too long. Not quoted: use
    /// [`quote`] in statements and [`literal`] in catalog lookups.
    pub(crate) fn derived(&self, suffix: &str) -> String {
        derived_identifier(&self.table, suffix)
    }

    /// The name as a Unicode string literal for catalog functions
    /// (`OBJECT_ID(N'[s].[t]')`).
    pub(crate) fn literal(&self) -> String {
        literal(&self.to_string())
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", quote(&self.schema), quote(&self.table))
    }
}

impl fmt::Debug for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QualifiedName({self})")
    }
}

/// Validate one identifier against the portable rule at SQL Server's length.
pub(crate) fn validate(what: &str, name: &str) -> Result<()> {
    validate_identifier(what, name, MAX_IDENTIFIER_LEN)
}

/// `name` bracket-quoted, with `]` doubled (what `QUOTENAME(name)` returns).
pub(crate) fn quote(name: &str) -> String {
    format!("[{}]", name.replace(']', "]]"))
}

/// `text` as a `N'...'` literal with `'` doubled. Used only for identifiers (already
/// validated) in DDL and catalog lookups, never for values.
pub(crate) fn literal(text: &str) -> String {
    format!("N'{}'", text.replace('\'', "''"))
}

/// A name made of `base` and `suffix` (`base_suffix`) that fits in an identifier: when
/// too long, `base` is cut and a hash of the full name keeps names distinct.
pub(crate) fn derived_identifier(base: &str, suffix: &str) -> String {
    let full = format!("{base}_{suffix}");
    if full.len() <= MAX_IDENTIFIER_LEN {
        return full;
    }
    // Identifiers are ASCII, so any byte index is a char boundary.
    let hash = format!("{:08x}", fnv1a32(full.as_bytes()));
    let keep = MAX_IDENTIFIER_LEN - suffix.len() - hash.len() - 2;
    format!("{}_{hash}_{suffix}", &base[..keep.min(base.len())])
}

/// A stable hash (FNV-1a): every process must derive the same names.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h: u32, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn names_are_validated_and_bracket_quoted() {
        let name = QualifiedName::new("s1", "t1").unwrap();
        assert_eq!(name.to_string(), "[s1].[t1]");
        assert_eq!((name.schema(), name.table()), ("s1", "t1"));
        assert_eq!(name.quoted_schema(), "[s1]");
        assert_eq!(name.sibling("v").to_string(), "[s1].[v]");
        assert_eq!(name.literal(), "N'[s1].[t1]'");
        QualifiedName::new("a".repeat(128), "_").unwrap();
        for (schema, table) in [
            ("Bad", "t"),
            ("s", "x;drop table y"),
            ("s", "a]b"),
            ("a]", "t"),
            ("s", "[t]"),
            ("s", "t' --"),
            ("", "t"),
            ("s", ""),
            ("s", &"t".repeat(129)),
            ("1s", "t"),
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
    fn derived_identifiers_fit_and_stay_distinct() {
        assert_eq!(derived_identifier("outbox", "due"), "outbox_due");
        let long_a = format!("{}a", "x".repeat(127));
        let long_b = format!("{}b", "x".repeat(127));
        let a = derived_identifier(&long_a, "due");
        let b = derived_identifier(&long_b, "due");
        assert!(a.len() <= MAX_IDENTIFIER_LEN && b.len() <= MAX_IDENTIFIER_LEN);
        assert_ne!(a, b);
        assert!(a.ends_with("_due"));
        validate("index", &a).unwrap();
        assert_eq!(a, derived_identifier(&long_a, "due"), "stable");
    }
}
