#![doc = include_str!("../README.md")]

mod config;
mod error;
mod publisher;

pub use config::{
    NatsPublisherConfig, DEFAULT_ACK_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_IN_FLIGHT,
    MAX_IN_FLIGHT,
};
pub use publisher::{NatsPublisher, CONTENT_TYPE_HEADER, MESSAGE_ID_HEADER, PARTITION_KEY_HEADER};

/// The async-nats this crate was built with: make your own client with it for
/// [`NatsPublisher::from_client`], or manage streams.
pub use async_nats;

/// Compile-time checks that the public futures can be spawned on a multi-threaded
/// runtime.
#[cfg(test)]
#[allow(dead_code)]
mod send_checks {
    use super::*;
    use outbox_core::{Message, Publisher};

    fn assert_send<T: Send>(_: T) {}

    fn public_futures_are_send(publisher: &NatsPublisher, batch: &[Message]) {
        assert_send(NatsPublisher::connect(NatsPublisherConfig::new("nats://h")));
        assert_send(publisher.publish(batch));
    }
}
