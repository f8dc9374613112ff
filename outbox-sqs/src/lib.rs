#![doc = include_str!("../README.md")]

mod attributes;
mod chunk;
mod config;
mod error;
mod publisher;
mod request;

pub use attributes::{
    decode, SqsDelivery, CONTENT_TYPE_ATTRIBUTE, DESTINATION_ATTRIBUTE, HEADERS_ATTRIBUTE,
    MAX_ATTRIBUTES, MESSAGE_ID_ATTRIBUTE, PARTITION_KEY_ATTRIBUTE, PAYLOAD_ENCODING_ATTRIBUTE,
};
pub use chunk::MAX_BATCH_ENTRIES;
pub use config::{
    Routing, SqsPublisherConfig, UnkeyedGroup, DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_REQUEST_TIMEOUT, FIFO_SUFFIX, MAX_CONCURRENT_REQUESTS,
    MAX_GROUP_ID_LEN, MAX_MESSAGE_BYTES, MAX_QUEUE_NAME_LEN, MIN_MESSAGE_BYTES,
};
pub use publisher::SqsPublisher;

/// The aws-sdk-sqs this crate was built with: make your own client with it for
/// [`SqsPublisher::new`], create queues, or receive.
pub use aws_sdk_sqs;

/// Compile-time checks that the public futures can be spawned on a multi-threaded
/// runtime.
#[cfg(test)]
#[allow(dead_code)]
mod send_checks {
    use super::*;
    use outbox_core::{Message, Publisher};

    fn assert_send<T: Send>(_: T) {}

    fn public_futures_are_send(publisher: &SqsPublisher, batch: &[Message]) {
        assert_send(publisher.publish(batch));
    }
}
