//! Settings for [`MssqlOutbox`](crate::MssqlOutbox),
//! [`MssqlDedupStore`](crate::MssqlDedupStore) and
//! [`MssqlEntityStore`](crate::MssqlEntityStore).
//!
//! Setters are `with_*` and consume the config; getters are named after the fields.
//! Names are checked by `validate` (called by the stores' constructors) and reach SQL
//! only as a [`QualifiedName`]. The connection itself is
//! [`MssqlConnection`](crate::MssqlConnection).

use std::time::Duration;

use outbox_core::{Error, KeyOrder, MessageLimits, Result, Retention};

use crate::ident::QualifiedName;

/// The longest partition key the table holds, in characters: `partition_key` is
/// `nvarchar(400)`, so the `(partition_key, seq)` index key stays within SQL Server's
/// 1,700-byte limit for nonclustered index keys. A UTF-8 key of `n` bytes has at most
/// `n` UTF-16 code units, so a byte limit up to 400 always fits.
pub const MAX_PARTITION_KEY_LEN: usize = 400;

/// Where a [`MssqlOutbox`](crate::MssqlOutbox) keeps its messages and how it behaves.
///
/// ```
/// use std::time::Duration;
/// use outbox_core::{KeyOrder, Retention};
/// use outbox_sqlserver::MssqlOutboxConfig;
///
/// let config = MssqlOutboxConfig::default()
///     .with_schema("billing")
///     .with_ordering(KeyOrder::PerKey)
///     .with_retention(Retention::Keep { window: Duration::from_secs(86_400) });
/// config.validate()?;
/// assert_eq!(config.qualified_name()?.to_string(), "[billing].[outbox_messages]");
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MssqlOutboxConfig {
    schema: String,
    table: String,
    ordering: KeyOrder,
    retention: Retention,
    limits: MessageLimits,
}

impl Default for MssqlOutboxConfig {
    fn default() -> Self {
        MssqlOutboxConfig {
            schema: "outbox".to_owned(),
            table: "outbox_messages".to_owned(),
            ordering: KeyOrder::default(),
            retention: Retention::default(),
            limits: MessageLimits::default(),
        }
    }
}

impl MssqlOutboxConfig {
    /// Set the schema (default `outbox`).
    #[must_use]
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }
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
    /// against (default [`MessageLimits::default`]). The partition key limit may not
    /// exceed [`MAX_PARTITION_KEY_LEN`].
    #[must_use]
    pub fn with_limits(mut self, limits: MessageLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The schema.
    pub fn schema(&self) -> &str {
        &self.schema
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

    /// The validated `[schema].[table]`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a bad schema or table
    /// name.
    pub fn qualified_name(&self) -> Result<QualifiedName> {
        QualifiedName::new(self.schema.clone(), self.table.clone())
    }

    /// Check every setting.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        self.qualified_name()?;
        if let Retention::Keep { window } = self.retention {
            if window.is_zero() {
                return Err(Error::config("retention window must be above zero"));
            }
        }
        if self.limits.max_partition_key_len > MAX_PARTITION_KEY_LEN {
            return Err(Error::config(format!(
                "partition keys of up to {} bytes do not fit the indexed nvarchar({MAX_PARTITION_KEY_LEN}) column",
                self.limits.max_partition_key_len
            )));
        }
        Ok(())
    }
}

/// Where a [`MssqlDedupStore`](crate::MssqlDedupStore) keeps processed message ids,
/// and for how long.
///
/// ```
/// use std::time::Duration;
/// use outbox_sqlserver::MssqlDedupConfig;
///
/// let config = MssqlDedupConfig::default()
///     .with_table("orders_inbox")
///     .with_retention(Duration::from_secs(3600));
/// config.validate()?;
/// assert_eq!(config.table(), "orders_inbox");
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MssqlDedupConfig {
    schema: String,
    table: String,
    retention: Duration,
}

impl Default for MssqlDedupConfig {
    fn default() -> Self {
        MssqlDedupConfig {
            schema: "outbox".to_owned(),
            table: "outbox_inbox".to_owned(),
            retention: Duration::from_secs(7 * 24 * 60 * 60),
        }
    }
}

impl MssqlDedupConfig {
    /// Set the schema (default `outbox`).
    #[must_use]
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }
    /// Set the table (default `outbox_inbox`).
    #[must_use]
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }
    /// Set how long ids are remembered (default 7 days).
    #[must_use]
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }
    /// The schema.
    pub fn schema(&self) -> &str {
        &self.schema
    }
    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }
    /// How long ids are remembered.
    pub fn retention(&self) -> Duration {
        self.retention
    }
    /// The validated `[schema].[table]`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a bad name.
    pub fn qualified_name(&self) -> Result<QualifiedName> {
        QualifiedName::new(self.schema.clone(), self.table.clone())
    }
    /// Check every setting.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        self.qualified_name()?;
        if self.retention.is_zero() {
            return Err(Error::config("dedup retention must be above zero"));
        }
        Ok(())
    }
}

/// Where a [`MssqlEntityStore`](crate::MssqlEntityStore) keeps the entities of a
/// decoupled consumer.
///
/// ```
/// use outbox_sqlserver::MssqlEntityConfig;
///
/// let config = MssqlEntityConfig::default().with_table("accounts");
/// assert_eq!(config.qualified_name()?.to_string(), "[outbox].[accounts]");
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MssqlEntityConfig {
    schema: String,
    table: String,
}

impl Default for MssqlEntityConfig {
    fn default() -> Self {
        MssqlEntityConfig {
            schema: "outbox".to_owned(),
            table: "outbox_entities".to_owned(),
        }
    }
}

impl MssqlEntityConfig {
    /// Set the schema (default `outbox`).
    #[must_use]
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }
    /// Set the table (default `outbox_entities`).
    #[must_use]
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }
    /// The schema.
    pub fn schema(&self) -> &str {
        &self.schema
    }
    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }
    /// The validated `[schema].[table]`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a bad name.
    pub fn qualified_name(&self) -> Result<QualifiedName> {
        QualifiedName::new(self.schema.clone(), self.table.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn outbox_defaults_and_validation() {
        let c = MssqlOutboxConfig::default();
        c.validate().unwrap();
        assert_eq!(
            c.qualified_name().unwrap().to_string(),
            "[outbox].[outbox_messages]"
        );
        let mut wide = MessageLimits::default();
        wide.max_partition_key_len = MAX_PARTITION_KEY_LEN + 1;
        let bad = [
            c.clone().with_schema("Bad"),
            c.clone().with_table("x]; drop table y"),
            c.clone().with_retention(Retention::Keep {
                window: Duration::ZERO,
            }),
            c.clone().with_limits(wide),
        ];
        for config in bad {
            assert_eq!(
                config.validate().unwrap_err().kind(),
                ErrorKind::Config,
                "{config:?}"
            );
        }
        let keep = Retention::Keep {
            window: Duration::from_secs(5),
        };
        let limits = MessageLimits::default().with_max_payload_bytes(7);
        let c = c
            .with_schema("s")
            .with_table("t")
            .with_ordering(KeyOrder::PerKey)
            .with_retention(keep)
            .with_limits(limits.clone());
        assert_eq!((c.schema(), c.table()), ("s", "t"));
        assert_eq!((c.ordering(), c.retention()), (KeyOrder::PerKey, keep));
        assert_eq!(c.limits(), &limits);
    }

    #[test]
    fn dedup_and_entity_defaults() {
        let c = MssqlDedupConfig::default();
        c.validate().unwrap();
        assert_eq!(c.retention(), Duration::from_secs(7 * 24 * 3600));
        let d = c.clone().with_schema("s").with_table("t");
        assert_eq!((d.schema(), d.table()), ("s", "t"));
        assert!(c.clone().with_table("").validate().is_err());
        assert!(c.with_retention(Duration::ZERO).validate().is_err());
        let e = MssqlEntityConfig::default()
            .with_schema("s")
            .with_table("e");
        assert_eq!((e.schema(), e.table()), ("s", "e"));
        assert!(MssqlEntityConfig::default()
            .with_table("E")
            .qualified_name()
            .is_err());
    }
}
