#![doc = include_str!("../README.md")]

mod config;
mod error;
mod properties;
mod publisher;
mod session;

pub use config::{RabbitPublisherConfig, Route, Routing, MAX_SHORT_STRING};
pub use properties::{PARTITION_KEY_HEADER, PERSISTENT};
pub use publisher::RabbitPublisher;

/// The lapin this crate was built with, for reading messages back in tests and tools
/// with the same client version.
pub use lapin;

/// Compile-time checks that the public futures can be spawned on a multi-threaded
/// runtime.
#[cfg(test)]
#[allow(dead_code)]
mod send_checks {
    use super::*;
    use outbox_core::{Message, Publisher};

    fn assert_send<T: Send>(_: T) {}

    fn public_futures_are_send(
        publisher: &RabbitPublisher,
        config: RabbitPublisherConfig,
        batch: &[Message],
    ) {
        assert_send(RabbitPublisher::connect(config));
        assert_send(publisher.publish(batch));
        assert_send(publisher.close());
    }
}
