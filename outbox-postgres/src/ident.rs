//! SQL identifiers: [`QualifiedName`], the only way a schema or table name reaches a
//! statement, and the names derived from it.
//!
//! Names follow [`validate_identifier`]'s portable rule (`^[a-z_][a-z0-9_]*$`), at most
//! 63 bytes (PostgreSQL's `NAMEDATALEN - 1`), and are always double-quoted in SQL, so
//! a name can never change a statement's meaning. Values are always bound parameters.

use std::fmt;

use outbox_core::names::validate_identifier;
use outbox_core::Result;

/// The longest identifier PostgreSQL keeps (`NAMEDATALEN - 1`).
pub(crate) const MAX_IDENTIFIER_LEN: usize = 63;

/// A validated `schema.table` name. `Display` renders it quoted, `"schema"."table"`,
/// ready for SQL.
///
/// ```
/// use outbox_postgres::QualifiedName;
///
/// let name = QualifiedName::new("billing", "outbox_messages")?;
/// assert_eq!(name.to_string(), r#""billing"."outbox_messages""#);
/// assert!(QualifiedName::new("billing", "x; DROP TABLE y").is_err());
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct QualifiedName {
    schema: String,
    table: String,
}

impl QualifiedName {
    /// Validate `schema` and `table`: 1 to 63 bytes of `a-z`, `0-9` and `_`, not
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

    /// The schema alone, quoted.
    pub(crate) fn quoted_schema(&self) -> Quoted<'_> {
        Quoted(&self.schema)
    }

    /// A name for an object of this table (an index, a channel): `<table>_<suffix>`,
    /// shortened with a hash when too long. Quoted when displayed.
    pub(crate) fn derived(&self, suffix: &str) -> Derived {
        Derived(derived_identifier(&self.table, suffix))
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", Quoted(&self.schema), Quoted(&self.table))
    }
}

impl fmt::Debug for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QualifiedName({self})")
    }
}

/// Validate one identifier against the portable rule at PostgreSQL's length.
pub(crate) fn validate(what: &str, name: &str) -> Result<()> {
    validate_identifier(what, name, MAX_IDENTIFIER_LEN)
}

/// A validated identifier, displayed double-quoted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0)
    }
}

/// A derived identifier (see [`QualifiedName::derived`]), displayed double-quoted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Derived(String);

impl fmt::Display for Derived {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Quoted(&self.0).fmt(f)
    }
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
    fn names_are_validated_and_quoted() {
        let name = QualifiedName::new("s1", "t1").unwrap();
        assert_eq!(name.to_string(), "\"s1\".\"t1\"");
        assert_eq!((name.schema(), name.table()), ("s1", "t1"));
        assert_eq!(name.quoted_schema().to_string(), "\"s1\"");
        assert_eq!(name.sibling("v").to_string(), "\"s1\".\"v\"", "same schema");
        QualifiedName::new("a".repeat(63), "_").unwrap();
        for (schema, table) in [
            ("Bad", "t"),
            ("s", "x;drop table y"),
            ("a\"b", "t"),
            ("", "t"),
            ("s", ""),
            ("s", &"t".repeat(64)),
            ("1s", "t"),
        ] {
            let err = QualifiedName::new(schema, table).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{schema:?}.{table:?}");
        }
        let err = QualifiedName::new("s", "T").unwrap_err();
        assert!(err.message().contains("table name"), "{err}");
    }

    #[test]
    fn derived_identifiers_fit_and_stay_distinct() {
        assert_eq!(derived_identifier("outbox", "messages"), "outbox_messages");
        let long_a = format!("{}a", "x".repeat(62));
        let long_b = format!("{}b", "x".repeat(62));
        let a = derived_identifier(&long_a, "due");
        let b = derived_identifier(&long_b, "due");
        assert!(a.len() <= MAX_IDENTIFIER_LEN && b.len() <= MAX_IDENTIFIER_LEN);
        assert_ne!(a, b);
        assert!(a.ends_with("_due"));
        validate("index", &a).unwrap();
        assert_eq!(a, derived_identifier(&long_a, "due"), "stable");
        let name = QualifiedName::new("s", "t").unwrap();
        assert_eq!(name.derived("due").to_string(), "\"t_due\"");
    }
}
