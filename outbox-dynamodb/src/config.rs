//! Settings of the DynamoDB stores, validated before any request is sent.

use std::time::Duration;

use outbox_core::backend::{DedupTable, EntityTable, TableConfig, TableRules};
use outbox_core::{store::StoreCapabilities, Error, KeyOrder, MessageLimits, Result, Retention};

/// Most shard partitions a table may be spread over. Every claim queries every shard,
/// so more shards cost more requests per claim; see the crate docs on picking a count.
pub const MAX_SHARDS: u16 = 256;

/// Default payload limit of the outbox: DynamoDB items are at most 400 KB, and the rest
/// of the message (headers, destination, key) needs room too.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 256 * 1024;

/// Check a DynamoDB table name: 3 to 255 characters of `a-z`, `A-Z`, `0-9`, `_`, `-`
/// and `.` (the service's own rule).
///
/// # Errors
/// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) naming `what` when `name`
/// breaks it.
pub fn validate_table_name(what: &str, name: &str) -> Result<()> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok_chars && (3..=255).contains(&name.len()) {
        Ok(())
    } else {
        Err(Error::config(format!(
            "{what} table name {name:?} must be 3 to 255 characters of a-z, A-Z, 0-9, _, - and ."
        )))
    }
}

fn check_shards(what: &str, shards: u16) -> Result<()> {
    if shards == 0 || shards > MAX_SHARDS {
        return Err(Error::config(format!(
            "{what} shard count {shards} is outside 1..={MAX_SHARDS}"
        )));
    }
    Ok(())
}

/// Settings of a [`DynamoOutbox`](crate::DynamoOutbox).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamoOutboxConfig {
    table: String,
    shards: u16,
    /// Whether [`with_shards`](Self::with_shards) set `shards`.
    shards_set: bool,
    ordering: KeyOrder,
    retention: Retention,
    limits: MessageLimits,
    body_ttl: Duration,
    body_sweep_every: Option<Duration>,
    renewal_budget: Option<u32>,
    shard_lease: Option<Duration>,
}

/// Default [`DynamoOutboxConfig::with_shards`]: 32 shards, about 4,000 messages per
/// second without retries (see the crate docs, "Picking the shard count").
pub const DEFAULT_SHARDS: u16 = 32;

/// Default [`DynamoOutboxConfig::with_shard_leases`]: 10-second shard leases.
pub const DEFAULT_SHARD_LEASE: Duration = Duration::from_secs(10);

/// Default [`DynamoOutboxConfig::with_renewal_budget`]: 1,000 write units per second
/// per store for the body sweep's renewals (about 300 renewals per second of 1 KB
/// bodies, 10 of 100 KB ones).
pub const DEFAULT_RENEWAL_BUDGET: u32 = 1_000;

/// Default [`DynamoOutboxConfig::with_body_ttl`]: 14 days.
pub const DEFAULT_BODY_TTL: Duration = Duration::from_secs(14 * 24 * 3600);

impl Default for DynamoOutboxConfig {
    /// Table `outbox`, [`DEFAULT_SHARDS`] shards for a new table, unordered, delete on complete, payloads up to
    /// [`DEFAULT_MAX_PAYLOAD_BYTES`], bodies kept [`DEFAULT_BODY_TTL`].
    fn default() -> Self {
        DynamoOutboxConfig {
            table: "outbox".into(),
            shards: DEFAULT_SHARDS,
            shards_set: false,
            ordering: KeyOrder::Unordered,
            retention: Retention::Delete,
            limits: MessageLimits::default().with_max_payload_bytes(DEFAULT_MAX_PAYLOAD_BYTES),
            body_ttl: DEFAULT_BODY_TTL,
            body_sweep_every: None,
            renewal_budget: Some(DEFAULT_RENEWAL_BUDGET),
            shard_lease: Some(DEFAULT_SHARD_LEASE),
        }
    }
}

impl DynamoOutboxConfig {
    /// Use table `name` (checked by [`validate`](Self::validate)).
    #[must_use]
    pub fn with_table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }
    /// The shard count (1 to [`MAX_SHARDS`]) a new table gets: the first store to check
    /// a table writes its count into the table, and from then on every store writes and
    /// claims over the table's count, whatever its own (grow it with
    /// [`DynamoOutbox::grow_shards`](crate::DynamoOutbox::grow_shards)). A count set
    /// here above the table's is refused when the store first checks the table: the
    /// table was meant to have more shards than it has.
    #[must_use]
    pub fn with_shards(mut self, shards: u16) -> Self {
        self.shards = shards;
        self.shards_set = true;
        self
    }
    /// Whether claims keep per-key order.
    #[must_use]
    pub fn with_ordering(mut self, ordering: KeyOrder) -> Self {
        self.ordering = ordering;
        self
    }
    /// What completing does.
    #[must_use]
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }
    /// The message rules enqueue checks and claims apply to stored items.
    #[must_use]
    pub fn with_limits(mut self, limits: MessageLimits) -> Self {
        self.limits = limits;
        self
    }
    /// How long after its availability a message's body items may be deleted by
    /// DynamoDB's time to live (at least one hour). Completing a message deletes only its
    /// small state item (one write unit whatever the payload); the body, written once at
    /// enqueue, is left to TTL, which deletes for free. While the message is
    /// undelivered its body is kept alive: claims, retries and releases that leave less
    /// than half of it past the new availability renew it, and relays sweep the shards
    /// they own for messages waiting longer than a sixteenth of it
    /// ([`with_body_sweep_every`](Self::with_body_sweep_every)); dead-lettering removes
    /// it. Only when no relay claims for longer than 7/16 of it minus the sweep interval
    /// can a waiting message lose its body (it is then dead-lettered naming the
    /// missing body): choose it so that 7/16 of it minus the sweep interval exceeds
    /// your longest relay outage (at the default interval, `body_ttl` above 16/5 of the
    /// outage). See the crate docs, "Bodies of undelivered messages are renewed".
    #[must_use]
    pub fn with_body_ttl(mut self, ttl: Duration) -> Self {
        self.body_ttl = ttl;
        self
    }
    /// How often each store sweeps the shards it claims from for undelivered messages
    /// whose bodies need their time to live renewed (at most once per interval per
    /// shard, in a background task its claims start; see the crate docs). Default: an eighth of
    /// [`body_ttl`](Self::with_body_ttl). At least one minute and at most a quarter of
    /// `body_ttl`; the longer it is, the shorter the relay outage bodies survive.
    #[must_use]
    pub fn with_body_sweep_every(mut self, every: Duration) -> Self {
        self.body_sweep_every = Some(every);
        self
    }
    /// The write units per second each store's body sweep may spend renewing bodies
    /// ([`DEFAULT_RENEWAL_BUDGET`] by default; `None`: no limit). The sweep waits for
    /// the budget between renewals (see the crate docs, "Bodies of undelivered messages
    /// are renewed"), so a sweep that finds a large backlog of long-waiting bodies does
    /// not take the table's write capacity from your enqueues. Renewals by claims,
    /// retries and releases are not paced: each guards a message the sweep cannot see
    /// yet, and they are rare while sweeps run. Size it above what the backlog you
    /// keep needs: each waiting message is renewed about once per half `body_ttl`, at
    /// its body's write units plus one, and
    /// [`sweep_budget_waits`](crate::OutboxMetrics::sweep_budget_waits) counts the
    /// renewals that waited for it.
    #[must_use]
    pub fn with_renewal_budget(mut self, units_per_second: Option<u32>) -> Self {
        self.renewal_budget = units_per_second;
        self
    }
    /// See [`with_renewal_budget`](Self::with_renewal_budget).
    pub fn renewal_budget(&self) -> Option<u32> {
        self.renewal_budget
    }
    /// The body sweep interval in effect.
    pub fn body_sweep_every(&self) -> Duration {
        self.body_sweep_every.unwrap_or(self.body_ttl / 8)
    }
    /// Whether and how relays divide the shards: with `Some(lease)` (the default,
    /// [`DEFAULT_SHARD_LEASE`]) each store (each [`DynamoOutbox::new`](crate::DynamoOutbox::new),
    /// not each clone) is a worker that holds leases on its share of the shards, renews
    /// them every third of `lease` and claims only from them; a dead worker's shards
    /// are taken over once its leases lapse (see the crate docs). `None`: every claim
    /// reads every shard and racing relays are sorted out by refused writes. At least
    /// one second.
    #[must_use]
    pub fn with_shard_leases(mut self, lease: Option<Duration>) -> Self {
        self.shard_lease = lease;
        self
    }
    /// The shard lease, if relays divide the shards.
    pub fn shard_lease(&self) -> Option<Duration> {
        self.shard_lease
    }
    /// The body time to live.
    pub fn body_ttl(&self) -> Duration {
        self.body_ttl
    }
    /// The table name: the name [`Schema::name`](outbox_core::schema::Schema::name)
    /// gives a [`DynamoOutbox`](crate::DynamoOutbox) with these settings (which has no
    /// name accessor of its own: `outbox.config().table()`).
    pub fn table(&self) -> &str {
        &self.table
    }
    /// The shard count a new table gets ([`with_shards`](Self::with_shards)).
    pub fn shards(&self) -> u16 {
        self.shards
    }
    /// Whether [`with_shards`](Self::with_shards) set the count (a default count never
    /// refuses a table with fewer shards).
    pub(crate) fn shards_set(&self) -> bool {
        self.shards_set
    }
    /// The message rules.
    pub fn limits(&self) -> &MessageLimits {
        &self.limits
    }
    /// What the store built from this config does.
    pub fn capabilities(&self) -> StoreCapabilities {
        StoreCapabilities::new(self.ordering, self.retention).with_lease_renewal(true)
    }

    /// Check every setting.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a bad table name, a
    /// shard count out of range, a `Keep` window of zero, a body TTL under an hour, a
    /// body sweep interval under a minute or over a quarter of the body TTL, a renewal
    /// budget of 0, or a shard lease under a second.
    pub fn validate(&self) -> Result<()> {
        validate_table_name("outbox", &self.table)?;
        check_shards("outbox", self.shards)?;
        if self.shard_lease.is_some_and(|l| l < Duration::from_secs(1)) {
            return Err(Error::config(format!(
                "shard lease {:?} is under one second",
                self.shard_lease
            )));
        }
        if self.body_ttl < Duration::from_secs(3600) {
            return Err(Error::config(format!(
                "body TTL {:?} is under one hour",
                self.body_ttl
            )));
        }
        let sweep = self.body_sweep_every();
        if sweep < Duration::from_secs(60) || sweep > self.body_ttl / 4 {
            return Err(Error::config(format!(
                "body sweep interval {sweep:?} must be at least one minute and at most a \
                 quarter of the body TTL {:?}",
                self.body_ttl
            )));
        }
        if let Retention::Keep { window } = self.retention {
            if window.is_zero() {
                return Err(Error::config("a Keep retention window must be above zero"));
            }
        }
        if self.renewal_budget == Some(0) {
            return Err(Error::config(
                "a renewal budget of 0 write units per second would stop every body \
                 renewal of the sweep; give it a rate, or None for no limit",
            ));
        }
        Ok(())
    }
}

/// DynamoDB's rules for the tables of this crate's stores: table names by the
/// service's own rule ([`validate_table_name`]), no schema, default tables `outbox`,
/// `outbox_dedup` and `outbox_entities`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DynamoRules;

impl TableRules for DynamoRules {
    type Name = String;
    const OUTBOX_TABLE: &'static str = "outbox";
    const DEDUP_TABLE: &'static str = "outbox_dedup";
    fn name(store: &str, _schema: &str, table: &str) -> Result<String> {
        validate_table_name(store, table)?;
        Ok(table.to_owned())
    }
}

/// Settings of a [`DynamoDistributedLock`](crate::DynamoDistributedLock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamoLockConfig {
    table: String,
    lease: Duration,
    renew_every: Duration,
}

impl Default for DynamoLockConfig {
    /// Table `outbox_locks`, 30-second leases renewed every 10 seconds.
    fn default() -> Self {
        DynamoLockConfig {
            table: "outbox_locks".into(),
            lease: Duration::from_secs(30),
            renew_every: Duration::from_secs(10),
        }
    }
}

impl DynamoLockConfig {
    /// Use table `name`.
    #[must_use]
    pub fn with_table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }
    /// How long an acquisition or a renewal holds the lock without another renewal: the
    /// longest a crashed holder keeps others out. At least one second, and longer than
    /// the worst clock skew between processes.
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
    /// How often a held guard renews its lease (above zero, at most half the lease, so
    /// that one slow or failed renewal does not lose the lock).
    #[must_use]
    pub fn with_renew_every(mut self, every: Duration) -> Self {
        self.renew_every = every;
        self
    }
    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }
    /// The lease duration.
    pub fn lease(&self) -> Duration {
        self.lease
    }
    /// The renewal period.
    pub fn renew_every(&self) -> Duration {
        self.renew_every
    }
    /// Check every setting.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a bad table name, a
    /// lease under one second, or a renewal period that is zero or over half the lease.
    pub fn validate(&self) -> Result<()> {
        validate_table_name("lock", &self.table)?;
        if self.lease < Duration::from_secs(1) {
            return Err(Error::config(format!(
                "lock lease {:?} is under one second",
                self.lease
            )));
        }
        if self.renew_every.is_zero() || self.renew_every > self.lease / 2 {
            return Err(Error::config(format!(
                "lock renewal period {:?} must be above zero and at most half the lease {:?}",
                self.renew_every, self.lease
            )));
        }
        Ok(())
    }
}

/// Settings of a [`DynamoDedupStore`](crate::DynamoDedupStore): table `outbox_dedup`
/// and seven days of retention by default.
pub type DynamoDedupConfig = TableConfig<DynamoRules, DedupTable>;

/// Settings of a [`DynamoEntityStore`](crate::DynamoEntityStore): table
/// `outbox_entities` by default.
pub type DynamoEntityConfig = TableConfig<DynamoRules, EntityTable>;

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn table_names_follow_the_service_rule() {
        for ok in ["abc", "Orders_v1.outbox-2", &"t".repeat(255)] {
            validate_table_name("outbox", ok).unwrap();
        }
        for bad in [
            "",
            "ab",
            "has space",
            "semi;colon",
            "ü-table",
            &"t".repeat(256),
        ] {
            let err = validate_table_name("outbox", bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{bad}");
        }
    }

    #[test]
    fn configs_validate() {
        DynamoOutboxConfig::default().validate().unwrap();
        for budget in [None, Some(1)] {
            let config = DynamoOutboxConfig::default().with_renewal_budget(budget);
            config.validate().unwrap();
            assert_eq!(config.renewal_budget(), budget);
        }
        let hour = DynamoOutboxConfig::default().with_body_ttl(Duration::from_secs(3600));
        assert_eq!(hour.body_sweep_every(), Duration::from_secs(450));
        hour.clone()
            .with_body_sweep_every(Duration::from_secs(900))
            .validate()
            .unwrap();
        hour.with_body_sweep_every(Duration::from_secs(60))
            .validate()
            .unwrap();
        DynamoDedupConfig::default().validate().unwrap();
        DynamoEntityConfig::default().validate().unwrap();
        DynamoLockConfig::default().validate().unwrap();
        for bad in [
            DynamoLockConfig::default().with_table("x"),
            DynamoLockConfig::default().with_lease(Duration::from_millis(999)),
            DynamoLockConfig::default().with_renew_every(Duration::ZERO),
            DynamoLockConfig::default().with_renew_every(Duration::from_secs(16)),
        ] {
            assert_eq!(
                bad.validate().unwrap_err().kind(),
                ErrorKind::Config,
                "{bad:?}"
            );
        }
        for bad in [
            DynamoOutboxConfig::default().with_shards(0),
            DynamoOutboxConfig::default().with_shards(MAX_SHARDS + 1),
            DynamoOutboxConfig::default().with_table("x"),
            DynamoOutboxConfig::default().with_body_ttl(Duration::from_secs(60)),
            DynamoOutboxConfig::default().with_body_sweep_every(Duration::from_secs(59)),
            DynamoOutboxConfig::default()
                .with_body_ttl(Duration::from_secs(3600))
                .with_body_sweep_every(Duration::from_secs(901)),
            DynamoOutboxConfig::default().with_shard_leases(Some(Duration::from_millis(10))),
            DynamoOutboxConfig::default().with_renewal_budget(Some(0)),
            DynamoOutboxConfig::default().with_retention(Retention::Keep {
                window: Duration::ZERO,
            }),
        ] {
            assert_eq!(bad.validate().unwrap_err().kind(), ErrorKind::Config);
        }
        assert!(DynamoDedupConfig::default()
            .with_retention(Duration::ZERO)
            .validate()
            .is_err());
        assert!(DynamoEntityConfig::default()
            .with_table("a b")
            .validate()
            .is_err());
        let caps = DynamoOutboxConfig::default()
            .with_ordering(KeyOrder::PerKey)
            .capabilities();
        assert_eq!(caps.ordering, KeyOrder::PerKey);
        assert_eq!(
            DynamoOutboxConfig::default().limits().max_payload_bytes,
            DEFAULT_MAX_PAYLOAD_BYTES
        );
    }
}
