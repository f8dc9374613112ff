//! Settings for [`PgOutbox`](crate::PgOutbox) and [`PgDedupStore`](crate::PgDedupStore),
//! and the identifier rules they are checked against.
//!
//! Schema, table and channel names are validated as plain lower-case identifiers and
//! always double-quoted in SQL, so a name can never change a statement's meaning. Values
//! (ids, payloads, durations) are always bound parameters.

use std::time::Duration;

use outbox_core::{Error, KeyOrder, MessageLimits, Result, Retention};

/// The longest identifier PostgreSQL keeps (`NAMEDATALEN - 1`).
pub const MAX_IDENTIFIER_LEN: usize = 63;

/// Check that `name` matches `^[a-z_][a-z0-9_]{0,62}$`.
///
/// `what` names the setting in the error (for example `"table"`).
///
/// # Errors
/// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when it does not.
pub fn validate_identifier(what: &str, name: &str) -> Result<()> {
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
    let rest_ok = bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if first_ok && rest_ok && name.len() <= MAX_IDENTIFIER_LEN {
        Ok(())
    } else {
        Err(Error::config(format!(
            "{what} name {name:?} must match ^[a-z_][a-z0-9_]{{0,62}}$"
        )))
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

/// Whether enqueueing sends a `NOTIFY` for [`spawn_listener`](crate::spawn_listener).
///
/// The default is [`Off`](Self::Off). Turning it on is a trade-off, described on
/// [`PgOutboxConfig::notify_on_commit`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NotifyMode {
    /// Send nothing (the default). Relays find messages by polling and by explicit
    /// wake-ups such as [`Relay::wakeup`](outbox_core::Relay::wakeup) after a commit.
    #[default]
    Off,
    /// Notify this channel (a name following the identifier rules) from every
    /// enqueueing transaction.
    Channel(String),
}

/// The notification setting as configured: the derived channel is worked out only when
/// asked for, so it follows later [`schema`](PgOutboxConfig::schema) and
/// [`table`](PgOutboxConfig::table) calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Notify {
    #[default]
    Off,
    Derived,
    Channel(String),
}

/// Where a [`PgOutbox`](crate::PgOutbox) keeps its messages and how it behaves.
///
/// ```
/// use std::time::Duration;
/// use outbox_core::{KeyOrder, Retention};
/// use outbox_postgres::{NotifyMode, PgOutboxConfig};
///
/// let config = PgOutboxConfig::default()
///     .schema("billing")
///     .ordering(KeyOrder::PerKey)
///     .retention(Retention::Keep { window: Duration::from_secs(86_400) });
/// config.validate()?;
/// assert_eq!(config.notify_mode(), NotifyMode::Off, "no NOTIFY unless asked for");
///
/// // Opt in to NOTIFY on the channel derived from the schema and table.
/// let notifying = config.notify_on_commit();
/// assert_eq!(
///     notifying.notify_mode(),
///     NotifyMode::Channel("billing_outbox_messages".into())
/// );
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOutboxConfig {
    schema: String,
    table: String,
    ordering: KeyOrder,
    retention: Retention,
    limits: MessageLimits,
    notify: Notify,
}

impl Default for PgOutboxConfig {
    fn default() -> Self {
        PgOutboxConfig {
            schema: "outbox".to_owned(),
            table: "outbox_messages".to_owned(),
            ordering: KeyOrder::default(),
            retention: Retention::default(),
            limits: MessageLimits::default(),
            notify: Notify::Off,
        }
    }
}

impl PgOutboxConfig {
    /// Set the schema (default `outbox`).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }
    /// Set the table (default `outbox_messages`).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }
    /// Set the claim ordering (default [`KeyOrder::Unordered`]).
    pub fn ordering(mut self, ordering: KeyOrder) -> Self {
        self.ordering = ordering;
        self
    }
    /// Set what completing does (default [`Retention::Delete`]).
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }
    /// Set the limits every enqueued message is checked against.
    pub fn limits(mut self, limits: MessageLimits) -> Self {
        self.limits = limits;
        self
    }
    /// Set the notification mode (default [`NotifyMode::Off`]); see
    /// [`notify_on_commit`](Self::notify_on_commit) for the trade-off.
    pub fn notify(mut self, notify: NotifyMode) -> Self {
        self.notify = match notify {
            NotifyMode::Off => Notify::Off,
            NotifyMode::Channel(channel) => Notify::Channel(channel),
        };
        self
    }
    /// Send a `NOTIFY` from every enqueueing transaction on the channel named after the
    /// schema and table (`<schema>_<table>`, shortened with a hash when too long), for
    /// [`spawn_listener`](crate::spawn_listener). Off by default.
    ///
    /// # The trade-off
    ///
    /// - **For:** the lowest commit-to-publish latency across processes. A relay in any
    ///   process is woken the moment an enqueueing transaction commits, instead of at
    ///   its next poll.
    /// - **Against:** PostgreSQL serialises the commits of all transactions that issued
    ///   `NOTIFY`, cluster-wide. At commit such a transaction takes one exclusive lock
    ///   (`PreCommit_Notify` in `src/backend/commands/async.c` locks "database 0", the
    ///   same lock for every database of the server) and holds it until the commit has
    ///   completed, including the flush of its commit record to the WAL. Every
    ///   enqueueing business transaction then commits through that one lock, one at a
    ///   time (and so does any other notifying transaction on the server): a global
    ///   mutex that caps enqueue throughput and adds queueing to commit latency under
    ///   concurrency.
    ///
    /// Without `NOTIFY`, wake the relay in-process after your commit with
    /// [`Relay::wakeup`](outbox_core::Relay::wakeup) (or dispatch the ids at once with
    /// [`Relay::dispatch_ids`](outbox_core::Relay::dispatch_ids)), and rely on polling
    /// ([`RelayConfig::poll`](outbox_core::RelayConfig::poll)) for messages committed
    /// by other processes.
    pub fn notify_on_commit(mut self) -> Self {
        self.notify = Notify::Derived;
        self
    }

    /// The schema name.
    pub fn schema_name(&self) -> &str {
        &self.schema
    }
    /// The table name.
    pub fn table_name(&self) -> &str {
        &self.table
    }
    /// The claim ordering.
    pub fn ordering_mode(&self) -> KeyOrder {
        self.ordering
    }
    /// What completing does.
    pub fn retention_mode(&self) -> Retention {
        self.retention
    }
    /// The message limits.
    pub fn message_limits(&self) -> &MessageLimits {
        &self.limits
    }
    /// The notification mode, with a derived channel worked out.
    pub fn notify_mode(&self) -> NotifyMode {
        match &self.notify {
            Notify::Off => NotifyMode::Off,
            Notify::Derived => NotifyMode::Channel(derived_identifier(&self.schema, &self.table)),
            Notify::Channel(channel) => NotifyMode::Channel(channel.clone()),
        }
    }
    /// The channel enqueues notify, if any.
    pub fn notify_channel(&self) -> Option<String> {
        match self.notify_mode() {
            NotifyMode::Off => None,
            NotifyMode::Channel(channel) => Some(channel),
        }
    }

    /// `"schema"."table"`, for SQL.
    pub(crate) fn qualified_table(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }

    /// Check every setting.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        validate_identifier("schema", &self.schema)?;
        validate_identifier("table", &self.table)?;
        if let Notify::Channel(channel) = &self.notify {
            validate_identifier("notify channel", channel)?;
        }
        if let Retention::Keep { window } = self.retention {
            if window.is_zero() {
                return Err(Error::config("retention window must be above zero"));
            }
        }
        Ok(())
    }
}

/// Where a [`PgDedupStore`](crate::PgDedupStore) keeps processed message ids, and for
/// how long.
///
/// ```
/// use std::time::Duration;
/// use outbox_postgres::PgDedupConfig;
///
/// let config = PgDedupConfig::default().table("orders_inbox").retention(Duration::from_secs(3600));
/// config.validate()?;
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgDedupConfig {
    schema: String,
    table: String,
    retention: Duration,
}

impl Default for PgDedupConfig {
    fn default() -> Self {
        PgDedupConfig {
            schema: "outbox".to_owned(),
            table: "outbox_inbox".to_owned(),
            retention: Duration::from_secs(7 * 24 * 60 * 60),
        }
    }
}

impl PgDedupConfig {
    /// Set the schema (default `outbox`).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }
    /// Set the table (default `outbox_inbox`).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }
    /// Set how long ids are remembered (default 7 days).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }
    /// The schema name.
    pub fn schema_name(&self) -> &str {
        &self.schema
    }
    /// The table name.
    pub fn table_name(&self) -> &str {
        &self.table
    }
    /// How long ids are remembered.
    pub fn retention_period(&self) -> Duration {
        self.retention
    }

    /// `"schema"."table"`, for SQL.
    pub(crate) fn qualified_table(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }

    /// Check every setting.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        validate_identifier("schema", &self.schema)?;
        validate_identifier("table", &self.table)?;
        if self.retention.is_zero() {
            return Err(Error::config("dedup retention must be above zero"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn identifiers() {
        for ok in ["a", "_", "outbox", "obx_t_0123", &"a".repeat(63)] {
            assert!(validate_identifier("table", ok).is_ok(), "{ok}");
        }
        let bad = [
            "",
            "1abc",
            "Outbox",
            "has space",
            "semi;colon",
            "quote\"d",
            "dash-ed",
            "dot.ted",
            "é",
            &"a".repeat(64),
        ];
        for name in bad {
            let err = validate_identifier("table", name).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{name:?}");
        }
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
        validate_identifier("index", &a).unwrap();
        assert_eq!(a, derived_identifier(&long_a, "due"), "stable");
    }

    #[test]
    fn outbox_defaults_and_validation() {
        let c = PgOutboxConfig::default();
        c.validate().unwrap();
        assert_eq!(c.qualified_table(), "\"outbox\".\"outbox_messages\"");
        assert_eq!(c.notify_mode(), NotifyMode::Off, "NOTIFY is opt-in");
        assert_eq!(c.notify_channel(), None);
        let on = c.clone().notify_on_commit();
        assert_eq!(
            on.notify_channel().as_deref(),
            Some("outbox_outbox_messages")
        );
        assert_eq!(
            on.clone()
                .schema("s")
                .table("t")
                .notify_channel()
                .as_deref(),
            Some("s_t"),
            "the derived channel follows later renames"
        );
        assert_eq!(on.clone().notify(NotifyMode::Off).notify_channel(), None);
        let named = c.clone().notify(NotifyMode::Channel("wake".into()));
        assert_eq!(named.notify_channel().as_deref(), Some("wake"));
        assert_eq!(
            named.notify_on_commit().notify_channel().as_deref(),
            Some("outbox_outbox_messages")
        );
        assert_eq!(NotifyMode::default(), NotifyMode::Off);

        let bad = [
            c.clone().schema("Bad"),
            c.clone().table("x;drop table y"),
            c.clone().notify(NotifyMode::Channel("no space".into())),
            c.clone().retention(Retention::Keep {
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
    fn dedup_defaults_and_validation() {
        let c = PgDedupConfig::default();
        c.validate().unwrap();
        assert_eq!(c.qualified_table(), "\"outbox\".\"outbox_inbox\"");
        assert!(c.clone().table("").validate().is_err());
        assert!(c.clone().retention(Duration::ZERO).validate().is_err());
    }
}
