//! The DynamoDB Streams side of the chaos workers: the outbox and relay settings every
//! `chaos-streams-worker` (and the test that installs the tables) uses, and the
//! Streams client.

use std::time::Duration;

use outbox_core::RetryPolicy;
use outbox_dynamodb_streams::aws_sdk_dynamodbstreams::{self, config};
use outbox_dynamodb_streams::{StreamOutboxConfig, StreamRelayConfig};

/// Records per `GetRecords`: a killed worker's duplicates are at most one read.
pub const RECORDS_PER_READ: i32 = 100;
/// The shard lease: how long a killed worker's shard waits before another takes it.
pub const LEASE: Duration = Duration::from_secs(2);

/// The outbox of table `table`.
pub fn outbox_config(table: &str) -> StreamOutboxConfig {
    StreamOutboxConfig::default().with_table(table)
}

/// The relay settings of every streams worker: a short lease, small reads, fast polls.
pub fn relay_config(name: &str) -> StreamRelayConfig {
    StreamRelayConfig::default()
        .with_name(name)
        .with_lease(LEASE)
        .with_records_per_read(RECORDS_PER_READ)
        .with_batch_size(25)
        .with_poll_interval(Duration::from_millis(50))
        .with_discovery_interval(Duration::from_secs(1))
        .with_publish_timeout(crate::PUBLISH_TIMEOUT * 5)
        .with_retry(
            RetryPolicy::new(20)
                .with_initial_delay(Duration::from_millis(10))
                .with_max_delay(Duration::from_millis(200)),
        )
}

/// A DynamoDB Streams client for the endpoint `url` with static dummy credentials.
pub fn client(url: &str) -> aws_sdk_dynamodbstreams::Client {
    aws_sdk_dynamodbstreams::Client::from_conf(
        config::Config::builder()
            .behavior_version(config::BehaviorVersion::latest())
            .endpoint_url(url)
            .region(config::Region::new("us-east-1"))
            .credentials_provider(config::Credentials::new(
                "outbox",
                "outbox",
                None,
                None,
                "outbox-chaos",
            ))
            .build(),
    )
}
