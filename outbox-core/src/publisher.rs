//! The broker side: [`Publisher`].

use std::fmt;

use async_trait::async_trait;

use crate::error::Result;
use crate::message::Message;

/// What became of one message handed to [`Publisher::publish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOutcome {
    /// The broker accepted the message.
    Published,
    /// The broker did not take it this time; retry after backoff.
    Retryable(String),
    /// The broker will never take it (unknown destination, message too large for the
    /// broker, a rejected schema); dead-letter it without further attempts.
    Permanent(String),
}

/// Publishes messages to a broker.
///
/// # Contract
///
/// - `publish` receives a non-empty batch and returns `Ok` with exactly one outcome per
///   message, in the batch's order. A relay that gets the wrong number of outcomes
///   treats every message in the batch as [`PublishOutcome::Retryable`].
/// - `Err` means the whole batch failed the same way: the relay retries every message
///   when the error [`is_retryable`](crate::Error::is_retryable), and dead-letters them
///   all otherwise. Prefer per-message outcomes when the broker reports them.
/// - Publishing is at-least-once: a message may be handed over again after a crash, a
///   lost lease or a timeout. Publishers should pass [`Message::id`] as the broker's
///   dedup id where there is one (NATS `Nats-Msg-Id`, AMQP `message-id`, a Kafka
///   header) so the broker can drop the repeat.
/// - `publish` must be cancel-safe in the sense that dropping its future leaves no
///   broker state that would block a later publish of the same message.
/// - Implementations are shared across tasks (`Arc<dyn Publisher>`) and may be called
///   concurrently.
#[async_trait]
pub trait Publisher: Send + Sync + fmt::Debug {
    /// Publish a batch; see the trait's contract.
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>>;
}

#[async_trait]
impl<P: Publisher + ?Sized> Publisher for std::sync::Arc<P> {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        (**self).publish(batch).await
    }
}
