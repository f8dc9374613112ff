//! The message model: what a service enqueues ([`NewMessage`]) and what a relay claims
//! ([`Message`]).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::{Error, Result};

/// A message id: a UUIDv7, so ids sort by creation time and index well.
///
/// The id is the message's identity end to end: the outbox row key, the broker's dedup
/// id where the broker has one, and the key consumers deduplicate on.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MessageId(Uuid);

impl MessageId {
    /// A fresh, time-ordered (v7) id.
    pub fn new() -> Self {
        MessageId(Uuid::now_v7())
    }

    /// Wrap an existing UUID, for ids that come from storage or a broker.
    pub fn from_uuid(uuid: Uuid) -> Self {
        MessageId(uuid)
    }

    /// The underlying UUID.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl Default for MessageId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for MessageId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Uuid::parse_str(s)
            .map(MessageId)
            .map_err(|e| Error::invalid_input(format!("not a message id: {s:?}")).with_source(e))
    }
}

/// Size limits checked before anything is written.
///
/// The defaults suit most brokers; lower `max_payload_bytes` to match yours (for example
/// NATS's default 1 MiB, SQS's 256 KiB).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageLimits {
    /// Longest destination, in bytes. Default 255.
    pub max_destination_len: usize,
    /// Longest partition key, in bytes. Default 255.
    pub max_partition_key_len: usize,
    /// Largest payload, in bytes. Default 1 MiB.
    pub max_payload_bytes: usize,
    /// Most headers on one message. Default 64.
    pub max_headers: usize,
    /// Longest header name, in bytes. Default 128.
    pub max_header_name_len: usize,
    /// Longest header value, in bytes. Default 4096.
    pub max_header_value_len: usize,
}

impl Default for MessageLimits {
    fn default() -> Self {
        MessageLimits {
            max_destination_len: 255,
            max_partition_key_len: 255,
            max_payload_bytes: 1024 * 1024,
            max_headers: 64,
            max_header_name_len: 128,
            max_header_value_len: 4096,
        }
    }
}

impl MessageLimits {
    /// Set the largest payload accepted.
    pub fn with_max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Check a message against these limits; the error names the first violation.
    pub fn check(&self, msg: &NewMessage) -> Result<()> {
        check_text("destination", &msg.destination, self.max_destination_len)?;
        if let Some(key) = &msg.partition_key {
            check_text("partition key", key, self.max_partition_key_len)?;
        }
        if msg.payload.len() > self.max_payload_bytes {
            return Err(Error::invalid_input(format!(
                "payload of {} bytes exceeds the limit of {} bytes",
                msg.payload.len(),
                self.max_payload_bytes
            )));
        }
        if let Some(ct) = &msg.content_type {
            check_text("content type", ct, self.max_header_value_len)?;
        }
        self.check_headers(&msg.headers)
    }

    /// Check a header map against these limits.
    pub fn check_headers(&self, headers: &Headers) -> Result<()> {
        if headers.len() > self.max_headers {
            return Err(Error::invalid_input(format!(
                "{} headers exceed the limit of {}",
                headers.len(),
                self.max_headers
            )));
        }
        for (name, value) in headers.iter() {
            check_header_name(name, self.max_header_name_len)?;
            check_header_value(name, value, self.max_header_value_len)?;
        }
        Ok(())
    }
}

fn check_text(what: &str, value: &str, max: usize) -> Result<()> {
    if value.trim().is_empty() {
        return Err(Error::invalid_input(format!("{what} is empty")));
    }
    if value.len() > max {
        return Err(Error::invalid_input(format!(
            "{what} of {} bytes exceeds the limit of {max} bytes",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid_input(format!(
            "{what} {value:?} contains a control character"
        )));
    }
    Ok(())
}

/// Header names are HTTP tokens (RFC 9110 `tchar`), so they survive every broker's
/// header model (AMQP tables, NATS and Kafka headers).
fn check_header_name(name: &str, max: usize) -> Result<()> {
    let valid_char = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > max || !name.bytes().all(valid_char) {
        return Err(Error::invalid_input(format!(
            "header name {name:?} must be 1 to {max} token characters (letters, digits, !#$%&'*+-.^_`|~)"
        )));
    }
    Ok(())
}

fn check_header_value(name: &str, value: &str, max: usize) -> Result<()> {
    if value.len() > max {
        return Err(Error::invalid_input(format!(
            "header {name:?} value of {} bytes exceeds the limit of {max} bytes",
            value.len()
        )));
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(Error::invalid_input(format!(
            "header {name:?} value contains a control character"
        )));
    }
    Ok(())
}

/// Message headers: names are case-sensitive tokens, values are text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Headers(BTreeMap<String, String>);

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Headers(BTreeMap::new())
    }

    /// Set a header, replacing any earlier value. Validated when the message is built.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.0.insert(name.into(), value.into());
    }

    /// A header's value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// `true` when there are no headers.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Headers in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Headers(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

/// A message to enqueue, validated when built.
///
/// ```
/// use outbox_core::NewMessage;
///
/// let msg = NewMessage::builder("orders.created")
///     .partition_key("order-42")
///     .content_type("application/json")
///     .header("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
///     .payload(br#"{"order":42}"#.to_vec())
///     .build()?;
/// assert_eq!(msg.destination(), "orders.created");
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    id: MessageId,
    destination: String,
    partition_key: Option<String>,
    payload: Vec<u8>,
    content_type: Option<String>,
    headers: Headers,
    delay: Duration,
}

impl NewMessage {
    /// Start a message for `destination` (a topic, queue or subject).
    pub fn builder(destination: impl Into<String>) -> NewMessageBuilder {
        NewMessageBuilder {
            msg: NewMessage {
                id: MessageId::new(),
                destination: destination.into(),
                partition_key: None,
                payload: Vec::new(),
                content_type: None,
                headers: Headers::new(),
                delay: Duration::ZERO,
            },
            limits: MessageLimits::default(),
        }
    }

    /// The message id.
    pub fn id(&self) -> MessageId {
        self.id
    }
    /// Where the message goes.
    pub fn destination(&self) -> &str {
        &self.destination
    }
    /// The ordering key, if any.
    pub fn partition_key(&self) -> Option<&str> {
        self.partition_key.as_deref()
    }
    /// The payload bytes.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }
    /// The payload's content type, if given.
    pub fn content_type(&self) -> Option<&str> {
        self.content_type.as_deref()
    }
    /// The headers.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }
    /// How long after commit the message becomes claimable (zero: at once).
    pub fn delay(&self) -> Duration {
        self.delay
    }
}

/// Builds a [`NewMessage`]; see [`NewMessage::builder`].
#[derive(Debug, Clone)]
pub struct NewMessageBuilder {
    msg: NewMessage,
    limits: MessageLimits,
}

impl NewMessageBuilder {
    /// Use this id instead of a fresh UUIDv7, for example one derived from an inbound
    /// message. Ids are unique per outbox: enqueueing an id that is already stored fails
    /// with [`ErrorKind::Conflict`](crate::ErrorKind::Conflict) and writes nothing, which
    /// is how a retried handler learns its earlier attempt already committed.
    pub fn id(mut self, id: MessageId) -> Self {
        self.msg.id = id;
        self
    }
    /// Messages sharing a partition key publish in enqueue order when the store keeps
    /// per-key order.
    pub fn partition_key(mut self, key: impl Into<String>) -> Self {
        self.msg.partition_key = Some(key.into());
        self
    }
    /// The payload.
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.msg.payload = payload.into();
        self
    }
    /// The payload's content type, such as `application/json`.
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.msg.content_type = Some(content_type.into());
        self
    }
    /// Add a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.msg.headers.insert(name, value);
        self
    }
    /// Replace all headers.
    pub fn headers(mut self, headers: Headers) -> Self {
        self.msg.headers = headers;
        self
    }
    /// Make the message claimable only this long after commit.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.msg.delay = delay;
        self
    }
    /// Validate against these limits instead of the defaults.
    pub fn limits(mut self, limits: MessageLimits) -> Self {
        self.limits = limits;
        self
    }
    /// Validate and build.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for an empty or
    /// oversize destination or partition key, an oversize payload, too many headers, a
    /// header name that is not a token, or a header value with control characters.
    pub fn build(self) -> Result<NewMessage> {
        self.limits.check(&self.msg)?;
        Ok(self.msg)
    }
}

/// A message as stored, returned by claims and dead-letter listings.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Message {
    /// The message id.
    pub id: MessageId,
    /// Where the message goes.
    pub destination: String,
    /// The ordering key, if any.
    pub partition_key: Option<String>,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// The payload's content type, if given.
    pub content_type: Option<String>,
    /// The headers.
    pub headers: Headers,
    /// When the enqueuing transaction wrote the message (storage clock).
    pub created_at: SystemTime,
    /// Claim attempts so far, counting the claim that returned this message.
    pub attempts: u32,
    /// The error recorded by the last failed attempt.
    pub last_error: Option<String>,
}

impl Message {
    /// Build a stored message (for backends decoding rows).
    #[allow(clippy::too_many_arguments)]
    pub fn from_parts(
        id: MessageId,
        destination: String,
        partition_key: Option<String>,
        payload: Vec<u8>,
        content_type: Option<String>,
        headers: Headers,
        created_at: SystemTime,
        attempts: u32,
        last_error: Option<String>,
    ) -> Self {
        Message {
            id,
            destination,
            partition_key,
            payload,
            content_type,
            headers,
            created_at,
            attempts,
            last_error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn kind(r: Result<NewMessage>) -> ErrorKind {
        r.unwrap_err().kind()
    }

    #[test]
    fn valid_message_builds() {
        let m = NewMessage::builder("a.b")
            .header("x-trace", "1")
            .payload(vec![1, 2])
            .build()
            .unwrap();
        assert_eq!(m.payload(), &[1, 2]);
        assert_eq!(m.headers().get("x-trace"), Some("1"));
        assert_eq!(m.id().as_uuid().get_version_num(), 7);
    }

    #[test]
    fn rejects_bad_destinations() {
        assert_eq!(
            kind(NewMessage::builder("").build()),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            kind(NewMessage::builder("  ").build()),
            ErrorKind::InvalidInput
        );
        let long = "d".repeat(256);
        assert_eq!(
            kind(NewMessage::builder(long).build()),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            kind(NewMessage::builder("a\nb").build()),
            ErrorKind::InvalidInput
        );
    }

    #[test]
    fn rejects_oversize_payload_with_configurable_limit() {
        let limits = MessageLimits::default().with_max_payload_bytes(4);
        let ok = NewMessage::builder("d")
            .payload(vec![0; 4])
            .limits(limits.clone());
        assert!(ok.build().is_ok());
        let big = NewMessage::builder("d").payload(vec![0; 5]).limits(limits);
        let err = big.build().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("payload of 5 bytes"), "{err}");
    }

    #[test]
    fn rejects_bad_headers() {
        for name in ["", "has space", "colon:", "é", &"n".repeat(129)] {
            let r = NewMessage::builder("d").header(name, "v").build();
            assert_eq!(kind(r), ErrorKind::InvalidInput, "name {name:?}");
        }
        let r = NewMessage::builder("d").header("ok", "line\nbreak").build();
        assert_eq!(kind(r), ErrorKind::InvalidInput);
        let r = NewMessage::builder("d")
            .header("ok", "v".repeat(4097))
            .build();
        assert_eq!(kind(r), ErrorKind::InvalidInput);
        let many: Headers = (0..65).map(|i| (format!("h{i}"), "v")).collect();
        assert_eq!(
            kind(NewMessage::builder("d").headers(many).build()),
            ErrorKind::InvalidInput
        );
        assert!(NewMessage::builder("d")
            .header("tab", "a\tb")
            .build()
            .is_ok());
    }

    #[test]
    fn message_id_round_trips_text() {
        let id = MessageId::new();
        assert_eq!(id.to_string().parse::<MessageId>().unwrap(), id);
        assert_eq!(
            "nope".parse::<MessageId>().unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }
}
