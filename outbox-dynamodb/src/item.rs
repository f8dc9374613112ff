//! Items: attribute names, keys, shards, clocks, sizes, and decoding items into messages
//! (the `row.rs` of the SQL backends).

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use outbox_core::backend::MessageParts;
use outbox_core::{Error, ErrorKind, Headers, Message, MessageId, Result};
use uuid::Uuid;

/// An item as the SDK carries it.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// DynamoDB's item size limit (400 KB, counted as 400 × 1024 bytes).
pub const MAX_ITEM_BYTES: usize = 400 * 1024;
/// Most actions in one `TransactWriteItems`.
pub const MAX_TRANSACTION_ACTIONS: usize = 100;
/// Most bytes of items in one `TransactWriteItems` (4 MB).
pub const MAX_TRANSACTION_BYTES: usize = 4 * 1024 * 1024;

/// `due = available_at_us * DUE_SCALE + seq`: one number ordering by availability,
/// then enqueue order. Both parts stay below 10^16 (the year 2286 in microseconds), so
/// `due` stays within DynamoDB's 38 significant digits.
pub(crate) const DUE_SCALE: u128 = 10_000_000_000_000_000;

// Attribute names of the outbox table.
pub(crate) const PK: &str = "pk";
pub(crate) const SK: &str = "sk";
pub(crate) const DESTINATION: &str = "destination";
pub(crate) const PARTITION_KEY: &str = "pkey";
pub(crate) const PAYLOAD: &str = "payload";
pub(crate) const CONTENT_TYPE: &str = "ctype";
pub(crate) const HEADERS: &str = "headers";
pub(crate) const CREATED: &str = "created_us";
pub(crate) const AVAILABLE: &str = "avail_us";
pub(crate) const SEQ: &str = "seq";
pub(crate) const ATTEMPTS: &str = "attempts";
pub(crate) const TOKEN: &str = "token";
pub(crate) const LAST_ERROR: &str = "last_error";
pub(crate) const DUE: &str = "due";
pub(crate) const DEAD_ID: &str = "dead_id";
pub(crate) const DEAD_AT: &str = "dead_us";
pub(crate) const DONE_AT: &str = "done_us";
pub(crate) const MARKED_ID: &str = "mid";

// Local secondary indexes of the outbox table.
pub(crate) const DUE_INDEX: &str = "due";
pub(crate) const DEAD_INDEX: &str = "dead";
pub(crate) const DONE_INDEX: &str = "done";

/// Stable 64-bit FNV-1a: shard numbers must not change between builds or processes.
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in *part {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// The shard (`0..shards`) of these bytes.
pub(crate) fn shard_of(parts: &[&[u8]], shards: u16) -> u16 {
    // The remainder is below `shards`, a u16.
    u16::try_from(fnv1a(parts) % u64::from(shards.max(1))).unwrap_or(0)
}

/// The partition of messages in shard `n`.
pub(crate) fn message_partition(n: u16) -> String {
    format!("q#{n:03}")
}

/// The partition of per-key order markers in shard `n`.
pub(crate) fn marker_partition(n: u16) -> String {
    format!("k#{n:03}")
}

/// The sort key prefix shared by every marker of `key`: its byte length makes the prefix
/// unambiguous whatever characters the key holds.
pub(crate) fn marker_prefix(key: &str) -> String {
    format!("{}:{key}#", key.len())
}

/// A message id as stored: the hyphenated lowercase UUID, which sorts like the id.
pub(crate) fn id_text(id: MessageId) -> String {
    id.as_uuid().hyphenated().to_string()
}

/// Microseconds since the Unix epoch, by this process's clock (DynamoDB has no clock
/// of its own to offer).
pub(crate) fn now_us() -> u64 {
    micros(SystemTime::now())
}

/// `t` in microseconds since the epoch (0 before it, saturating far in the future).
pub(crate) fn micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The time `us` microseconds after the epoch.
pub(crate) fn from_micros(us: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(us)
}

/// A duration in whole microseconds, saturating.
pub(crate) fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

pub(crate) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(crate) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub(crate) fn b(v: &[u8]) -> AttributeValue {
    AttributeValue::B(Blob::new(v.to_vec()))
}

/// The primary key of the message `id` in a table of `shards` shards.
pub(crate) fn message_key(id: MessageId, shards: u16) -> Item {
    let text = id_text(id);
    let shard = shard_of(&[text.as_bytes()], shards);
    HashMap::from([
        (PK.to_owned(), s(message_partition(shard))),
        (SK.to_owned(), s(text)),
    ])
}

/// The bytes DynamoDB counts for an item: attribute names plus values (strings and
/// binaries by length, numbers at most 21 bytes, containers with their overhead).
pub(crate) fn item_size(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(x) => x.len(),
        AttributeValue::B(x) => x.as_ref().len(),
        AttributeValue::N(x) => x.len() / 2 + 2,
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(x) => x.iter().map(String::len).sum(),
        AttributeValue::Ns(x) => x.iter().map(|n| n.len() / 2 + 2).sum(),
        AttributeValue::Bs(x) => x.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::L(x) => 3 + x.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        AttributeValue::M(x) => {
            3 + x
                .iter()
                .map(|(k, v)| 1 + k.len() + value_size(v))
                .sum::<usize>()
        }
        _ => 0,
    }
}

fn shape(what: &str) -> Error {
    Error::new(ErrorKind::Decode, format!("outbox item {what}"))
}

pub(crate) fn get_s<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name)
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
}

/// A number attribute, `None` when absent; an error when present but not a number
/// that fits.
pub(crate) fn get_n<T: std::str::FromStr>(item: &Item, name: &str) -> Result<Option<T>> {
    match item.get(name) {
        None => Ok(None),
        Some(AttributeValue::N(text)) => text
            .parse()
            .map(Some)
            .map_err(|_| shape(&format!("has {name} = {text}, out of range"))),
        Some(_) => Err(shape(&format!("has a {name} that is not a number"))),
    }
}

/// The id an item's sort key holds.
pub(crate) fn candidate_id(item: &Item) -> Option<MessageId> {
    get_s(item, SK)
        .and_then(|t| Uuid::parse_str(t).ok())
        .map(MessageId::from_uuid)
}

/// The `ExpressionAttributeNames` of `expressions`: every `#name` placeholder stands
/// for the attribute `name` (DynamoDB refuses names a request does not use).
pub(crate) fn names(expressions: &[&str]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for e in expressions {
        let bytes = e.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'#' {
                let start = i + 1;
                let mut end = start;
                while end < bytes.len()
                    && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_')
                {
                    end += 1;
                }
                if end > start {
                    out.insert(format!("#{}", &e[start..end]), e[start..end].to_owned());
                }
                i = end;
            } else {
                i += 1;
            }
        }
    }
    out
}

/// What a claim reads from the due index (or the item) before its conditional write.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub(crate) id: MessageId,
    pub(crate) due: u128,
    pub(crate) attempts: u64,
    pub(crate) key: Option<String>,
}

impl Candidate {
    pub(crate) fn seq(&self) -> u64 {
        u64::try_from(self.due % DUE_SCALE).unwrap_or(0)
    }
}

/// The candidate an index entry or item describes; `None` for a malformed one, which
/// the claim then cannot order (its shape is a schema problem).
pub(crate) fn candidate(item: &Item) -> Result<Candidate> {
    let id = get_s(item, SK)
        .and_then(|t| Uuid::parse_str(t).ok())
        .map(MessageId::from_uuid)
        .ok_or_else(|| shape("has no message id sort key"))?;
    let due = get_n::<u128>(item, DUE)?.ok_or_else(|| shape("has no due"))?;
    let attempts = get_n::<u64>(item, ATTEMPTS)?.unwrap_or(0);
    Ok(Candidate {
        id,
        due,
        attempts,
        key: get_s(item, PARTITION_KEY).map(str::to_owned),
    })
}

/// The message an item holds, or why it is not a valid one (the reason a claim
/// dead-letters it with).
pub(crate) fn decode_message(item: &Item) -> std::result::Result<Message, String> {
    let id = get_s(item, SK)
        .and_then(|t| Uuid::parse_str(t).ok())
        .map(MessageId::from_uuid)
        .ok_or("the id does not decode")?;
    let destination = get_s(item, DESTINATION)
        .ok_or("the destination is missing")?
        .to_owned();
    let payload = match item.get(PAYLOAD) {
        Some(AttributeValue::B(blob)) => blob.as_ref().to_vec(),
        None => Vec::new(),
        Some(_) => return Err("the payload is not binary".into()),
    };
    let headers = match get_s(item, HEADERS) {
        None => Headers::new(),
        Some(text) => {
            let json: serde_json::Value =
                serde_json::from_str(text).map_err(|e| format!("the headers are not JSON: {e}"))?;
            Headers::from_json(json).map_err(|e| format!("the headers do not decode: {e}"))?
        }
    };
    let number = |name: &str| get_n::<u64>(item, name).map_err(|e| e.message().to_owned());
    let created = number(CREATED)?.ok_or("created_us is missing")?;
    let attempts = number(ATTEMPTS)?.unwrap_or(0);
    let attempts =
        u32::try_from(attempts).map_err(|_| format!("attempts {attempts} is out of range"))?;
    Ok(Message::from(MessageParts {
        id,
        destination,
        partition_key: get_s(item, PARTITION_KEY).map(str::to_owned),
        payload,
        content_type: get_s(item, CONTENT_TYPE).map(str::to_owned),
        headers,
        created_at: from_micros(created),
        attempts,
        last_error: get_s(item, LAST_ERROR).map(str::to_owned),
    }))
}

/// What an operator can still read of a dead letter whose content does not decode.
pub(crate) fn decode_lossy(item: &Item) -> Option<Message> {
    if let Ok(m) = decode_message(item) {
        return Some(m);
    }
    let id = get_s(item, SK)
        .and_then(|t| Uuid::parse_str(t).ok())
        .map(MessageId::from_uuid)?;
    let headers = get_s(item, HEADERS)
        .and_then(|t| serde_json::from_str(t).ok())
        .map(Headers::from_json_lossy)
        .unwrap_or_default();
    let attempts = get_n::<u64>(item, ATTEMPTS).ok().flatten().unwrap_or(0);
    Some(Message::from(MessageParts {
        id,
        destination: get_s(item, DESTINATION).unwrap_or_default().to_owned(),
        partition_key: get_s(item, PARTITION_KEY).map(str::to_owned),
        payload: match item.get(PAYLOAD) {
            Some(AttributeValue::B(blob)) => blob.as_ref().to_vec(),
            _ => Vec::new(),
        },
        content_type: get_s(item, CONTENT_TYPE).map(str::to_owned),
        headers,
        created_at: from_micros(get_n::<u64>(item, CREATED).ok().flatten().unwrap_or(0)),
        attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
        last_error: get_s(item, LAST_ERROR).map(str::to_owned),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_stable_and_in_range() {
        // Pinned: a change here would strand messages stored by an earlier build.
        assert_eq!(fnv1a(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
        for shards in [1u16, 2, 16, 256] {
            for i in 0..100u32 {
                assert!(shard_of(&[&i.to_be_bytes()], shards) < shards);
            }
        }
        let id = MessageId::new();
        assert_eq!(message_key(id, 16), message_key(id, 16));
    }

    #[test]
    fn due_orders_by_availability_then_sequence() {
        let due = |avail: u128, seq: u128| avail * DUE_SCALE + seq;
        assert!(due(1, 9_999_999_999_999_999) < due(2, 0));
        assert!(due(5, 1) < due(5, 2));
        let far = due(9_999_999_999_999_999, 9_999_999_999_999_999);
        assert!(far.to_string().len() <= 38, "fits DynamoDB numbers");
        let c = Candidate {
            id: MessageId::new(),
            due: due(7, 42),
            attempts: 0,
            key: None,
        };
        assert_eq!(c.seq(), 42);
    }

    #[test]
    fn placeholders_name_their_attributes() {
        let got = names(&["SET #avail_us = :a REMOVE #token", "attribute_exists(#due)"]);
        assert_eq!(got.len(), 3);
        assert_eq!(got["#avail_us"], "avail_us");
        assert_eq!(got["#due"], "due");
    }

    #[test]
    fn marker_prefixes_do_not_overlap() {
        assert_ne!(
            marker_prefix("a"),
            marker_prefix("a#b")[..marker_prefix("a").len()]
        );
        assert!(!marker_prefix("a#1").starts_with(&marker_prefix("a")));
    }

    #[test]
    fn sizes_count_names_and_values() {
        let item: Item = HashMap::from([
            ("ab".to_owned(), s("xyz")),
            ("p".to_owned(), b(&[0; 10])),
            ("n".to_owned(), n(12345)),
        ]);
        assert_eq!(item_size(&item), 2 + 3 + 1 + 10 + 1 + 4);
    }

    #[test]
    fn malformed_items_give_reasons() {
        let id = MessageId::new();
        let mut item: Item = HashMap::from([
            (SK.to_owned(), s(id_text(id))),
            (DESTINATION.to_owned(), s("d")),
            (CREATED.to_owned(), n(5)),
            (HEADERS.to_owned(), s("[1]")),
        ]);
        let reason = decode_message(&item).unwrap_err();
        assert!(reason.contains("headers"), "{reason}");
        let lossy = decode_lossy(&item).unwrap();
        assert_eq!(lossy.id, id);
        item.insert(HEADERS.to_owned(), s("{\"a\":\"b\"}"));
        item.insert(ATTEMPTS.to_owned(), n(u64::MAX));
        assert!(decode_message(&item).unwrap_err().contains("attempts"));
        item.insert(ATTEMPTS.to_owned(), n(2));
        let m = decode_message(&item).unwrap();
        assert_eq!((m.attempts, m.headers.get("a")), (2, Some("b")));
    }
}
