//! The entity side of the decoupled algorithm: [`EntityStore`] and what it stores.

use std::collections::BTreeMap;
use std::fmt;
use std::time::SystemTime;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::message::{Headers, Message, MessageId, NewMessage};
use crate::message_parts::MessageParts;
use crate::names::EntityKey;

/// The version of a stored entity, for the optimistic concurrency check of
/// [`EntityStore::persist`]. Every successful persist gives the entity a version it
/// never had before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Version(u64);

impl Version {
    /// The version numbered `n`.
    pub fn new(n: u64) -> Self {
        Version(n)
    }

    /// Its number.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The version after this one.
    ///
    /// # Errors
    /// [`ErrorKind::Conflict`](crate::ErrorKind::Conflict) at `u64::MAX`: the entity
    /// cannot be written again.
    pub fn next(self) -> Result<Version> {
        self.0
            .checked_add(1)
            .map(Version)
            .ok_or_else(|| Error::new(crate::ErrorKind::Conflict, "entity version overflow"))
    }
}

/// An outgoing message kept in an entity's outbox state until it is known to be
/// dispatched: everything needed to publish it again, with the same id.
///
/// `Debug` shows the payload's size only: it may hold personal data.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutgoingMessage {
    /// Fixed when the handler ran: a re-dispatch after a crash repeats it, so brokers
    /// and downstream consumers drop the repeat.
    pub id: MessageId,
    /// Where it goes.
    pub destination: String,
    /// Partition / ordering key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_key: Option<String>,
    /// MIME type of the payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Headers.
    #[serde(default, skip_serializing_if = "Headers::is_empty")]
    pub headers: Headers,
    /// The body (base64 in JSON).
    #[serde(with = "base64_bytes")]
    pub payload: Vec<u8>,
    /// When the handler produced it.
    pub created_at: SystemTime,
}

impl fmt::Debug for OutgoingMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutgoingMessage")
            .field("id", &self.id)
            .field("destination", &self.destination)
            .field("partition_key", &self.partition_key)
            .field("payload", &format_args!("<{} bytes>", self.payload.len()))
            .finish_non_exhaustive()
    }
}

impl OutgoingMessage {
    /// The message a handler produced, as it will be stored and published.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when the message has
    /// a delay: it is published straight to the broker, which cannot hold it back.
    pub fn from_new(message: &NewMessage, created_at: SystemTime) -> Result<Self> {
        if !message.delay().is_zero() {
            return Err(Error::invalid_input(format!(
                "message {} has a delay of {:?}; messages a consumer sends are published at \
                 once, so they cannot be delayed",
                message.id(),
                message.delay()
            )));
        }
        Ok(OutgoingMessage {
            id: message.id(),
            destination: message.destination().to_owned(),
            partition_key: message.partition_key().map(str::to_owned),
            content_type: message.content_type().map(str::to_owned),
            headers: message.headers().clone(),
            payload: message.payload().to_vec(),
            created_at,
        })
    }

    /// The message to hand to a [`Publisher`](crate::Publisher).
    pub fn to_message(&self) -> Message {
        Message::from(MessageParts {
            id: self.id,
            destination: self.destination.clone(),
            partition_key: self.partition_key.clone(),
            payload: self.payload.clone(),
            content_type: self.content_type.clone(),
            headers: self.headers.clone(),
            created_at: self.created_at,
            attempts: 0,
            last_error: None,
        })
    }
}

mod base64_bytes {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

/// What an [`EntityStore`] keeps for one entity.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EntityRecord {
    /// The business state: the consumer's state type as JSON (`null` before the first
    /// message).
    pub state: serde_json::Value,
    /// The outbox state: outgoing messages not yet known to be dispatched, keyed by the
    /// incoming message id whose handler produced them. Empty between messages, unless
    /// a crash left a finished message's entry; the next cleanup of the entity removes
    /// it.
    #[serde(default)]
    pub outbox: BTreeMap<MessageId, Vec<OutgoingMessage>>,
}

/// An entity as loaded: its record and the version to pass back to
/// [`EntityStore::persist`].
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The stored record.
    pub record: EntityRecord,
    /// Its version.
    pub version: Version,
}

/// The result of a conditional [`EntityStore::persist`]. A conflict is a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Persisted {
    /// Written; the entity now has this version.
    Stored(Version),
    /// Not written: the entity is not at the expected version (another writer got
    /// there first, or it already exists when `None` was expected).
    Conflict,
}

/// Stores entities (business state plus outbox state) with optimistic concurrency,
/// for [`DecoupledConsumer`](super::DecoupledConsumer).
///
/// # Contract
///
/// - `load` returns the entity's latest record and version, or `None` when it was
///   never stored. A read may be stale only if every write based on it then fails the
///   check below; the algorithm relies on that check, not on fresh reads.
/// - `persist(key, expected, record)` is one atomic conditional write. With
///   `expected = None` it creates the entity only if it does not exist; with
///   `Some(v)` it replaces the record only if the stored version is `v`. Otherwise it
///   changes nothing and returns [`Persisted::Conflict`]. Of any number of concurrent
///   persists with the same `expected`, at most one returns [`Persisted::Stored`].
/// - A stored entity gets a version it never had before, and `load` returns it from
///   then on.
/// - Where the store has a size limit (DynamoDB's 400 KB item), a record over it is
///   refused with [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) before
///   anything is written.
/// - A conflict is never an error: a store whose write can fail with a serialization
///   error under concurrency (PostgreSQL at REPEATABLE READ) reports it as
///   [`Persisted::Conflict`].
/// - Entities are never deleted behind the store's back while messages may still
///   arrive for them: a re-created entity would start its versions over.
/// - Keys arrive validated ([`EntityKey`]).
#[async_trait]
pub trait EntityStore: Send + Sync + fmt::Debug {
    /// The entity stored under `key`.
    async fn load(&self, key: &EntityKey) -> Result<Option<Loaded>>;

    /// Write `record` under `key` if the entity is at `expected`; see the contract.
    async fn persist(
        &self,
        key: &EntityKey,
        expected: Option<Version>,
        record: &EntityRecord,
    ) -> Result<Persisted>;
}

#[async_trait]
impl<E: EntityStore + ?Sized> EntityStore for std::sync::Arc<E> {
    async fn load(&self, key: &EntityKey) -> Result<Option<Loaded>> {
        (**self).load(key).await
    }

    async fn persist(
        &self,
        key: &EntityKey,
        expected: Option<Version>,
        record: &EntityRecord,
    ) -> Result<Persisted> {
        (**self).persist(key, expected, record).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn outgoing_messages_round_trip_through_json_with_their_ids() {
        let new = NewMessage::builder("orders.paid")
            .partition_key("o-1")
            .content_type("application/json")
            .header("x-a", "b")
            .payload(vec![0, 1, 2, 255])
            .build()
            .unwrap();
        let out = OutgoingMessage::from_new(&new, SystemTime::UNIX_EPOCH).unwrap();
        let mut record = EntityRecord::default();
        record.outbox.insert(MessageId::new(), vec![out.clone()]);
        let json = serde_json::to_string(&record).unwrap();
        assert!(json.contains("\"AAEC/w==\""), "payload as base64: {json}");
        let back: EntityRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, record);
        let msg = out.to_message();
        assert_eq!(msg.id, new.id());
        assert_eq!(msg.payload, new.payload());
        assert_eq!(msg.headers.get("x-a"), Some("b"));
        let debug = format!("{out:?}");
        // The bytes are not shown. (Not `!contains("255")`: the random id in the same
        // output contains "255" in about one run in 150.)
        assert!(
            debug.contains("<4 bytes>") && !debug.contains("0, 1, 2, 255"),
            "{debug}"
        );
    }

    #[test]
    fn delayed_messages_are_refused_and_versions_do_not_wrap() {
        let delayed = NewMessage::builder("t")
            .delay(Duration::from_secs(1))
            .build()
            .unwrap();
        let err = OutgoingMessage::from_new(&delayed, SystemTime::now()).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidInput);
        assert_eq!(Version::new(1).next().unwrap(), Version::new(2));
        assert_eq!(Version::new(7).get(), 7);
        assert!(Version::new(u64::MAX).next().is_err());
    }
}
