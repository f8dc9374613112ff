//! The message model: what a service enqueues ([`NewMessage`]) and what a relay claims
//! ([`Message`]).

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::{Error, Result};
pub use crate::headers::Headers;
pub use crate::limits::{MessageLimits, MAX_DELAY};
use crate::message_parts::MessageParts;

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
///
/// `Debug` shows the payload's size and the header names, never their contents: they
/// may hold personal data.
#[derive(Clone, PartialEq, Eq)]
pub struct NewMessage {
    id: MessageId,
    destination: String,
    partition_key: Option<String>,
    payload: Vec<u8>,
    content_type: Option<String>,
    headers: Headers,
    delay: Duration,
    /// The limits [`NewMessageBuilder::build`] checked the message against.
    checked_with: MessageLimits,
}

impl fmt::Debug for NewMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewMessage")
            .field("id", &self.id)
            .field("destination", &self.destination)
            .field("partition_key", &self.partition_key)
            .field("payload", &Redacted(self.payload.len()))
            .field("content_type", &self.content_type)
            .field("headers", &HeaderNames(&self.headers))
            .field("delay", &self.delay)
            .finish()
    }
}

/// Prints `<N bytes>` in place of a payload.
struct Redacted(usize);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes>", self.0)
    }
}

/// Prints header names only.
struct HeaderNames<'a>(&'a Headers);

impl fmt::Debug for HeaderNames<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.0.iter().map(|(k, _)| k))
            .finish()
    }
}

impl NewMessage {
    /// The limits the builder checked this message against.
    pub(crate) fn checked_with(&self) -> &MessageLimits {
        &self.checked_with
    }

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
                checked_with: MessageLimits::default(),
            },
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
#[must_use = "a builder does nothing until built"]
pub struct NewMessageBuilder {
    msg: NewMessage,
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
    /// Make the message claimable only this long after commit (at most [`MAX_DELAY`]).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.msg.delay = delay;
        self
    }
    /// Validate against these limits instead of the defaults.
    pub fn limits(mut self, limits: MessageLimits) -> Self {
        self.msg.checked_with = limits;
        self
    }
    /// Validate and build.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for an empty or
    /// oversize destination or partition key, an oversize payload, too many headers, a
    /// header name that is not a token, a header value with control characters, or a
    /// delay over [`MAX_DELAY`].
    ///
    /// # Trace context (feature `otel`)
    ///
    /// After the message validates, the current `tracing` span's OpenTelemetry context
    /// is written as the W3C headers `traceparent` and `tracestate`, unless the caller
    /// set either, and only while the headers still fit the limits (capture never makes
    /// a build fail). The `otel` module gives the rules and the bytes it takes.
    /// This is the one point every backend's `enqueue` goes through, since they all
    /// take built messages.
    pub fn build(self) -> Result<NewMessage> {
        let msg = self.msg;
        msg.checked_with.check_fields(&msg)?;
        #[cfg(feature = "otel")]
        let msg = {
            let mut msg = msg;
            crate::otel::capture_current(&mut msg.headers, &msg.checked_with);
            msg
        };
        Ok(msg)
    }
}

/// A message as stored, returned by claims and dead-letter listings.
///
/// `Debug` shows the payload's size and the header names, never their contents: they
/// may hold personal data.
#[derive(Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
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

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("id", &self.id)
            .field("destination", &self.destination)
            .field("partition_key", &self.partition_key)
            .field("payload", &Redacted(self.payload.len()))
            .field("content_type", &self.content_type)
            .field("headers", &HeaderNames(&self.headers))
            .field("created_at", &self.created_at)
            .field("attempts", &self.attempts)
            .field("last_error", &self.last_error)
            .finish()
    }
}

impl From<MessageParts> for Message {
    fn from(p: MessageParts) -> Self {
        Message {
            id: p.id,
            destination: p.destination,
            partition_key: p.partition_key,
            payload: p.payload,
            content_type: p.content_type,
            headers: p.headers,
            created_at: p.created_at,
            attempts: p.attempts,
            last_error: p.last_error,
        }
    }
}

impl Message {
    /// Whether a claimed row makes a message a relay may publish, by the same rules
    /// [`NewMessageBuilder::build`] applies under `limits`, plus an attempt count below
    /// [`MAX_ATTEMPTS`](crate::store::MAX_ATTEMPTS).
    ///
    /// Tables are written by other tools too (migrations, producers in other
    /// languages): a claim dead-letters a row that fails this check, with the reason,
    /// instead of publishing it.
    ///
    /// # Errors
    /// The reason, readable as a dead letter's `last_error`.
    pub fn check_stored(&self, limits: &MessageLimits) -> std::result::Result<(), String> {
        if self.attempts >= crate::bounds::MAX_ATTEMPTS {
            return Err(format!(
                "attempt count {} reached the limit of {}",
                self.attempts,
                crate::bounds::MAX_ATTEMPTS
            ));
        }
        limits
            .check_content(
                &self.destination,
                self.partition_key.as_deref(),
                self.payload.len(),
                self.content_type.as_deref(),
                &self.headers,
            )
            .map_err(|e| format!("stored message breaks the message rules: {}", e.message()))
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
    fn debug_never_prints_payloads_or_header_values() {
        let m = NewMessage::builder("users.updated")
            .header("x-email", "alice@example.com")
            .payload(b"secret personal data".to_vec())
            .build()
            .unwrap();
        let printed = format!("{m:?}");
        assert!(
            !printed.contains("secret") && !printed.contains("alice"),
            "{printed}"
        );
        assert!(
            printed.contains("<20 bytes>") && printed.contains("x-email"),
            "{printed}"
        );
        let stored = Message::from(MessageParts {
            id: m.id(),
            destination: m.destination().into(),
            partition_key: None,
            payload: m.payload().to_vec(),
            content_type: None,
            headers: m.headers().clone(),
            created_at: SystemTime::now(),
            attempts: 1,
            last_error: None,
        });
        let printed = format!("{stored:?}");
        assert!(
            !printed.contains("secret") && !printed.contains("alice"),
            "{printed}"
        );
        assert!(
            printed.contains("<20 bytes>") && printed.contains("x-email"),
            "{printed}"
        );
    }

    #[test]
    fn messages_are_checked_once_on_the_default_path_and_again_under_other_limits() {
        let big = NewMessage::builder("d")
            .payload(vec![0; 10])
            .build()
            .unwrap();
        MessageLimits::default().check(&big).unwrap();
        let strict = MessageLimits::default().with_max_payload_bytes(4);
        let err = strict.check(&big).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidInput,
            "stricter store limits still apply"
        );
        let built_strict = NewMessage::builder("d")
            .payload(vec![0; 4])
            .limits(strict.clone())
            .build()
            .unwrap();
        strict.check(&built_strict).unwrap();
        MessageLimits::default().check(&built_strict).unwrap();
    }

    #[test]
    fn delays_are_bounded_when_built() {
        NewMessage::builder("d").delay(MAX_DELAY).build().unwrap();
        let r = NewMessage::builder("d")
            .delay(MAX_DELAY + Duration::from_nanos(1))
            .build();
        assert_eq!(kind(r), ErrorKind::InvalidInput);
        assert_eq!(
            kind(NewMessage::builder("d").delay(Duration::MAX).build()),
            ErrorKind::InvalidInput
        );
    }

    fn stored(destination: &str, attempts: u32) -> Message {
        Message::from(MessageParts {
            id: MessageId::new(),
            destination: destination.into(),
            partition_key: None,
            payload: Vec::new(),
            content_type: None,
            headers: Headers::new(),
            created_at: SystemTime::now(),
            attempts,
            last_error: None,
        })
    }

    #[test]
    fn stored_rows_follow_the_same_rules() {
        let limits = MessageLimits::default();
        stored("ok", 1).check_stored(&limits).unwrap();
        stored("ok", crate::bounds::MAX_ATTEMPTS - 1)
            .check_stored(&limits)
            .unwrap();
        let saturated = stored("ok", crate::bounds::MAX_ATTEMPTS).check_stored(&limits);
        assert!(saturated.unwrap_err().contains("attempt count"));
        for bad in ["", "a\nb"] {
            let reason = stored(bad, 1).check_stored(&limits).unwrap_err();
            assert!(reason.contains("destination"), "{reason}");
        }
        let mut m = stored("ok", 1);
        m.content_type = Some("c".repeat(10_000));
        assert!(m
            .check_stored(&limits)
            .unwrap_err()
            .contains("content type"));
        let mut m = stored("ok", 1);
        m.partition_key = Some("k".repeat(10_000));
        assert!(m
            .check_stored(&limits)
            .unwrap_err()
            .contains("partition key"));
        let mut m = stored("ok", 1);
        m.headers.insert("bad\r\nname", "v");
        assert!(m.check_stored(&limits).unwrap_err().contains("header name"));
        let mut m = stored("ok", 1);
        m.payload = vec![0; 5];
        let small = MessageLimits::default().with_max_payload_bytes(4);
        assert!(m.check_stored(&small).unwrap_err().contains("payload"));
    }

    #[cfg(feature = "serde")]
    #[test]
    fn stored_messages_serialize() {
        let m = stored("d", 2);
        let text = serde_json::to_string(&m).unwrap();
        let back: Message = serde_json::from_str(&text).unwrap();
        assert_eq!(back, m);
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
