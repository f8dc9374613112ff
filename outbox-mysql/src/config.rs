//! The stores' configs (the kit's `TableConfig`s) and identifier rules ([`MySqlRules`]).
//! A "schema" is a MySQL database, created by `install` when missing.

use outbox_core::backend::{self, DedupTable, EntityTable, OutboxTable, SqlDialect, TableConfig};
use std::time::Duration;

pub use outbox_core::backend::held::{DEFAULT_HELD_CONNECTIONS, DEFAULT_SWEEP_INTERVAL};
use outbox_core::{ClaimMode, Error, MessageLimits, Result};

/// MySQL's identifier rules (64 bytes, quoted with backticks), and so the rules of this
/// crate's table configs: names are [`QualifiedName`]s, the default schema `outbox`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MySqlRules;

/// The most bytes the destination and partition key columns hold (`VARBINARY(1024)`,
/// the key being indexed); configs whose [`MessageLimits`] allow more are refused.
pub const MAX_TEXT_BYTES: usize = 1024;

impl SqlDialect for MySqlRules {
    /// The longest identifier MySQL and MariaDB keep.
    const MAX_IDENTIFIER_LEN: usize = 64;

    fn quote(name: &str) -> String {
        format!("`{}`", name.replace('`', "``"))
    }

    fn check_limits(limits: &MessageLimits) -> Result<()> {
        let widest = limits.max_destination_len.max(limits.max_partition_key_len);
        if widest > MAX_TEXT_BYTES {
            return Err(Error::config(format!(
                "message limits of {widest} bytes exceed the {MAX_TEXT_BYTES}-byte columns"
            )));
        }
        Ok(())
    }
}

/// A validated `schema.table` name; `Display` renders it quoted, `` `schema`.`table` ``.
///
/// ```
/// use outbox_mysql::QualifiedName;
///
/// let name = QualifiedName::new("billing", "outbox_messages")?;
/// assert_eq!(name.to_string(), "`billing`.`outbox_messages`");
/// assert!(QualifiedName::new("billing", "x; DROP TABLE y").is_err());
/// # Ok::<(), outbox_core::Error>(())
/// ```
pub type QualifiedName = backend::QualifiedName<MySqlRules>;

/// Where a [`MySqlOutbox`](crate::MySqlOutbox) keeps its messages (default
/// `` `outbox`.`outbox_messages` ``), its claim order, retention and limits.
///
/// ```
/// use outbox_core::KeyOrder;
/// use outbox_mysql::MySqlOutboxConfig;
///
/// let config = MySqlOutboxConfig::default().with_schema("billing").with_ordering(KeyOrder::PerKey);
/// config.validate()?;
/// # Ok::<(), outbox_core::Error>(())
/// ```
pub type MySqlOutboxConfig = TableConfig<MySqlRules, OutboxTable>;

/// Where a [`MySqlDedupStore`](crate::MySqlDedupStore) keeps processed ids (default
/// `` `outbox`.`outbox_inbox` ``), and for how long (seven days).
pub type MySqlDedupConfig = TableConfig<MySqlRules, DedupTable>;

/// Where a [`MySqlEntityStore`](crate::MySqlEntityStore) keeps entities (default
/// `` `outbox`.`outbox_entities` ``).
pub type MySqlEntityConfig = TableConfig<MySqlRules, EntityTable>;

/// How a [`MySqlOutbox`](crate::MySqlOutbox)'s relays claim messages
/// ([`MySqlOutbox::with_claims`](crate::MySqlOutbox::with_claims)).
///
/// ```
/// use outbox_core::ClaimMode;
/// use outbox_mysql::MySqlClaimConfig;
///
/// let claims = MySqlClaimConfig::default()
///     .with_claim_mode(ClaimMode::HeldLock)
///     .with_held_connections(8);
/// assert_eq!(claims.held_connections(), 8);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MySqlClaimConfig {
    mode: ClaimMode,
    held_connections: u32,
    sweep_interval: Duration,
}

impl Default for MySqlClaimConfig {
    fn default() -> Self {
        MySqlClaimConfig {
            mode: ClaimMode::Lease,
            held_connections: DEFAULT_HELD_CONNECTIONS,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
        }
    }
}

impl MySqlClaimConfig {
    /// Set how claims hold messages (default [`ClaimMode::Lease`]).
    ///
    /// With [`ClaimMode::HeldLock`] (MariaDB only: it bounds the held transaction with
    /// `idle_transaction_timeout`, which MySQL lacks) a claim locks its rows in a
    /// transaction on a connection of its own and writes nothing to them; the settle
    /// runs in that transaction and commits it. The modes can share one table.
    #[must_use]
    pub fn with_claim_mode(mut self, mode: ClaimMode) -> Self {
        self.mode = mode;
        self
    }

    /// Set the most connections held-lock claims keep open at once (default
    /// [`DEFAULT_HELD_CONNECTIONS`], at least 1): one per batch held, so at least
    /// `pipeline_depth` of every relay on the store, plus one per concurrent
    /// [`dispatch_ids`](outbox_core::Relay::dispatch_ids) call. Unused in lease mode.
    #[must_use]
    pub fn with_held_connections(mut self, connections: u32) -> Self {
        self.held_connections = connections.max(1);
        self
    }

    /// Set how often held-lock claims look for batches whose relay ended without
    /// settling them, to charge their messages an attempt (default
    /// [`DEFAULT_SWEEP_INTERVAL`]; zero sweeps before every claim). The first claim of
    /// a store always sweeps.
    #[must_use]
    pub fn with_sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// How claims hold messages.
    pub fn claim_mode(&self) -> ClaimMode {
        self.mode
    }

    /// The most connections held-lock claims keep open.
    pub fn held_connections(&self) -> u32 {
        self.held_connections
    }

    /// How often held-lock claims sweep ended batches.
    pub fn sweep_interval(&self) -> Duration {
        self.sweep_interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn names_are_backquoted_and_limits_fit_the_columns() {
        let name = MySqlOutboxConfig::default().qualified_name().unwrap();
        assert_eq!(name.to_string(), "`outbox`.`outbox_messages`");
        assert!(QualifiedName::new("s", "t".repeat(65)).is_err());
        assert!(QualifiedName::new("s", "t".repeat(64)).is_ok());
        let mut wide = MessageLimits::default();
        wide.max_partition_key_len = MAX_TEXT_BYTES + 1;
        let err = MySqlOutboxConfig::default().with_limits(wide).validate();
        assert_eq!(err.unwrap_err().kind(), ErrorKind::Config);
        let dedup = MySqlDedupConfig::default().qualified_name().unwrap();
        assert_eq!(dedup.to_string(), "`outbox`.`outbox_inbox`");
    }
}
