//! The one guarded call to a [`Publisher`] that every relay makes: [`PublishStage`].

use std::any::Any;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ::metrics::Histogram;
use futures::FutureExt;
use tracing::Instrument;

use super::metrics::COMMIT_TO_PUBLISH_SECONDS;
use crate::message::Message;
use crate::publisher::{PublishOutcome, Publisher};

/// A publisher behind the guards a relay needs around every call, written once for the
/// polling [`Relay`](super::Relay) and for log-tailing relays:
///
/// - **a timeout**: a call that has not answered within the stage's timeout is dropped
///   (the [`Publisher`] contract makes that safe) and every message of it is
///   [`Retryable`](PublishOutcome::Retryable);
/// - **a panic guard**: a publisher that panics fails every message of the call
///   retryably, and [`Published::panicked`] says so for the relay to count;
/// - **the outcome count**: a publisher returning another number of outcomes than
///   messages fails every message retryably (nothing says which outcome is whose);
/// - **errors as outcomes**: `Err` from the publisher becomes the same outcome for every
///   message, retryable or permanent as the error is;
/// - **the trace span** `outbox.publish` (fields `relay`, `count`, `first_id`), linked to
///   each message's trace context with the feature `otel`;
/// - **the latency histogram** [`COMMIT_TO_PUBLISH_SECONDS`] (label `relay`), recorded
///   for each message the broker accepted.
///
/// What it does not do is the relay's own: settling, counting outcomes, retry delays.
/// Cheap to clone; clones share the publisher and the histogram.
#[derive(Clone)]
pub struct PublishStage {
    publisher: Arc<dyn Publisher>,
    relay: Arc<str>,
    timeout: Duration,
    commit_to_publish: Histogram,
}

/// What one guarded call ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// One outcome per message, in the call's order, whatever the publisher did.
    pub outcomes: Vec<PublishOutcome>,
    /// The publisher panicked (every outcome is then retryable): the relay counts it.
    pub panicked: bool,
}

impl fmt::Debug for PublishStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishStage")
            .field("publisher", &self.publisher)
            .field("relay", &self.relay)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl PublishStage {
    /// A stage for the relay named `relay` (the `relay` label of its metrics and span),
    /// giving each call at most `timeout`. The histogram is registered with the
    /// `metrics` recorder installed now.
    pub fn new(publisher: Arc<dyn Publisher>, relay: &str, timeout: Duration) -> Self {
        PublishStage {
            publisher,
            relay: Arc::from(relay),
            timeout,
            commit_to_publish: ::metrics::histogram!(
                COMMIT_TO_PUBLISH_SECONDS,
                "relay" => relay.to_owned()
            ),
        }
    }

    /// The same stage with another timeout.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Hand `messages` to the publisher once, guarded; see the type's docs. An empty
    /// slice is not handed over: it has no outcomes.
    pub async fn publish(&self, messages: &[Message]) -> Published {
        let Some(first) = messages.first() else {
            return Published {
                outcomes: Vec::new(),
                panicked: false,
            };
        };
        let span = tracing::info_span!(
            "outbox.publish",
            relay = %self.relay,
            count = messages.len(),
            first_id = %first.id,
        );
        #[cfg(feature = "otel")]
        crate::otel::link_messages(&span, messages);
        let published = self.guarded(messages).instrument(span).await;
        let now = SystemTime::now();
        for (message, outcome) in messages.iter().zip(&published.outcomes) {
            if *outcome == PublishOutcome::Published {
                if let Ok(lag) = now.duration_since(message.created_at) {
                    self.commit_to_publish.record(lag.as_secs_f64());
                }
            }
        }
        published
    }

    async fn guarded(&self, messages: &[Message]) -> Published {
        tracing::debug!(ids = ?messages.iter().map(|m| m.id).collect::<Vec<_>>(), "publishing");
        let call = AssertUnwindSafe(self.publisher.publish(messages)).catch_unwind();
        let all = |outcome: PublishOutcome| Published {
            outcomes: vec![outcome; messages.len()],
            panicked: false,
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(Ok(outcomes))) if outcomes.len() == messages.len() => Published {
                outcomes,
                panicked: false,
            },
            Ok(Ok(Ok(outcomes))) => {
                let why = format!(
                    "publisher returned {} outcomes for {} messages",
                    outcomes.len(),
                    messages.len()
                );
                tracing::error!("{why}");
                all(PublishOutcome::Retryable(why))
            }
            Ok(Ok(Err(err))) => all(PublishOutcome::of_error(&err)),
            Ok(Err(panic)) => {
                let why = format!("publisher panicked: {}", panic_message(&*panic));
                tracing::error!(count = messages.len(), "{why}");
                Published {
                    panicked: true,
                    ..all(PublishOutcome::Retryable(why))
                }
            }
            Err(_) => {
                let why = format!("publish timed out after {:?}", self.timeout);
                tracing::warn!(count = messages.len(), "{why}");
                all(PublishOutcome::Retryable(why))
            }
        }
    }
}

/// The text of a panic's payload (`panic!("...")` carries a `&str` or a `String`).
pub(super) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, ErrorKind, Result};
    use crate::message::{Headers, MessageId};
    use crate::message_parts::MessageParts;
    use async_trait::async_trait;

    #[derive(Debug)]
    enum Does {
        Answer(usize),
        Fail(ErrorKind),
        Panic,
        Hang,
    }

    #[async_trait]
    impl Publisher for Does {
        async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
            match self {
                Does::Answer(n) => Ok(vec![PublishOutcome::Published; *n]),
                Does::Fail(kind) => Err(Error::new(*kind, "broker said no")),
                Does::Panic => panic!("publisher bug in a batch of {}", batch.len()),
                Does::Hang => std::future::pending().await,
            }
        }
    }

    fn messages(n: usize) -> Vec<Message> {
        (0..n)
            .map(|i| {
                Message::from(MessageParts {
                    id: MessageId::new(),
                    destination: format!("t{i}"),
                    partition_key: None,
                    payload: Vec::new(),
                    content_type: None,
                    headers: Headers::new(),
                    created_at: SystemTime::now(),
                    attempts: 1,
                    last_error: None,
                })
            })
            .collect()
    }

    async fn call(does: Does, n: usize) -> Published {
        PublishStage::new(Arc::new(does), "r", Duration::from_millis(50))
            .publish(&messages(n))
            .await
    }

    fn retryable_with(p: &Published, text: &str) -> bool {
        p.outcomes
            .iter()
            .all(|o| matches!(o, PublishOutcome::Retryable(why) if why.contains(text)))
    }

    #[tokio::test]
    async fn nothing_is_handed_over_for_no_messages() {
        let p = call(Does::Panic, 0).await;
        assert_eq!(p.outcomes, Vec::new());
        assert!(!p.panicked, "the publisher was not called");
    }

    #[tokio::test]
    async fn a_right_count_passes_through() {
        let p = call(Does::Answer(3), 3).await;
        assert_eq!(p.outcomes, vec![PublishOutcome::Published; 3]);
        assert!(!p.panicked);
    }

    #[tokio::test]
    async fn a_wrong_count_fails_every_message_retryably() {
        for answered in [2, 4, 0] {
            let p = call(Does::Answer(answered), 3).await;
            assert_eq!(p.outcomes.len(), 3);
            assert!(
                retryable_with(&p, &format!("returned {answered} outcomes for 3")),
                "{p:?}"
            );
        }
    }

    #[tokio::test]
    async fn errors_become_every_message_s_outcome() {
        let p = call(Does::Fail(ErrorKind::Unavailable), 2).await;
        assert!(retryable_with(&p, "broker said no"), "{p:?}");
        let p = call(Does::Fail(ErrorKind::InvalidInput), 2).await;
        assert_eq!(p.outcomes.len(), 2);
        assert!(
            p.outcomes.iter().all(
                |o| matches!(o, PublishOutcome::Permanent(why) if why.contains("broker said no"))
            ),
            "{p:?}"
        );
    }

    #[tokio::test]
    async fn a_panic_is_caught_and_reported() {
        let p = call(Does::Panic, 2).await;
        assert!(p.panicked);
        assert!(
            retryable_with(&p, "publisher panicked: publisher bug in a batch of 2"),
            "{p:?}"
        );
    }

    #[tokio::test]
    async fn a_hung_call_times_out() {
        let p = call(Does::Hang, 2).await;
        assert!(!p.panicked);
        assert!(retryable_with(&p, "publish timed out after 50ms"), "{p:?}");
    }

    #[test]
    fn debug_names_the_publisher_relay_and_timeout() {
        let stage = PublishStage::new(Arc::new(Does::Hang), "orders", Duration::from_secs(3));
        let text = format!("{stage:?}");
        for part in ["Hang", "orders", "3s"] {
            assert!(text.contains(part), "{text}");
        }
    }

    #[test]
    fn panic_payloads_are_read() {
        assert_eq!(panic_message(&"text"), "text");
        assert_eq!(panic_message(&String::from("owned")), "owned");
        assert_eq!(panic_message(&7_u8), "a panic without a message");
    }
}
