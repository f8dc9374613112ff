//! Settings for [`PgOutbox`](crate::PgOutbox) and [`PgDedupStore`](crate::PgDedupStore).
//!
//! Setters are `with_*` and consume the config; getters are named after the fields.
//! Names are checked by [`validate`](PgOutboxConfig::validate) (called by the stores'
//! constructors) and reach SQL only as a [`QualifiedName`].

use std::time::Duration;

use outbox_core::backend::{DedupTable, EntityTable, OutboxTable, TableConfig};
use outbox_core::{ClaimMode, KeyOrder, MessageLimits, Result, Retention};

use crate::ident::{self, derived_identifier, PgRules, QualifiedName};

/// Whether enqueueing sends a `NOTIFY`, for relays woken by
/// [`spawn_listener`](crate::spawn_listener). Off by default.
///
/// # The trade-off
///
/// - **For:** the lowest commit-to-publish latency across processes. A relay in any
///   process is woken the moment an enqueueing transaction commits, instead of at its
///   next poll.
/// - **Against:** PostgreSQL serialises the commits of all transactions that issued
///   `NOTIFY`, cluster-wide. At commit such a transaction takes one exclusive lock
///   (`PreCommit_Notify` in `src/backend/commands/async.c` locks "database 0", the same
///   lock for every database of the server) and holds it until the commit has
///   completed, including the flush of its commit record to the WAL. Every enqueueing
///   business transaction then commits through that one lock, one at a time (and so
///   does any other notifying transaction on the server): a global mutex that caps
///   enqueue throughput and adds queueing to commit latency under concurrency.
///
/// Without `NOTIFY`, wake the relay in-process after your commit with
/// [`Relay::wakeup`](outbox_core::Relay::wakeup) (or dispatch the ids at once with
/// [`Relay::dispatch_ids`](outbox_core::Relay::dispatch_ids)), and rely on polling
/// ([`RelayConfig::poll_interval`](outbox_core::RelayConfig::poll_interval)) for
/// messages committed by other processes.
///
/// PostgreSQL delivers a notification only when the transaction commits, and folds
/// identical ones, so listeners get at most one per enqueueing transaction and none for
/// a rollback.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Notify {
    /// Send nothing (the default).
    #[default]
    Off,
    /// Notify the channel named after the schema and table (`<schema>_<table>`,
    /// shortened with a hash when too long); see
    /// [`PgOutboxConfig::notify_channel`].
    OnCommit,
    /// Notify this channel (a name following the identifier rules).
    Channel(String),
}

/// The default of [`PgOutboxConfig::with_relay_connections`]: enough for one relay at the
/// default pipeline depth to have a claim and a settle of each batch on the wire at once
/// (more calls queue for a connection).
pub const DEFAULT_RELAY_CONNECTIONS: u32 = 4;

pub use outbox_core::backend::held::{DEFAULT_HELD_CONNECTIONS, DEFAULT_SWEEP_INTERVAL};

/// Where a [`PgOutbox`](crate::PgOutbox) keeps its messages and how it behaves.
///
/// ```
/// use std::time::Duration;
/// use outbox_core::{KeyOrder, Retention};
/// use outbox_postgres::{Notify, PgOutboxConfig};
///
/// let config = PgOutboxConfig::default()
///     .with_schema("billing")
///     .with_ordering(KeyOrder::PerKey)
///     .with_retention(Retention::Keep { window: Duration::from_secs(86_400) });
/// config.validate()?;
/// assert_eq!(config.notify(), &Notify::Off, "no NOTIFY unless asked for");
///
/// // Opt in to NOTIFY (see `Notify` for its cost) on the derived channel.
/// let notifying = config.with_notify(Notify::OnCommit);
/// assert_eq!(notifying.notify_channel().as_deref(), Some("billing_outbox_messages"));
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOutboxConfig {
    table: TableConfig<PgRules, OutboxTable>,
    notify: Notify,
    relay_connections: u32,
    claim_mode: ClaimMode,
    held_connections: u32,
    sweep_interval: Duration,
}

impl Default for PgOutboxConfig {
    fn default() -> Self {
        PgOutboxConfig {
            table: TableConfig::default(),
            notify: Notify::Off,
            relay_connections: DEFAULT_RELAY_CONNECTIONS,
            claim_mode: ClaimMode::Lease,
            held_connections: DEFAULT_HELD_CONNECTIONS,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
        }
    }
}

impl PgOutboxConfig {
    /// Set the schema (default `outbox`).
    #[must_use]
    pub fn with_schema(self, schema: impl Into<String>) -> Self {
        self.map_table(|t| t.with_schema(schema))
    }
    /// Set the table (default `outbox_messages`).
    #[must_use]
    pub fn with_table(self, table: impl Into<String>) -> Self {
        self.map_table(|t| t.with_table(table))
    }
    /// Set the claim ordering (default [`KeyOrder::Unordered`]).
    #[must_use]
    pub fn with_ordering(self, ordering: KeyOrder) -> Self {
        self.map_table(|t| t.with_ordering(ordering))
    }
    /// Set what completing does (default [`Retention::Delete`]).
    #[must_use]
    pub fn with_retention(self, retention: Retention) -> Self {
        self.map_table(|t| t.with_retention(retention))
    }
    /// Set the limits every enqueued message, and every claimed row, is checked
    /// against (default [`MessageLimits::default`]).
    #[must_use]
    pub fn with_limits(self, limits: MessageLimits) -> Self {
        self.map_table(|t| t.with_limits(limits))
    }
    /// Set whether enqueueing notifies (default [`Notify::Off`]; read [`Notify`] for
    /// the cost before turning it on).
    #[must_use]
    pub fn with_notify(mut self, notify: Notify) -> Self {
        self.notify = notify;
        self
    }
    /// Set how many connections the outbox may open for the statements relays send
    /// (claims, settles, renewals), at least 1 (default
    /// [`DEFAULT_RELAY_CONNECTIONS`]). They form a pool of their own beside the one
    /// the outbox is made with, with planner settings that keep those statements on
    /// their indexes whatever the statistics say; see
    /// [`PgOutbox::relay_pool`](crate::PgOutbox::relay_pool). A relay needs one
    /// connection per store call in flight: its claim plus the settles of its publish
    /// calls (`publish_concurrency`) per batch in flight (`pipeline_depth`).
    #[must_use]
    pub fn with_relay_connections(mut self, connections: u32) -> Self {
        self.relay_connections = connections.max(1);
        self
    }

    /// Set how claims hold messages (default [`ClaimMode::Lease`]).
    ///
    /// With [`ClaimMode::HeldLock`] a claim locks its rows in a transaction on a
    /// connection of the held pool (see [`with_held_connections`](Self::with_held_connections))
    /// and writes nothing to them; the settle runs in that transaction and commits it.
    /// The crate README's "Claim modes" compares the two; the modes can share one table
    /// (each skips what the other holds), so relays can move from one to the other one
    /// at a time.
    #[must_use]
    pub fn with_claim_mode(mut self, mode: ClaimMode) -> Self {
        self.claim_mode = mode;
        self
    }

    /// Set the most connections held-lock claims keep open at once (default
    /// [`DEFAULT_HELD_CONNECTIONS`], at least 1): one per batch held, so at least
    /// `pipeline_depth` of every relay on this store, plus one per concurrent
    /// [`dispatch_ids`](outbox_core::Relay::dispatch_ids) call. A claim waits for a free
    /// one up to the pool's acquire timeout. Unused in lease mode.
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

    fn map_table(
        mut self,
        f: impl FnOnce(TableConfig<PgRules, OutboxTable>) -> TableConfig<PgRules, OutboxTable>,
    ) -> Self {
        self.table = f(self.table);
        self
    }

    /// The table's settings, as every backend keeps them.
    pub(crate) fn table_config(&self) -> &TableConfig<PgRules, OutboxTable> {
        &self.table
    }
    /// The schema.
    pub fn schema(&self) -> &str {
        self.table.schema()
    }
    /// The table.
    pub fn table(&self) -> &str {
        self.table.table()
    }
    /// The claim ordering.
    pub fn ordering(&self) -> KeyOrder {
        self.table.ordering()
    }
    /// What completing does.
    pub fn retention(&self) -> Retention {
        self.table.retention()
    }
    /// The message limits.
    pub fn limits(&self) -> &MessageLimits {
        self.table.limits()
    }
    /// The notification setting, as configured.
    pub fn notify(&self) -> &Notify {
        &self.notify
    }
    /// The most connections the relay statements use (see
    /// [`with_relay_connections`](Self::with_relay_connections)).
    pub fn relay_connections(&self) -> u32 {
        self.relay_connections
    }
    /// How claims hold messages.
    pub fn claim_mode(&self) -> ClaimMode {
        self.claim_mode
    }
    /// The most connections held-lock claims keep open.
    pub fn held_connections(&self) -> u32 {
        self.held_connections
    }
    /// How often held-lock claims sweep ended batches.
    pub fn sweep_interval(&self) -> Duration {
        self.sweep_interval
    }
    /// The channel enqueues notify, if any: the one named by [`Notify::Channel`], or
    /// the one derived from the schema and table for [`Notify::OnCommit`] (worked out
    /// when asked, so it follows later [`with_schema`](Self::with_schema) and
    /// [`with_table`](Self::with_table) calls).
    pub fn notify_channel(&self) -> Option<String> {
        match &self.notify {
            Notify::Off => None,
            Notify::OnCommit => Some(derived_identifier(self.schema(), self.table())),
            Notify::Channel(channel) => Some(channel.clone()),
        }
    }

    /// The validated `schema.table`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a bad schema or table
    /// name.
    pub fn qualified_name(&self) -> Result<QualifiedName> {
        self.table.qualified_name()
    }

    /// Check every setting.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        self.qualified_name()?;
        if let Notify::Channel(channel) = &self.notify {
            ident::validate("notify channel", channel)?;
        }
        self.table.validate()
    }
}

/// Where a [`PgDedupStore`](crate::PgDedupStore) keeps processed message ids, and for
/// how long (default `"outbox"."outbox_inbox"`, seven days).
///
/// ```
/// use std::time::Duration;
/// use outbox_postgres::PgDedupConfig;
///
/// let config = PgDedupConfig::default()
///     .with_table("orders_inbox")
///     .with_retention(Duration::from_secs(3600));
/// config.validate()?;
/// assert_eq!(config.table(), "orders_inbox");
/// # Ok::<(), outbox_core::Error>(())
/// ```
pub type PgDedupConfig = TableConfig<PgRules, DedupTable>;

/// Where a [`PgEntityStore`](crate::PgEntityStore) keeps the entities of a decoupled
/// consumer (default `"outbox"."outbox_entities"`).
///
/// ```
/// use outbox_postgres::PgEntityConfig;
///
/// let config = PgEntityConfig::default().with_table("accounts");
/// assert_eq!(config.qualified_name()?.to_string(), "\"outbox\".\"accounts\"");
/// # Ok::<(), outbox_core::Error>(())
/// ```
pub type PgEntityConfig = TableConfig<PgRules, EntityTable>;

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;
    use std::time::Duration;

    #[test]
    fn outbox_defaults_and_validation() {
        let c = PgOutboxConfig::default();
        c.validate().unwrap();
        assert_eq!(
            c.qualified_name().unwrap().to_string(),
            "\"outbox\".\"outbox_messages\""
        );
        assert_eq!(c.notify(), &Notify::Off, "NOTIFY is opt-in");
        assert_eq!(c.notify_channel(), None);
        let on = c.clone().with_notify(Notify::OnCommit);
        assert_eq!(
            on.notify_channel().as_deref(),
            Some("outbox_outbox_messages")
        );
        assert_eq!(
            on.clone()
                .with_schema("s")
                .with_table("t")
                .notify_channel()
                .as_deref(),
            Some("s_t"),
            "the derived channel follows later renames"
        );
        let named = c.clone().with_notify(Notify::Channel("wake".into()));
        assert_eq!(named.notify_channel().as_deref(), Some("wake"));
        assert_eq!(Notify::default(), Notify::Off);

        let bad = [
            c.clone().with_schema("Bad"),
            c.clone().with_table("x;drop table y"),
            c.clone().with_notify(Notify::Channel("no space".into())),
            c.clone().with_retention(Retention::Keep {
                window: Duration::ZERO,
            }),
        ];
        for config in bad {
            assert_eq!(
                config.validate().unwrap_err().kind(),
                ErrorKind::Config,
                "{config:?}"
            );
        }
    }

    #[test]
    fn getters_return_what_was_set() {
        let keep = Retention::Keep {
            window: Duration::from_secs(5),
        };
        let limits = MessageLimits::default().with_max_payload_bytes(7);
        let c = PgOutboxConfig::default()
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
    fn dedup_and_entity_tables_default_to_the_outbox_schema() {
        let names = [
            PgDedupConfig::default().qualified_name().unwrap(),
            PgEntityConfig::default().qualified_name().unwrap(),
        ];
        assert_eq!(
            names.map(|n| n.to_string()),
            [
                "\"outbox\".\"outbox_inbox\"",
                "\"outbox\".\"outbox_entities\""
            ]
        );
        assert!(PgDedupConfig::default().with_table("T").validate().is_err());
    }
}
