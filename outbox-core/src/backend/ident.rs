//! SQL identifiers: [`QualifiedName`], the only way a schema or table name reaches a
//! statement of a SQL backend with schemas, and the names derived from it.
//!
//! Names follow [`validate_identifier`]'s portable rule (`^[a-z_][a-z0-9_]*$`) at the
//! engine's length ([`SqlDialect::MAX_IDENTIFIER_LEN`]) and are always quoted in SQL
//! ([`SqlDialect::quote`]), so a name can never change a statement's meaning. Values
//! are always bound parameters.

use std::fmt;
use std::marker::PhantomData;

use super::config::{SchemaRules, TableRules};
use crate::bounds::validate_identifier;
use crate::error::Result;
use crate::limits::MessageLimits;

/// How a SQL engine with schemas quotes and bounds identifiers. Implemented by a
/// backend's marker type, which then is the [`TableRules`] of its
/// [`TableConfig`](super::TableConfig)s (names are [`QualifiedName`]s, default schema
/// `outbox`).
pub trait SqlDialect: 'static {
    /// The longest identifier the engine keeps, in bytes.
    const MAX_IDENTIFIER_LEN: usize;

    /// `name` quoted for statement text, escaping what the quoting needs even though
    /// validated names never contain it (default: standard SQL, `"name"` with `"`
    /// doubled).
    fn quote(name: &str) -> String {
        format!("\"{}\"", name.replace('"', "\"\""))
    }

    /// The engine's own checks of an outbox's message limits (default: none); see
    /// [`TableRules::check_limits`].
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for limits the table cannot hold.
    fn check_limits(limits: &MessageLimits) -> Result<()> {
        let _ = limits;
        Ok(())
    }
}

impl<D: SqlDialect> TableRules for D {
    type Name = QualifiedName<D>;
    const SCHEMA: &'static str = "outbox";
    fn name(_store: &str, schema: &str, table: &str) -> Result<QualifiedName<D>> {
        QualifiedName::new(schema, table)
    }
    fn check_limits(limits: &MessageLimits) -> Result<()> {
        D::check_limits(limits)
    }
}

impl<D: SqlDialect> SchemaRules for D {}

/// A validated `schema.table` name under the dialect `D`. `Display` renders it
/// quoted, ready for SQL.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct QualifiedName<D> {
    schema: String,
    table: String,
    dialect: PhantomData<fn() -> D>,
}

impl<D: SqlDialect> QualifiedName<D> {
    /// Validate `schema` and `table`: 1 to [`SqlDialect::MAX_IDENTIFIER_LEN`] bytes of
    /// `a-z`, `0-9` and `_`, not starting with a digit.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) naming the bad part.
    pub fn new(schema: impl Into<String>, table: impl Into<String>) -> Result<Self> {
        let (schema, table) = (schema.into(), table.into());
        validate_identifier("schema", &schema, D::MAX_IDENTIFIER_LEN)?;
        validate_identifier("table", &table, D::MAX_IDENTIFIER_LEN)?;
        Ok(QualifiedName {
            schema,
            table,
            dialect: PhantomData,
        })
    }

    /// The schema.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Another table of the same schema: one of the backend's own tables (its version
    /// table), named by a constant that follows the rule.
    pub fn sibling(&self, table: &'static str) -> Self {
        debug_assert!(
            validate_identifier("table", table, D::MAX_IDENTIFIER_LEN).is_ok(),
            "{table}"
        );
        QualifiedName {
            schema: self.schema.clone(),
            table: table.to_owned(),
            dialect: PhantomData,
        }
    }

    /// The schema alone, quoted.
    pub fn quoted_schema(&self) -> String {
        D::quote(&self.schema)
    }

    /// A name for an object of this table (an index, a constraint):
    /// `<table>_<suffix>`, shortened with a hash when too long
    /// ([`derived_identifier`]). Not quoted; see [`quoted_derived`](Self::quoted_derived).
    pub fn derived(&self, suffix: &str) -> String {
        derived_identifier(&self.table, suffix, D::MAX_IDENTIFIER_LEN)
    }

    /// [`derived`](Self::derived), quoted.
    pub fn quoted_derived(&self, suffix: &str) -> String {
        D::quote(&self.derived(suffix))
    }
}

impl<D: SqlDialect> fmt::Display for QualifiedName<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", D::quote(&self.schema), D::quote(&self.table))
    }
}

impl<D: SqlDialect> fmt::Debug for QualifiedName<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QualifiedName({self})")
    }
}

/// A name made of `base` and `suffix` (`base_suffix`) that fits in `max_len` bytes:
/// when too long, `base` is cut and a stable hash of the full name keeps names
/// distinct (every process derives the same names). `base` and `suffix` are
/// validated identifiers (ASCII), and `suffix` is short.
pub fn derived_identifier(base: &str, suffix: &str, max_len: usize) -> String {
    let full = format!("{base}_{suffix}");
    if full.len() <= max_len {
        return full;
    }
    // Identifiers are ASCII, so any byte index is a char boundary.
    let hash = format!("{:08x}", fnv1a32(full.as_bytes()));
    let keep = max_len.saturating_sub(suffix.len() + hash.len() + 2);
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
    use crate::ErrorKind;

    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct Brackets;
    impl SqlDialect for Brackets {
        const MAX_IDENTIFIER_LEN: usize = 63;
        fn quote(name: &str) -> String {
            format!("[{}]", name.replace(']', "]]"))
        }
    }

    #[test]
    fn names_are_validated_and_quoted() {
        let name = QualifiedName::<Brackets>::new("s1", "t1").unwrap();
        assert_eq!(name.to_string(), "[s1].[t1]");
        assert_eq!(format!("{name:?}"), "QualifiedName([s1].[t1])");
        assert_eq!((name.schema(), name.table()), ("s1", "t1"));
        assert_eq!(name.quoted_schema(), "[s1]");
        assert_eq!(name.sibling("v").to_string(), "[s1].[v]", "same schema");
        assert_eq!(name.derived("due"), "t1_due");
        assert_eq!(name.quoted_derived("due"), "[t1_due]");
        QualifiedName::<Brackets>::new("a".repeat(63), "_").unwrap();
        for (schema, table) in [
            ("Bad", "t"),
            ("s", "x;drop table y"),
            ("", "t"),
            ("s", ""),
            ("s", &"t".repeat(64)),
            ("1s", "t"),
        ] {
            let err = QualifiedName::<Brackets>::new(schema, table).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{schema:?}.{table:?}");
        }
        let err = QualifiedName::<Brackets>::new("s", "T").unwrap_err();
        assert!(err.message().contains("table name"), "{err}");
        assert_eq!(
            <Brackets as TableRules>::name("outbox", "s1", "t").unwrap(),
            name.sibling("t")
        );
    }

    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct Standard;
    impl SqlDialect for Standard {
        const MAX_IDENTIFIER_LEN: usize = 63;
    }

    /// A dialect whose tables hold short partition keys only.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct ShortKeys;
    impl SqlDialect for ShortKeys {
        const MAX_IDENTIFIER_LEN: usize = 63;
        fn check_limits(limits: &MessageLimits) -> Result<()> {
            if limits.max_partition_key_len > 10 {
                return Err(crate::Error::config("keys over 10 bytes"));
            }
            Ok(())
        }
    }

    #[test]
    fn a_dialect_checks_limits_through_the_table_rules() {
        let wide = MessageLimits {
            max_partition_key_len: 11,
            ..MessageLimits::default()
        };
        let err = <ShortKeys as TableRules>::check_limits(&wide).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(<Standard as TableRules>::check_limits(&wide).is_ok());
        <ShortKeys as TableRules>::check_limits(&MessageLimits {
            max_partition_key_len: 10,
            ..MessageLimits::default()
        })
        .unwrap();
    }

    #[test]
    fn the_default_quoting_is_standard_sql() {
        assert_eq!(Standard::quote("a\"b"), "\"a\"\"b\"");
        let name = QualifiedName::<Standard>::new("s", "t").unwrap();
        assert_eq!(name.to_string(), "\"s\".\"t\"");
    }

    #[test]
    fn derived_identifiers_fit_and_stay_distinct() {
        assert_eq!(
            derived_identifier("outbox", "messages", 63),
            "outbox_messages"
        );
        let long_a = format!("{}a", "x".repeat(62));
        let long_b = format!("{}b", "x".repeat(62));
        let a = derived_identifier(&long_a, "due", 63);
        let b = derived_identifier(&long_b, "due", 63);
        assert!(a.len() <= 63 && b.len() <= 63);
        assert_ne!(a, b);
        assert!(a.ends_with("_due"));
        validate_identifier("index", &a, 63).unwrap();
        assert_eq!(a, derived_identifier(&long_a, "due", 63), "stable");
        // The exact shape: as much of the base as fits, the hash, the suffix; and the
        // hash is FNV-1a, which other processes (and older releases) also derive.
        assert_eq!(a.len(), 63);
        assert_eq!(&a[..50], &long_a[..50]);
        assert_eq!(
            a,
            format!(
                "{}_{:08x}_due",
                &long_a[..50],
                fnv1a32(format!("{long_a}_due").as_bytes())
            )
        );
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }
}
