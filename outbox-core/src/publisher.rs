//! The broker side: [`Publisher`].

use std::fmt;

use async_trait::async_trait;

use crate::error::{Error, Result};
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

impl PublishOutcome {
    /// The outcome of a message that failed with `err`: retryable when the error is,
    /// permanent otherwise, with the error's whole chain
    /// ([`Error::report`](crate::Error::report)) as the reason.
    pub fn of_error(err: &Error) -> Self {
        let reason = err.report().to_string();
        if err.is_retryable() {
            PublishOutcome::Retryable(reason)
        } else {
            PublishOutcome::Permanent(reason)
        }
    }
}

/// How many outcomes of one publish call are of each kind, for a publisher's span and
/// logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutcomeCounts {
    /// [`PublishOutcome::Published`].
    pub published: usize,
    /// [`PublishOutcome::Retryable`].
    pub retryable: usize,
    /// [`PublishOutcome::Permanent`].
    pub permanent: usize,
}

impl OutcomeCounts {
    /// Count `outcomes`.
    pub fn of(outcomes: &[PublishOutcome]) -> Self {
        outcomes
            .iter()
            .fold(OutcomeCounts::default(), |mut counts, outcome| {
                match outcome {
                    PublishOutcome::Published => counts.published += 1,
                    PublishOutcome::Retryable(_) => counts.retryable += 1,
                    PublishOutcome::Permanent(_) => counts.permanent += 1,
                }
                counts
            })
    }

    /// Record the counts on `span`'s fields `published`, `retryable` and `permanent`
    /// (declared `tracing::field::Empty` where the span was made).
    pub fn record(&self, span: &tracing::Span) {
        span.record("published", self.published);
        span.record("retryable", self.retryable);
        span.record("permanent", self.permanent);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn an_error_becomes_the_outcome_its_status_says() {
        let retry = PublishOutcome::of_error(&Error::new(ErrorKind::Unavailable, "down"));
        assert!(matches!(retry, PublishOutcome::Retryable(why) if why.contains("down")));
        let never = PublishOutcome::of_error(&Error::invalid_input("bad"));
        assert!(matches!(never, PublishOutcome::Permanent(why) if why.contains("bad")));
    }

    #[test]
    fn outcomes_are_counted_by_kind() {
        let outcomes = [
            PublishOutcome::Published,
            PublishOutcome::Retryable("r".into()),
            PublishOutcome::Published,
            PublishOutcome::Permanent("p".into()),
            PublishOutcome::Published,
        ];
        let counts = OutcomeCounts::of(&outcomes);
        assert_eq!(
            (counts.published, counts.retryable, counts.permanent),
            (3, 1, 1)
        );
    }
}
