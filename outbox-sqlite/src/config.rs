//! Settings for the stores of this crate.
//!
//! Setters are `with_*` and consume the config; getters are named after the fields.
//! Table names are checked by `validate` (called by the stores' constructors) and
//! reach SQL only as a [`TableName`].

use std::time::Duration;

use outbox_core::{Error, KeyOrder, MessageLimits, Result, Retention};

use crate::ident::TableName;

/// Where a [`SqliteOutbox`](crate::SqliteOutbox) keeps its messages and how it behaves.
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOutboxConfig {
    table: String,
    ordering: KeyOrder,
    retention: Retention,
    limits: MessageLimits,
}

impl Default for SqliteOutboxConfig {
    fn default() -> Self {
        SqliteOutboxConfig {
            table: "outbox_messages".to_owned(),
            ordering: KeyOrder::default(),
            retention: Retention::default(),
            limits: MessageLimits::default(),
        }
    }
}

impl SqliteOutboxConfig {
    /// Set the table (default `outbox_messages`).
    #[must_use]
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }
    /// Set the claim ordering (default [`KeyOrder::Unordered`]).
    #[must_use]
    pub fn with_ordering(mut self, ordering: KeyOrder) -> Self {
        self.ordering = ordering;
        self
    }
    /// Set what completing does (default [`Retention::Delete`]).
    #[must_use]
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }
    /// Set the limits every enqueued message, and every claimed row, is checked
    /// against (default [`MessageLimits::default`]).
    #[must_use]
    pub fn with_limits(mut self, limits: MessageLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }
    /// The claim ordering.
    pub fn ordering(&self) -> KeyOrder {
        self.ordering
    }
    /// What completing does.
    pub fn retention(&self) -> Retention {
        self.retention
    }
    /// The message limits.
    pub fn limits(&self) -> &MessageLimits {
        &self.limits
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
        if let Retention::Keep { window } = self.retention {
            if window.is_zero() {
                return Err(Error::config("retention window must be above zero"));
            }
        }
        Ok(())
    }
}

/// Where a [`SqliteDedupStore`](crate::SqliteDedupStore) keeps processed message ids,
/// and for how long.
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteDedupConfig {
    table: String,
    retention: Duration,
}

impl Default for SqliteDedupConfig {
    fn default() -> Self {
        SqliteDedupConfig {
            table: "outbox_inbox".to_owned(),
            retention: Duration::from_secs(7 * 24 * 60 * 60),
        }
    }
}

impl SqliteDedupConfig {
    /// Set the table (default `outbox_inbox`).
    #[must_use]
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }
    /// Set how long processed ids are remembered (default seven days). Make it longer
    /// than the longest time a broker may redeliver a message.
    #[must_use]
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }
    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }
    /// How long processed ids are remembered.
    pub fn retention(&self) -> Duration {
        self.retention
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
        if self.retention.is_zero() {
            return Err(Error::config("dedup retention must be above zero"));
        }
        Ok(())
    }
}

/// Where a [`SqliteEntityStore`](crate::SqliteEntityStore) keeps entities (default
/// table `outbox_entities`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteEntityConfig {
    table: String,
}

impl Default for SqliteEntityConfig {
    fn default() -> Self {
        SqliteEntityConfig {
            table: "outbox_entities".to_owned(),
        }
    }
}

impl SqliteEntityConfig {
    /// Set the table (default `outbox_entities`).
    #[must_use]
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }
    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }
    /// The validated table name.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a bad name.
    pub fn table_name(&self) -> Result<TableName> {
        TableName::new(self.table.clone())
    }
}

/// How a [`SqliteLock`](crate::SqliteLock) keeps its locks: the table (default
/// `outbox_locks`) and the lease a holder renews (default 30 s).
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
    use outbox_core::ErrorKind;

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
    fn getters_return_what_was_set() {
        let keep = Retention::Keep {
            window: Duration::from_secs(5),
        };
        let limits = MessageLimits::default().with_max_payload_bytes(7);
        let c = SqliteOutboxConfig::default()
            .with_table("t")
            .with_ordering(KeyOrder::PerKey)
            .with_retention(keep)
            .with_limits(limits.clone());
        assert_eq!(
            (c.table(), c.ordering(), c.retention(), c.limits()),
            ("t", KeyOrder::PerKey, keep, &limits)
        );
        let d = SqliteDedupConfig::default()
            .with_table("d")
            .with_retention(Duration::from_secs(9));
        assert_eq!((d.table(), d.retention()), ("d", Duration::from_secs(9)));
        let l = SqliteLockConfig::default()
            .with_table("l")
            .with_lease(Duration::from_secs(20));
        assert_eq!((l.table(), l.lease()), ("l", Duration::from_secs(20)));
        assert_eq!(SqliteEntityConfig::default().with_table("e").table(), "e");
    }
}
