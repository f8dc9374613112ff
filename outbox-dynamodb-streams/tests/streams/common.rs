//! Clients for DynamoDB Local, isolated tables, a relay running in a task.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Publisher, Result, RetryPolicy};
use outbox_dynamodb_streams::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use outbox_dynamodb_streams::{
    aws_sdk_dynamodb, aws_sdk_dynamodbstreams, StreamOutbox, StreamOutboxConfig, StreamRelay,
    StreamRelayConfig, StreamRelayReport,
};
use outbox_testkit::isolation;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The endpoint, or `None` after a visible skip line.
pub(crate) fn url(what: &str) -> Option<String> {
    outbox_testkit::service_url("OUTBOX_DYNAMODB_URL", what)
}

/// `service_test!` for the tests that need DynamoDB Local, on a runtime of two workers:
/// ignored, with this reason, when `OUTBOX_DYNAMODB_URL` was not set at build time.
/// Each test awaits its fixture first (a future of `Option`: `None` skips it), for
/// example [`url_and_outbox`].
#[allow(unused_macros)]
macro_rules! streams_test {
    ($($tests:tt)*) => {
        outbox_testkit::service_test! {
            ignore = "OUTBOX_DYNAMODB_URL was not set at build time (see the build warning)";
            flavor = multi_thread(2);
            $($tests)*
        }
    };
}

/// [`url`], as a `streams_test!` fixture (for `tests/metrics.rs`).
#[allow(dead_code)]
pub(crate) async fn service_url(what: &str) -> Option<String> {
    url(what)
}

/// A `streams_test!` fixture: the endpoint and a fresh [`outbox`] on tables named after
/// `tables`.
pub(crate) async fn url_and_outbox(what: &str, tables: &str) -> Option<(String, StreamOutbox)> {
    let url = url(what)?;
    let outbox = outbox(&url, tables).await;
    Some((url, outbox))
}

/// A DynamoDB client for `url` with dummy credentials, as DynamoDB Local accepts.
pub(crate) fn dynamodb(url: &str) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(url)
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("outbox", "outbox", None, None, "tests"))
            .build(),
    )
}

/// The builder of a DynamoDB Streams client for `url`.
pub(crate) fn streams_config(url: &str) -> aws_sdk_dynamodbstreams::config::Builder {
    aws_sdk_dynamodbstreams::Config::builder()
        .behavior_version(aws_sdk_dynamodbstreams::config::BehaviorVersion::latest())
        .endpoint_url(url)
        .region(aws_sdk_dynamodbstreams::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodbstreams::config::Credentials::new(
            "outbox", "outbox", None, None, "tests",
        ))
}

/// A DynamoDB Streams client for `url`.
pub(crate) fn streams(url: &str) -> aws_sdk_dynamodbstreams::Client {
    aws_sdk_dynamodbstreams::Client::from_conf(streams_config(url).build())
}

/// A fresh outbox on its own tables, installed.
pub(crate) async fn outbox(url: &str, what: &str) -> StreamOutbox {
    let table = format!("{}_{what}", isolation::unique_name());
    let outbox = StreamOutbox::new(
        dynamodb(url),
        StreamOutboxConfig::default().with_table(table),
    )
    .unwrap();
    outbox.install().await.unwrap();
    outbox
}

/// Settings for tests: short lease and waits, fast retries.
pub(crate) fn relay_config() -> StreamRelayConfig {
    StreamRelayConfig::default()
        .with_lease(Duration::from_secs(2))
        .with_poll_interval(Duration::from_millis(50))
        .with_discovery_interval(Duration::from_secs(1))
        .with_idle_checkpoint(Duration::from_millis(200))
        .with_retry(
            RetryPolicy::new(3)
                .with_initial_delay(Duration::from_millis(10))
                .with_max_delay(Duration::from_millis(50)),
        )
}

/// A relay running in a task.
pub(crate) struct Running {
    pub(crate) stop: CancellationToken,
    pub(crate) task: JoinHandle<Result<StreamRelayReport>>,
}

impl Running {
    /// Start a relay over `outbox`.
    pub(crate) fn start(
        outbox: &StreamOutbox,
        streams: aws_sdk_dynamodbstreams::Client,
        publisher: Arc<dyn Publisher>,
        config: StreamRelayConfig,
    ) -> Self {
        let relay = StreamRelay::new(outbox.clone(), streams, publisher, config).unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(relay.run(stop.clone()));
        Running { stop, task }
    }

    /// Shut it down gracefully; its report.
    pub(crate) async fn shutdown(self) -> StreamRelayReport {
        self.stop.cancel();
        outbox_testkit::wait::within("the relay's shutdown", self.task)
            .await
            .unwrap()
            .unwrap()
    }
}
