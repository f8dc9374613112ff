#![doc = include_str!("../README.md")]

mod capacity;
mod config;
mod item;
mod leases;
mod lineage;
mod meters;
mod outbox;
mod reader;
mod recovery;
mod relay;
mod sequence;
mod stream;

pub use capacity::StreamOutboxMetrics;
pub use config::{
    StreamOutboxConfig, StreamRelayConfig, DEFAULT_ITEM_TTL, MAX_RECORDS_PER_READ, MIN_ITEM_TTL,
};
pub use meters::{describe_metrics, ITERATOR_AGE_SECONDS, RECORDS_READ, SHARDS_OWNED};
pub use outbox::{StreamDeadLetter, StreamOutbox};
pub use recovery::REPLAY_MARGIN;
pub use relay::{StreamRelay, StreamRelayReport};

/// The AWS SDKs this crate was built with: build your clients and transaction items
/// with them.
pub use aws_sdk_dynamodb;
pub use aws_sdk_dynamodbstreams;

#[cfg(test)]
mod send_checks {
    //! The public futures can be spawned on a multi-threaded runtime.
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    #[allow(dead_code)]
    fn futures_are_send(outbox: StreamOutbox, relay: StreamRelay) {
        assert_send(&outbox.install());
        assert_send(&outbox.enqueue(Vec::new(), &[]));
        assert_send(&outbox.dead_letters(10));
        assert_send(&relay.recover_trimmed());
        assert_send(&relay.run(tokio_util::sync::CancellationToken::new()));
    }
}
