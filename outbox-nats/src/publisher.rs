//! [`NatsPublisher`]: JetStream publishes with the message id as `Nats-Msg-Id`, every
//! `PubAck` awaited, a bounded number outstanding.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::{HeaderMap, HeaderName, HeaderValue, Subject};
use async_trait::async_trait;
use futures::stream::{self, StreamExt};
use outbox_core::{publisher::OutcomeCounts, Error, Message, PublishOutcome, Publisher, Result};
use tracing::Instrument;

use crate::config::NatsPublisherConfig;
use crate::error;

/// The header carrying [`Message::content_type`].
pub const CONTENT_TYPE_HEADER: &str = "Content-Type";
/// The header carrying [`Message::partition_key`].
pub const PARTITION_KEY_HEADER: &str = "Outbox-Partition-Key";
/// The header carrying [`Message::id`], JetStream's dedup id.
pub const MESSAGE_ID_HEADER: &str = "Nats-Msg-Id";

/// The names the publisher sets on every message, parsed at compile time rather than
/// per message.
const CONTENT_TYPE_NAME: HeaderName = HeaderName::from_static(CONTENT_TYPE_HEADER);
const PARTITION_KEY_NAME: HeaderName = HeaderName::from_static(PARTITION_KEY_HEADER);
const MESSAGE_ID_NAME: HeaderName = HeaderName::from_static(MESSAGE_ID_HEADER);

/// Publishes outbox messages to NATS JetStream.
///
/// # Contract
///
/// - **Subjects.** A message to destination `d` goes to subject `d`, or `<prefix>.d`
///   with [`NatsPublisherConfig::with_subject_prefix`]. A stream must store that
///   subject: the publisher never creates streams.
/// - **Headers.** The message's headers are sent as NATS headers, then
///   `Content-Type` (the content type), `Outbox-Partition-Key` (the partition key)
///   and `Nats-Msg-Id` (the message id) are set, replacing a message header of the
///   same name. The payload is sent as is, byte for byte.
/// - **Dedup.** `Nats-Msg-Id` makes JetStream drop a repeat of the id within the
///   stream's `duplicate_window` (two minutes by default); its `PubAck` is flagged
///   duplicate and the message counts as
///   [`Published`](PublishOutcome::Published).
/// - **Acks.** A batch is sent in order and every `PubAck` is awaited, with at most
///   [`NatsPublisherConfig::max_in_flight`] outstanding for the publisher (across its
///   concurrent calls). One outcome per message, in the batch's order; `publish`
///   itself never returns `Err`.
/// - **Outcomes.** [`Permanent`](PublishOutcome::Permanent): no stream stores the
///   subject (no responders, and JetStream confirms no stream matches), a message over
///   the server's `max_payload` or the stream's size limits, a destination that is not
///   a subject, a header NATS cannot carry. [`Retryable`](PublishOutcome::Retryable):
///   no `PubAck` within [`NatsPublisherConfig::ack_timeout`], the connection lost, no
///   responders while JetStream is not answering (a restart), a full stream. The
///   mapping is the table in `error.rs`.
/// - **Reconnection.** The client reconnects by itself, forever; publishes during an
///   outage time out as retryable, and later ones succeed on the same publisher.
/// - **Cancellation.** Dropping a `publish` future abandons its outstanding acks (a
///   background task of async-nats reaps them); a later publish of the same messages is
///   deduplicated by the stream when the first one landed.
///
/// Clones share the connection.
#[derive(Clone)]
pub struct NatsPublisher {
    client: async_nats::Client,
    jetstream: async_nats::jetstream::Context,
    config: NatsPublisherConfig,
}

impl fmt::Debug for NatsPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsPublisher")
            .field("config", &self.config)
            .field("connection", &self.client.connection_state())
            .finish_non_exhaustive()
    }
}

/// What became of one message before no-responders are settled.
enum Attempt {
    Published,
    Failed(Error),
    /// No responders on `subject`: permanent only if JetStream confirms no stream.
    NoResponders {
        subject: String,
        error: Error,
    },
}

impl NatsPublisher {
    /// Connect to the server(s) of `config`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for an invalid config, an
    /// address that does not parse or refused credentials;
    /// [`ErrorKind::Unavailable`](outbox_core::ErrorKind::Unavailable) when no server
    /// answered within [`NatsPublisherConfig::connect_timeout`].
    pub async fn connect(config: NatsPublisherConfig) -> Result<Self> {
        config.validate()?;
        let client = config
            .connect_options()
            .connect(config.url())
            .await
            .map_err(error::connect_error)?;
        Self::from_client(client, config)
    }

    /// Publish over an existing client. The config's URL, credentials and connect
    /// timeout are ignored; its subject prefix, `max_in_flight` and ack timeout apply.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for an invalid config.
    pub fn from_client(client: async_nats::Client, config: NatsPublisherConfig) -> Result<Self> {
        config.validate()?;
        let jetstream = async_nats::jetstream::ContextBuilder::new()
            .timeout(config.ack_timeout())
            .max_ack_inflight(config.max_in_flight())
            // Wait for a free slot instead of failing when other calls fill the window.
            .backpressure_on_inflight(true)
            .build(client.clone());
        Ok(NatsPublisher {
            client,
            jetstream,
            config,
        })
    }

    /// The NATS client, for the rest of the application (streams, subscriptions).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The JetStream context publishes go through.
    pub fn jetstream(&self) -> &async_nats::jetstream::Context {
        &self.jetstream
    }

    /// The settings.
    pub fn config(&self) -> &NatsPublisherConfig {
        &self.config
    }

    async fn publish_one(&self, message: &Message, subject: Result<Subject>) -> Attempt {
        let subject = match subject {
            Ok(subject) => subject,
            Err(e) => return Attempt::Failed(e),
        };
        let headers = match headers(message) {
            Ok(headers) => headers,
            Err(e) => return Attempt::Failed(e),
        };
        let publish = PublishMessage::build()
            .payload(bytes::Bytes::copy_from_slice(&message.payload))
            .headers(headers);
        let result = match self.jetstream.send_publish(subject.clone(), publish).await {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match result {
            Ok(ack) => {
                if ack.duplicate {
                    tracing::debug!(id = %message.id, stream = %ack.stream, "duplicate dropped by JetStream");
                }
                Attempt::Published
            }
            Err(e) if e.kind() == PublishErrorKind::StreamNotFound => {
                let error = error::publish_error(&subject, e);
                Attempt::NoResponders {
                    subject: subject.to_string(),
                    error,
                }
            }
            Err(e) => Attempt::Failed(error::publish_error(&subject, e)),
        }
    }

    /// Settle no-responders: ask JetStream once per subject which stream stores it.
    async fn settle(&self, attempts: Vec<Attempt>) -> Vec<PublishOutcome> {
        let mut verdicts: HashMap<String, PublishOutcome> = HashMap::new();
        let mut outcomes = Vec::with_capacity(attempts.len());
        for attempt in attempts {
            outcomes.push(match attempt {
                Attempt::Published => PublishOutcome::Published,
                Attempt::Failed(e) => PublishOutcome::of_error(&e),
                Attempt::NoResponders { subject, error } => {
                    if let Some(verdict) = verdicts.get(&subject) {
                        verdict.clone()
                    } else {
                        let probe = self.jetstream.stream_by_subject(subject.clone()).await;
                        let verdict =
                            PublishOutcome::of_error(&error::no_stream(&subject, error, probe));
                        verdicts.insert(subject, verdict.clone());
                        verdict
                    }
                }
            });
        }
        outcomes
    }
}

/// The subject of each message of `batch`, each destination checked and formatted
/// once per call (a batch mostly has one or a few): a destination that is not a
/// subject fails its messages only.
fn subjects(config: &NatsPublisherConfig, batch: &[Message]) -> Vec<Result<Subject>> {
    let mut known: Vec<(&str, Subject)> = Vec::new();
    batch
        .iter()
        .map(|m| {
            let destination = m.destination.as_str();
            if let Some((_, subject)) = known.iter().find(|(d, _)| *d == destination) {
                return Ok(subject.clone());
            }
            let subject = Subject::from(config.subject_for(destination)?);
            known.push((destination, subject.clone()));
            Ok(subject)
        })
        .collect()
}

/// The NATS headers of `message`. The message's own names and values, its content type
/// and its key are checked (an error, never a panic); the id's text (a UUID) needs none.
fn headers(message: &Message) -> Result<HeaderMap> {
    let mut map = HeaderMap::new();
    for (name, value) in message.headers.iter() {
        let header = HeaderName::from_str(name).map_err(|e| {
            Error::invalid_input(format!("header name {name:?} cannot be a NATS header"))
                .with_source(e)
        })?;
        map.insert(header, header_value(name, value)?);
    }
    if let Some(content_type) = &message.content_type {
        map.insert(
            CONTENT_TYPE_NAME,
            header_value(CONTENT_TYPE_HEADER, content_type)?,
        );
    }
    if let Some(key) = &message.partition_key {
        map.insert(PARTITION_KEY_NAME, header_value(PARTITION_KEY_HEADER, key)?);
    }
    map.insert(MESSAGE_ID_NAME, HeaderValue::from(message.id.to_string()));
    Ok(map)
}

/// `value` as the value of header `name`, refused when NATS cannot carry it.
fn header_value(name: &str, value: &str) -> Result<HeaderValue> {
    HeaderValue::from_str(value).map_err(|e| {
        Error::invalid_input(format!("the value of header {name:?} cannot be sent")).with_source(e)
    })
}

#[async_trait]
impl Publisher for NatsPublisher {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        let span = tracing::info_span!(
            "outbox_nats.publish",
            batch = batch.len(),
            published = tracing::field::Empty,
            retryable = tracing::field::Empty,
            permanent = tracing::field::Empty,
        );
        async move {
            // Futures made up front (they start only when polled): a closure in
            // `map` trips the Send check of the boxed future over its lifetimes.
            let pending: Vec<_> = batch
                .iter()
                .zip(subjects(&self.config, batch))
                .map(|(m, subject)| self.publish_one(m, subject))
                .collect();
            let attempts: Vec<Attempt> = stream::iter(pending)
                .buffered(self.config.max_in_flight())
                .collect()
                .await;
            let outcomes = self.settle(attempts).await;
            OutcomeCounts::of(&outcomes).record(&tracing::Span::current());
            Ok(outcomes)
        }
        .instrument(span)
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::backend::MessageParts;
    use outbox_core::{Headers, MessageId};
    use std::time::SystemTime;

    fn message(headers: Headers) -> Message {
        Message::from(MessageParts {
            id: MessageId::new(),
            destination: "d".into(),
            partition_key: Some("k".into()),
            payload: Vec::new(),
            content_type: Some("text/plain".into()),
            headers,
            created_at: SystemTime::now(),
            attempts: 1,
            last_error: None,
        })
    }

    #[test]
    fn headers_carry_content_type_key_and_id_over_the_messages_own() {
        let m = message(
            [
                ("x-a", "1"),
                ("Nats-Msg-Id", "forged"),
                ("Content-Type", "x"),
            ]
            .into_iter()
            .collect(),
        );
        let map = headers(&m).unwrap();
        assert_eq!(map.get("x-a").unwrap().as_str(), "1");
        assert_eq!(map.get(CONTENT_TYPE_HEADER).unwrap().as_str(), "text/plain");
        assert_eq!(map.get(PARTITION_KEY_HEADER).unwrap().as_str(), "k");
        assert_eq!(
            map.get(MESSAGE_ID_HEADER).unwrap().as_str(),
            m.id.to_string()
        );
    }

    #[test]
    fn each_destination_becomes_a_subject_once_and_a_bad_one_fails_alone() {
        let config = NatsPublisherConfig::new("nats://x").with_subject_prefix("p");
        let batch: Vec<Message> = ["a", "b..c", "a", "b"]
            .into_iter()
            .map(|d| {
                let mut m = message(Headers::new());
                m.destination = d.into();
                m
            })
            .collect();
        let subjects = subjects(&config, &batch);
        let text: Vec<Option<&str>> = subjects
            .iter()
            .map(|s| s.as_ref().ok().map(Subject::as_str))
            .collect();
        assert_eq!(text, [Some("p.a"), None, Some("p.a"), Some("p.b")]);
        assert_eq!(
            subjects[1].as_ref().unwrap_err().kind(),
            outbox_core::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn headers_nats_cannot_carry_are_refused_not_panicked_on() {
        let mut m = message(Headers::new());
        m.headers.insert("bad:name", "v");
        assert_eq!(
            headers(&m).unwrap_err().kind(),
            outbox_core::ErrorKind::InvalidInput
        );
        let mut m = message(Headers::new());
        m.headers.insert("ok", "line\r\nbreak");
        assert!(headers(&m).is_err());
    }
}
