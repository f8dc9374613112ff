//! Settings of the outbox ([`StreamOutboxConfig`]) and of its relay
//! ([`StreamRelayConfig`]).

use std::time::Duration;

use outbox_core::{Error, MessageLimits, Result, RetryPolicy};
use outbox_dynamodb::validate_table_name;

/// How long message items live by default: a week, far past the stream's 24 hours.
pub const DEFAULT_ITEM_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// The shortest time to live a message item may have: two days, so an item outlives
/// its stream record (24 hours) and a replay after a trimmed stream can still read it.
pub const MIN_ITEM_TTL: Duration = Duration::from_secs(2 * 24 * 3600);
/// Most records one `GetRecords` returns (DynamoDB Streams' own limit).
pub const MAX_RECORDS_PER_READ: i32 = 1000;

/// Where the messages live and how long.
#[derive(Debug, Clone)]
pub struct StreamOutboxConfig {
    table: String,
    lease_table: Option<String>,
    item_ttl: Duration,
    limits: MessageLimits,
}

impl Default for StreamOutboxConfig {
    fn default() -> Self {
        StreamOutboxConfig {
            table: "outbox_stream".to_owned(),
            lease_table: None,
            item_ttl: DEFAULT_ITEM_TTL,
            limits: MessageLimits::default(),
        }
    }
}

impl StreamOutboxConfig {
    /// The message table (default `outbox_stream`).
    #[must_use]
    pub fn with_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The relays' lease table (default: the message table's name and `_leases`). It
    /// is a table of its own: lease writes in the message table would be stream records
    /// every relay reads.
    #[must_use]
    pub fn with_lease_table(mut self, table: impl Into<String>) -> Self {
        self.lease_table = Some(table.into());
        self
    }

    /// How long message items live (default [`DEFAULT_ITEM_TTL`], at least
    /// [`MIN_ITEM_TTL`]). TTL removals reach the stream as `REMOVE` records, which the
    /// relay skips.
    #[must_use]
    pub fn with_item_ttl(mut self, ttl: Duration) -> Self {
        self.item_ttl = ttl;
        self
    }

    /// The message rules enqueue checks (sizes, header counts).
    #[must_use]
    pub fn with_limits(mut self, limits: MessageLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The message table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The lease table.
    pub fn lease_table(&self) -> String {
        self.lease_table
            .clone()
            .unwrap_or_else(|| format!("{}_leases", self.table))
    }

    /// How long message items live.
    pub fn item_ttl(&self) -> Duration {
        self.item_ttl
    }

    /// The message rules.
    pub fn limits(&self) -> &MessageLimits {
        &self.limits
    }

    /// Check the values.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for an invalid table name,
    /// a lease table named like the message table, or a time to live below
    /// [`MIN_ITEM_TTL`].
    pub fn validate(&self) -> Result<()> {
        validate_table_name("message", &self.table)?;
        let leases = self.lease_table();
        validate_table_name("lease", &leases)?;
        if leases == self.table {
            return Err(Error::config(
                "the lease table must not be the message table: its writes would be stream \
                 records every relay reads",
            ));
        }
        if self.item_ttl < MIN_ITEM_TTL {
            return Err(Error::config(format!(
                "item time to live {:?} is below {MIN_ITEM_TTL:?}: a message item must outlive \
                 its stream record (24 hours) with room for a replay",
                self.item_ttl
            )));
        }
        Ok(())
    }
}

/// How a [`StreamRelay`](crate::StreamRelay) reads, publishes and shares shards.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StreamRelayConfig {
    /// The relay's name: the `relay` label of its metrics (default
    /// `dynamodb-streams`). Workers of one stream share it.
    pub name: String,
    /// Most messages per `Publisher::publish` call (default 100).
    pub batch_size: usize,
    /// Calls in flight at once per shard (default 4). The relay promises no order
    /// across items (see the crate docs), so calls of one read overlap.
    pub publish_concurrency: usize,
    /// Most records per `GetRecords` (default and most [`MAX_RECORDS_PER_READ`]).
    pub records_per_read: i32,
    /// How long a shard reader waits after a read that returned nothing (default
    /// 250 ms). DynamoDB Streams serves at most 5 reads per second per shard, shared
    /// by at most two readers; at 250 ms one reader takes four.
    pub poll_interval: Duration,
    /// A shard lease's length (default 10 s): a killed worker's shards are read again
    /// by others at most this long after its last renewal. Renewed every third.
    pub lease: Duration,
    /// How often the stream's shards are listed to find new ones (default 10 s).
    /// `DescribeStream` allows 10 calls per second per account.
    pub discovery_interval: Duration,
    /// Retries per message before it is dead-lettered (default: the polling relay's).
    pub retry: RetryPolicy,
    /// The longest one `Publisher::publish` call may take (default 10 s); an
    /// unanswered call fails its messages retryably.
    pub publish_timeout: Duration,
    /// How long a checkpoint of records that held no message may wait (default 5 s):
    /// positions after published messages are checkpointed at once.
    pub idle_checkpoint: Duration,
}

impl Default for StreamRelayConfig {
    fn default() -> Self {
        StreamRelayConfig {
            name: "dynamodb-streams".to_owned(),
            batch_size: 100,
            publish_concurrency: 4,
            records_per_read: MAX_RECORDS_PER_READ,
            poll_interval: Duration::from_millis(250),
            lease: Duration::from_secs(10),
            discovery_interval: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            publish_timeout: Duration::from_secs(10),
            idle_checkpoint: Duration::from_secs(5),
        }
    }
}

impl StreamRelayConfig {
    /// Set [`name`](Self::name).
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Set [`batch_size`](Self::batch_size).
    #[must_use]
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Set [`publish_concurrency`](Self::publish_concurrency).
    #[must_use]
    pub fn with_publish_concurrency(mut self, calls: usize) -> Self {
        self.publish_concurrency = calls;
        self
    }

    /// Set [`records_per_read`](Self::records_per_read).
    #[must_use]
    pub fn with_records_per_read(mut self, records: i32) -> Self {
        self.records_per_read = records;
        self
    }

    /// Set [`poll_interval`](Self::poll_interval).
    #[must_use]
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Set [`lease`](Self::lease).
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Set [`discovery_interval`](Self::discovery_interval).
    #[must_use]
    pub fn with_discovery_interval(mut self, interval: Duration) -> Self {
        self.discovery_interval = interval;
        self
    }

    /// Set [`retry`](Self::retry).
    #[must_use]
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Set [`publish_timeout`](Self::publish_timeout).
    #[must_use]
    pub fn with_publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Set [`idle_checkpoint`](Self::idle_checkpoint).
    #[must_use]
    pub fn with_idle_checkpoint(mut self, every: Duration) -> Self {
        self.idle_checkpoint = every;
        self
    }

    /// Check the values.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for an empty name, a batch
    /// size or concurrency of zero or above [`outbox_core::store::MAX_CLAIM_BATCH`] and
    /// 64, records per read outside `1..=`[`MAX_RECORDS_PER_READ`], a zero interval,
    /// lease or timeout, a lease under a second, or an invalid retry policy.
    pub fn validate(&self) -> Result<()> {
        if self.name.trim().is_empty() {
            return Err(Error::config("the relay name must not be empty"));
        }
        if self.batch_size == 0 || self.batch_size > outbox_core::store::MAX_CLAIM_BATCH {
            return Err(Error::config(format!(
                "batch size must be within 1..={}",
                outbox_core::store::MAX_CLAIM_BATCH
            )));
        }
        if !(1..=64).contains(&self.publish_concurrency) {
            return Err(Error::config("publish concurrency must be within 1..=64"));
        }
        if !(1..=MAX_RECORDS_PER_READ).contains(&self.records_per_read) {
            return Err(Error::config(format!(
                "records per read must be within 1..={MAX_RECORDS_PER_READ}"
            )));
        }
        for (what, d) in [
            ("poll interval", self.poll_interval),
            ("discovery interval", self.discovery_interval),
            ("publish timeout", self.publish_timeout),
            ("idle checkpoint", self.idle_checkpoint),
        ] {
            if d.is_zero() {
                return Err(Error::config(format!("{what} must be above zero")));
            }
        }
        if self.lease < Duration::from_secs(1) {
            return Err(Error::config("the shard lease must be at least a second"));
        }
        self.retry.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_are_refused() {
        StreamOutboxConfig::default().validate().unwrap();
        StreamRelayConfig::default().validate().unwrap();
        assert_eq!(
            StreamOutboxConfig::default().with_table("t").lease_table(),
            "t_leases"
        );
        let refused = [
            StreamOutboxConfig::default().with_table("a b"),
            StreamOutboxConfig::default()
                .with_table("t")
                .with_lease_table("t"),
            StreamOutboxConfig::default().with_item_ttl(Duration::from_secs(3600)),
        ];
        for c in refused {
            assert_eq!(
                c.validate().unwrap_err().kind(),
                outbox_core::ErrorKind::Config
            );
        }
        let d = StreamRelayConfig::default;
        for c in [
            d().with_name(" "),
            d().with_batch_size(0),
            d().with_publish_concurrency(0),
            d().with_publish_concurrency(65),
            d().with_records_per_read(0),
            d().with_records_per_read(1001),
            d().with_poll_interval(Duration::ZERO),
            d().with_discovery_interval(Duration::ZERO),
            d().with_publish_timeout(Duration::ZERO),
            d().with_idle_checkpoint(Duration::ZERO),
            d().with_lease(Duration::from_millis(999)),
        ] {
            assert!(c.validate().is_err(), "{c:?}");
        }
        d().with_lease(Duration::from_secs(1))
            .with_publish_concurrency(64)
            .with_records_per_read(1)
            .validate()
            .unwrap();
    }
}
