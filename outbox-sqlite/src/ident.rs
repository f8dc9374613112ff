//! [`TableName`]: the only way a table name reaches a statement.
//!
//! Names follow [`validate_identifier`]'s portable rule (`^[a-z_][a-z0-9_]*$`), at most
//! [`MAX_TABLE_LEN`] bytes, and are always double-quoted in SQL, so a name can never
//! change a statement's meaning. Values are always bound parameters.

use std::fmt;

use outbox_core::backend::validate_identifier;
use outbox_core::Result;

/// The longest table name accepted: SQLite has no limit of its own, this one keeps
/// names portable to the other backends (PostgreSQL keeps 63 bytes).
pub const MAX_TABLE_LEN: usize = 63;

/// A validated table name. `Display` renders it quoted (`"outbox_messages"`), ready
/// for SQL.
///
/// ```
/// use outbox_sqlite::TableName;
///
/// let name = TableName::new("outbox_messages")?;
/// assert_eq!(name.to_string(), r#""outbox_messages""#);
/// assert!(TableName::new("x; DROP TABLE y").is_err());
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName(String);

impl TableName {
    /// Validate `table`: 1 to [`MAX_TABLE_LEN`] bytes of `a-z`, `0-9` and `_`, not
    /// starting with a digit.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when it breaks the rule.
    pub fn new(table: impl Into<String>) -> Result<Self> {
        let table = table.into();
        validate_identifier("table", &table, MAX_TABLE_LEN)?;
        Ok(TableName(table))
    }

    /// The bare name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The quoted name of an object derived from this one (`"<table>_<suffix>"`, an
    /// index say). The suffix is one of this crate's constants and follows the rule,
    /// so the result needs no further check (SQLite has no length limit).
    pub(crate) fn derived(&self, suffix: &'static str) -> String {
        debug_assert!(suffix.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
        format!("\"{}_{suffix}\"", self.0)
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0)
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn names_are_validated_and_quoted() {
        let t = TableName::new("orders_outbox").unwrap();
        assert_eq!(t.to_string(), "\"orders_outbox\"");
        assert_eq!(t.derived("due"), "\"orders_outbox_due\"");
        assert_eq!(t.as_str(), "orders_outbox");
        for bad in ["", "Upper", "1abc", "a-b", "a\"b", "a b", &"x".repeat(64)] {
            assert_eq!(
                TableName::new(bad).unwrap_err().kind(),
                ErrorKind::Config,
                "{bad:?}"
            );
        }
        assert!(TableName::new("x".repeat(63)).is_ok());
    }
}
