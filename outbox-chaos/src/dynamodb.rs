//! The DynamoDB side of the chaos workers: the client, the fault mix its requests run
//! under, and the outbox settings every worker (and the test that installs the table)
//! uses.
//!
//! DynamoDB Local never throttles, never cancels a transaction for a conflict and its
//! indexes never lag, so a worker's client carries an
//! [`outbox_dynamodb::faults::FaultInjector`] that does all three, with the SDK's
//! standard retries in front of it as a client configured for DynamoDB has
//! ([`fault_mix`], [`retries`]). The injector is seeded ([`crate::ENV_FAULT_SEED`]) so
//! a run's mix of faults can be replayed.

use std::fmt;
use std::time::Duration;

use outbox_core::{KeyOrder, RelayConfig};
use outbox_dynamodb::aws_sdk_dynamodb::config::retry::RetryConfig;
use outbox_dynamodb::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use outbox_dynamodb::aws_sdk_dynamodb::{Client, Config};
use outbox_dynamodb::faults::{CancelReason, FaultInjector, Rule};
use outbox_dynamodb::DynamoOutboxConfig;

/// Share of the attempts of every data-plane operation a worker sends that are
/// throttled, half with `ThrottlingException`, half with
/// `ProvisionedThroughputExceededException`.
pub const THROTTLE_RATE: f64 = 0.05;
/// Share of a worker's `TransactWriteItems` requests cancelled for a
/// `TransactionConflict`.
pub const CONFLICT_RATE: f64 = 0.01;
/// Share of a worker's index queries answered from before the writes since an equal
/// query (a lagging global index).
pub const STALE_RATE: f64 = 0.05;
/// The message lease of every DynamoDB worker. Longer than [`crate::LEASE`]: a claim
/// on DynamoDB Local (index queries of the worker's shards, a marker query per key, a
/// conditional write and a body query per message, some of them throttled and retried)
/// takes up to a second or more on a loaded 2-core machine, and the relay publishes only
/// while [`crate::PUBLISH_TIMEOUT`] and a tenth of the lease still fit in what is left.
pub const LEASE: Duration = Duration::from_secs(5);
/// The shard lease of every worker: short, so a killed worker's shards are taken over
/// before its message leases ([`LEASE`]) lapse.
pub const SHARD_LEASE: Duration = Duration::from_secs(2);

/// A client for the endpoint `url` with static dummy credentials (DynamoDB Local
/// accepts any) and `retry` as its retry configuration.
pub fn client(url: &str, retry: RetryConfig) -> Client {
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(url)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "outbox",
            "outbox",
            None,
            None,
            "outbox-chaos",
        ))
        .retry_config(retry)
        .build();
    Client::from_conf(config)
}

/// The SDK's retries in every worker: standard mode, 10 attempts, backoff from 5 ms to
/// 200 ms. They absorb nearly every injected throttle, as a client configured for
/// DynamoDB should; a cancelled transaction is not retried and reaches the store.
pub fn retries() -> RetryConfig {
    RetryConfig::standard()
        .with_max_attempts(10)
        .with_initial_backoff(Duration::from_millis(5))
        .with_max_backoff(Duration::from_millis(200))
}

/// The fault mix of a worker, seeded with `seed`: throttles of every attempt of the
/// [`DATA_OPERATIONS`](outbox_dynamodb::faults::DATA_OPERATIONS) at [`THROTTLE_RATE`], transactions cancelled for a conflict at
/// [`CONFLICT_RATE`] (both before the request is applied, as AWS refuses a throttled
/// request), and index queries answered from before at [`STALE_RATE`]. Register it
/// with [`FaultInjector::client`].
pub fn fault_mix(seed: u64) -> FaultInjector {
    let faults = FaultInjector::new(seed);
    faults.throttle_data_plane(THROTTLE_RATE);
    faults.add(Rule::cancel_transaction(CancelReason::TransactionConflict).rate(CONFLICT_RATE));
    faults.add(Rule::stale_index().rate(STALE_RATE));
    faults
}

/// The relay settings of a DynamoDB worker: [`crate::relay_config`] with the longer
/// [`LEASE`].
pub fn relay_config(name: &str) -> RelayConfig {
    crate::relay_config(name).with_lease(LEASE)
}

/// The outbox of table `table` as every worker (and the test installing it) configures
/// it: the defaults, `ordering`, and shard leases of [`SHARD_LEASE`].
pub fn outbox_config(table: &str, ordering: KeyOrder) -> DynamoOutboxConfig {
    DynamoOutboxConfig::default()
        .with_table(table)
        .with_ordering(ordering)
        .with_shard_leases(Some(SHARD_LEASE))
}

/// What a worker's injector injected so far, by kind. A worker prints it as a line
/// `faults: <counts>` every second ([`FAULTS_EVERY`]), so the test can add up what
/// every process saw, the killed ones included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Injected `ThrottlingException`s and `ProvisionedThroughputExceededException`s.
    pub throttles: u64,
    /// Transactions cancelled for a `TransactionConflict`.
    pub conflicts: u64,
    /// Index queries answered from before.
    pub stale: u64,
    /// Every fault injected.
    pub total: u64,
}

/// How often a DynamoDB worker prints its [`FaultCounts`].
pub const FAULTS_EVERY: Duration = Duration::from_secs(1);

/// The marker of a worker's fault-count lines.
pub const FAULTS_LINE: &str = "faults: ";

impl FaultCounts {
    /// What `faults` injected so far.
    pub fn of(faults: &FaultInjector) -> Self {
        let mut counts = FaultCounts::default();
        for injected in faults.injected() {
            let fault = injected.fault.as_str();
            if fault.contains("ThrottlingException")
                || fault.contains("ProvisionedThroughputExceededException")
            {
                counts.throttles += injected.count;
            } else if fault.contains("TransactionConflict") {
                counts.conflicts += injected.count;
            } else if fault.contains("stale index") {
                counts.stale += injected.count;
            }
            counts.total += injected.count;
        }
        counts
    }

    /// The counts of a line holding [`FAULTS_LINE`] followed by what
    /// [`Display`](fmt::Display) writes; `None` for any other line.
    pub fn parse(line: &str) -> Option<Self> {
        let (_, rest) = line.split_once(FAULTS_LINE)?;
        let mut counts = FaultCounts::default();
        for pair in rest.split_whitespace() {
            let (name, value) = pair.split_once('=')?;
            let value = value.parse().ok()?;
            match name {
                "throttles" => counts.throttles = value,
                "conflicts" => counts.conflicts = value,
                "stale" => counts.stale = value,
                "total" => counts.total = value,
                _ => return None,
            }
        }
        Some(counts)
    }
}

impl std::ops::AddAssign for FaultCounts {
    fn add_assign(&mut self, other: Self) {
        self.throttles += other.throttles;
        self.conflicts += other.conflicts;
        self.stale += other.stale;
        self.total += other.total;
    }
}

impl fmt::Display for FaultCounts {
    /// `throttles=<n> conflicts=<n> stale=<n> total=<n>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "throttles={} conflicts={} stale={} total={}",
            self.throttles, self.conflicts, self.stale, self.total
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_config_validates() {
        let config = relay_config("chaos");
        config.validate().unwrap();
        assert_eq!(config.lease, LEASE);
        assert_eq!(
            config.pipeline_depth,
            crate::relay_config("x").pipeline_depth
        );
    }

    #[test]
    fn outbox_config_validates() {
        let config = outbox_config("obx_1700000000_0123456789ab", KeyOrder::PerKey);
        config.validate().unwrap();
        assert_eq!(config.shard_lease(), Some(SHARD_LEASE));
        assert_eq!(config.capabilities().ordering, KeyOrder::PerKey);
    }

    #[test]
    fn fault_counts_round_trip_through_a_line() {
        let counts = FaultCounts {
            throttles: 12,
            conflicts: 1,
            stale: 3,
            total: 16,
        };
        let line = format!("chaos-worker d0 {FAULTS_LINE}{counts}");
        assert_eq!(FaultCounts::parse(&line), Some(counts));
        assert_eq!(FaultCounts::parse("chaos-worker d0 running"), None);
        assert_eq!(FaultCounts::parse("faults: throttles=x"), None);
    }

    #[test]
    fn a_fresh_mix_has_injected_nothing() {
        let faults = fault_mix(7);
        assert_eq!(faults.seed(), 7);
        assert_eq!(FaultCounts::of(&faults), FaultCounts::default());
    }
}
