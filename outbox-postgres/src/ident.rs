//! SQL identifiers: [`QualifiedName`], the only way a schema or table name reaches a
//! statement, and the names derived from it.
//!
//! Names follow [`validate_identifier`]'s portable rule (`^[a-z_][a-z0-9_]*$`), at most
//! 63 bytes (PostgreSQL's `NAMEDATALEN - 1`), and are always double-quoted in SQL, so
//! a name can never change a statement's meaning. Values are always bound parameters.
//! The type itself is `outbox-core`'s, under [`PgRules`].

use outbox_core::backend::validate_identifier;
use outbox_core::backend::{self, SqlDialect};
use outbox_core::Result;

/// PostgreSQL's identifier rules (63 bytes, double-quoted), and so the rules of this
/// crate's table configs: names are [`QualifiedName`]s, the default schema `outbox`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PgRules;

impl SqlDialect for PgRules {
    /// The longest identifier PostgreSQL keeps (`NAMEDATALEN - 1`).
    const MAX_IDENTIFIER_LEN: usize = 63;
}

/// The longest identifier PostgreSQL keeps.
pub(crate) const MAX_IDENTIFIER_LEN: usize = PgRules::MAX_IDENTIFIER_LEN;

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
pub type QualifiedName = backend::QualifiedName<PgRules>;

/// Validate one identifier against the portable rule at PostgreSQL's length.
pub(crate) fn validate(what: &str, name: &str) -> Result<()> {
    validate_identifier(what, name, MAX_IDENTIFIER_LEN)
}

/// A name made of `base` and `suffix` (`base_suffix`) that fits in an identifier.
pub(crate) fn derived_identifier(base: &str, suffix: &str) -> String {
    backend::derived_identifier(base, suffix, MAX_IDENTIFIER_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_quotes_with_double_quotes_and_keeps_63_bytes() {
        assert_eq!(PgRules::quote("t1"), "\"t1\"");
        let long = format!("{}a", "x".repeat(62));
        let derived = derived_identifier(&long, "due");
        assert!(derived.len() <= MAX_IDENTIFIER_LEN, "{derived}");
        validate("index", &derived).unwrap();
        assert!(QualifiedName::new("s", "t".repeat(64)).is_err());
        assert!(QualifiedName::new("a".repeat(63), "_").is_ok());
    }
}
