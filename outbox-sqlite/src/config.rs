//! Settings for the stores of this crate.
//!
//! Setters are `with_*` and consume the config; getters are named after the fields.
//! Table names are checked by `validate` (called by the stores' constructors) and
//! reach SQL only as a [`TableName`].

use std::time::Duration;

use outbox_core::backend::{
    DedupTable, EntityTable, OutboxTable, TableConfig, TableOnlyRules, TableRules,
};
use outbox_core::{Error, Result};

use crate::ident::TableName;

/// SQLite's rules for the tables of this crate's stores: one quoted table name
/// ([`TableName`], no schema), the default names `outbox_messages`, `outbox_inbox` and
/// `outbox_entities`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqliteRules;

impl TableRules for SqliteRules {
    type Name = TableName;
    fn name(_store: &str, _schema: &str, table: &str) -> Result<TableName> {
        TableName::new(table)
    }
}

impl TableOnlyRules for SqliteRules {}

/// Where a [`SqliteOutbox`](crate::SqliteOutbox) keeps its messages and how it behaves
/// (default table `outbox_messages`).
///
/// ```
/// use std::time::Duration;
/// use outbox_core::{KeyOrder, Retention};
/// use outbox_sqlite::SqliteOutboxConfig;
///
/// let config = SqliteOutboxConfig::default()
///     .with_table("billing_outbox")
///     .with_ordering(KeyOrder::PerKey)
///     .with_retention(Retention::Keep { window: Duration::from_secs(86_400) });
/// config.validate()?;
/// # Ok::<(), outbox_core::Error>(())
/// ```
pub type SqliteOutboxConfig = TableConfig<SqliteRules, OutboxTable>;

/// Where a [`SqliteDedupStore`](crate::SqliteDedupStore) keeps processed message ids,
/// and for how long (default table `outbox_inbox`, seven days).
///
/// ```
/// use std::time::Duration;
/// use outbox_sqlite::SqliteDedupConfig;
///
/// let config = SqliteDedupConfig::default().with_retention(Duration::from_secs(3600));
/// config.validate()?;
/// assert_eq!(config.table(), "outbox_inbox");
/// # Ok::<(), outbox_core::Error>(())
/// ```
pub type SqliteDedupConfig = TableConfig<SqliteRules, DedupTable>;

/// Where a [`SqliteEntityStore`](crate::SqliteEntityStore) keeps entities (default
/// table `outbox_entities`).
pub type SqliteEntityConfig = TableConfig<SqliteRules, EntityTable>;

/// How a [`SqliteDistributedLock`](crate::SqliteDistributedLock) keeps its locks: the
/// table (default `outbox_locks`) and the lease a holder renews (default 30 s).
///
/// A held lock is renewed every third of its lease by a task of the holder; a holder
/// that dies without unlocking frees the lock when the lease runs out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteLockConfig {
    table: String,
    lease: Duration,
}

impl Default for SqliteLockConfig {
    fn default() -> Self {
        SqliteLockConfig {
            table: "outbox_locks".to_owned(),
            lease: Duration::from_secs(30),
        }
    }
}

impl SqliteLockConfig {
    /// The shortest lease, three [`BUSY_TIMEOUT`](crate::BUSY_TIMEOUT)s: a renewal
    /// that waits out the busy timeout for the write lock must still leave time for
    /// the next attempt.
    pub const MIN_LEASE: Duration = Duration::from_secs(3 * crate::BUSY_TIMEOUT.as_secs());

    /// Set the table (default `outbox_locks`).
    #[must_use]
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }
    /// Set the lease (default 30 s, at least [`MIN_LEASE`](Self::MIN_LEASE)).
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }
    /// The lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }
    /// The validated table name.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a bad name.
    pub fn table_name(&self) -> Result<TableName> {
        TableName::new(self.table.clone())
    }
    /// Check every setting.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        self.table_name()?;
        if self.lease < Self::MIN_LEASE || self.lease > outbox_core::store::MAX_LEASE {
            return Err(Error::config(format!(
                "lock lease of {:?} is outside {:?}..={:?}",
                self.lease,
                Self::MIN_LEASE,
                outbox_core::store::MAX_LEASE
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::{ErrorKind, Retention};

    #[test]
    fn defaults_validate_and_bad_settings_are_refused() {
        SqliteOutboxConfig::default().validate().unwrap();
        SqliteDedupConfig::default().validate().unwrap();
        SqliteLockConfig::default().validate().unwrap();
        SqliteEntityConfig::default().table_name().unwrap();
        let errors = [
            SqliteOutboxConfig::default().with_table("Bad").validate(),
            SqliteOutboxConfig::default()
                .with_retention(Retention::Keep {
                    window: Duration::ZERO,
                })
                .validate(),
            SqliteDedupConfig::default()
                .with_retention(Duration::ZERO)
                .validate(),
            SqliteDedupConfig::default().with_table("a b").validate(),
            SqliteLockConfig::default()
                .with_lease(Duration::from_millis(14_999))
                .validate(),
            SqliteLockConfig::default()
                .with_lease(Duration::from_secs(86_401))
                .validate(),
            SqliteEntityConfig::default()
                .with_table("x;y")
                .table_name()
                .map(|_| ()),
        ];
        for error in errors {
            assert_eq!(error.unwrap_err().kind(), ErrorKind::Config);
        }
        SqliteLockConfig::default()
            .with_lease(SqliteLockConfig::MIN_LEASE)
            .validate()
            .unwrap();
    }

    #[test]
    fn lock_settings_are_kept() {
        let l = SqliteLockConfig::default()
            .with_table("l")
            .with_lease(Duration::from_secs(20));
        assert_eq!((l.table(), l.lease()), ("l", Duration::from_secs(20)));
        assert_eq!(
            SqliteEntityConfig::default()
                .table_name()
                .unwrap()
                .to_string(),
            "\"outbox_entities\""
        );
    }
}
