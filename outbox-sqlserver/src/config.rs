//! Settings for [`MssqlOutbox`](crate::MssqlOutbox),
//! [`MssqlDedupStore`](crate::MssqlDedupStore) and
//! [`MssqlEntityStore`](crate::MssqlEntityStore).
//!
//! Setters are `with_*` and consume the config; getters are named after the fields.
//! Names are checked by `validate` (called by the stores' constructors) and reach SQL
//! only as a [`QualifiedName`](crate::QualifiedName). The configs are `outbox-core`'s
//! [`TableConfig`] under [`MssqlRules`]. The connection itself is
//! [`MssqlConnection`](crate::MssqlConnection).

use outbox_core::backend::{DedupTable, EntityTable, OutboxTable, TableConfig};

use crate::ident::MssqlRules;

/// The longest partition key the table holds, in characters: `partition_key` is
/// `nvarchar(400)`, so the `(partition_key, seq)` index key stays within SQL Server's
/// 1,700-byte limit for nonclustered index keys. A UTF-8 key of `n` bytes has at most
/// `n` UTF-16 code units, so a byte limit up to 400 always fits.
pub const MAX_PARTITION_KEY_LEN: usize = 400;

/// Where a [`MssqlOutbox`](crate::MssqlOutbox) keeps its messages and how it behaves
/// (default `[outbox].[outbox_messages]`). The partition key limit may not exceed
/// [`MAX_PARTITION_KEY_LEN`].
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
pub type MssqlOutboxConfig = TableConfig<MssqlRules, OutboxTable>;

/// Where a [`MssqlDedupStore`](crate::MssqlDedupStore) keeps processed message ids,
/// and for how long (default `[outbox].[outbox_inbox]`, seven days).
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
pub type MssqlDedupConfig = TableConfig<MssqlRules, DedupTable>;

/// Where a [`MssqlEntityStore`](crate::MssqlEntityStore) keeps the entities of a
/// decoupled consumer (default `[outbox].[outbox_entities]`).
///
/// ```
/// use outbox_sqlserver::MssqlEntityConfig;
///
/// let config = MssqlEntityConfig::default().with_table("accounts");
/// assert_eq!(config.qualified_name()?.to_string(), "[outbox].[accounts]");
/// # Ok::<(), outbox_core::Error>(())
/// ```
pub type MssqlEntityConfig = TableConfig<MssqlRules, EntityTable>;

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::{ErrorKind, MessageLimits};

    #[test]
    fn partition_keys_must_fit_the_column_and_names_are_bracketed() {
        let mut wide = MessageLimits::default();
        wide.max_partition_key_len = MAX_PARTITION_KEY_LEN + 1;
        let err = MssqlOutboxConfig::default()
            .with_limits(wide)
            .validate()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.message().contains("nvarchar(400)"), "{err}");
        let names = [
            MssqlOutboxConfig::default().display_name(),
            MssqlDedupConfig::default().display_name(),
            MssqlEntityConfig::default().display_name(),
        ];
        assert_eq!(
            names,
            [
                "[outbox].[outbox_messages]",
                "[outbox].[outbox_inbox]",
                "[outbox].[outbox_entities]"
            ]
        );
    }
}
