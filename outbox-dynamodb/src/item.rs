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
pub type Item = HashMap<String, AttributeValue>;

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
/// The state item's shard (`q#<n>`): the partition key of the three global indexes.
pub(crate) const SHARD: &str = "shard";
/// How many body items a message has (state item).
pub(crate) const PARTS: &str = "parts";
/// The body items' time to live, epoch seconds (the table's TTL attribute).
pub(crate) const TTL: &str = "ttl";
/// The body items' time to live as last written by this crate, epoch seconds, kept on
/// the state item (not projected into any index), so renewals can be decided without
/// reading the body.
pub(crate) const BODY_EXP: &str = "body_exp";
/// The sort key of a message's state item.
pub(crate) const STATE_SK: &str = "s";

// Global secondary indexes of the outbox table (all keyed by `shard`).
pub(crate) const DUE_INDEX: &str = "due";
pub(crate) const DEAD_INDEX: &str = "dead";
pub(crate) const DONE_INDEX: &str = "done";

/// Most payload bytes one body item carries; a longer payload is split over several
/// body items (the split layout), each well under the 400 KB item limit.
pub const PART_BYTES: usize = 300 * 1024;

/// Room a body item keeps for what is not payload, headers or content type: its key,
/// attribute names and time to live (about 100 bytes), with margin.
const BODY_ITEM_OVERHEAD: usize = 1024;

/// `payload` split into the payloads of the body items: one part when it is empty,
/// otherwise parts of [`PART_BYTES`], except that the first, which also carries
/// `first_extra` bytes (the headers and content type), is made smaller when both would
/// not fit one item. So large headers never refuse a message the split can carry.
pub fn body_parts(payload: &[u8], first_extra: usize) -> Vec<&[u8]> {
    if payload.is_empty() {
        return vec![payload];
    }
    let room = MAX_ITEM_BYTES.saturating_sub(BODY_ITEM_OVERHEAD + first_extra);
    let first = PART_BYTES.min(room).max(1).min(payload.len());
    let (head, rest) = payload.split_at(first);
    let mut parts = vec![head];
    parts.extend(rest.chunks(PART_BYTES));
    parts
}

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
pub fn now_us() -> u64 {
    micros(SystemTime::now())
}

/// `t` in microseconds since the epoch (0 before it, saturating far in the future).
pub fn micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The time `us` microseconds after the epoch.
pub fn from_micros(us: u64) -> SystemTime {
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

/// The partition key of every item of message `id`: `m#<id>`.
pub(crate) fn message_pk(id: MessageId) -> String {
    format!("m#{}", id_text(id))
}

/// The primary key of message `id`'s state item.
pub(crate) fn state_key(id: MessageId) -> Item {
    HashMap::from([
        (PK.to_owned(), s(message_pk(id))),
        (SK.to_owned(), s(STATE_SK)),
    ])
}

/// The sort key of body item `part` (`b#000`, `b#001`, ...).
pub(crate) fn body_sk(part: usize) -> String {
    format!("b#{part:03}")
}

/// The primary key of body item `part` of message `id`.
pub(crate) fn body_key(id: MessageId, part: usize) -> Item {
    HashMap::from([
        (PK.to_owned(), s(message_pk(id))),
        (SK.to_owned(), s(body_sk(part))),
    ])
}

/// The shard (`q#<n>`) message `id` is discovered in.
pub(crate) fn shard_value(id: MessageId, shards: u16) -> String {
    message_partition(shard_of(&[id_text(id).as_bytes()], shards))
}

/// The bytes DynamoDB counts for an item: attribute names plus values (strings and
/// binaries by length, numbers at most 21 bytes, containers with their overhead).
pub fn item_size(item: &Item) -> usize {
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

/// The id an item's partition key (`m#<id>`) holds.
pub(crate) fn candidate_id(item: &Item) -> Option<MessageId> {
    get_s(item, PK)
        .and_then(|t| t.strip_prefix("m#"))
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
    /// The shard the entry was found in (its `shard` attribute), when it names one.
    pub(crate) shard: Option<u16>,
    /// Why a projected attribute does not decode (a planted or corrupted item): the
    /// claim then takes the message without counting an attempt and dead-letters it.
    pub(crate) malformed: Option<String>,
}

impl Candidate {
    pub(crate) fn seq(&self) -> u64 {
        u64::try_from(self.due % DUE_SCALE).unwrap_or(0)
    }
}

/// The candidate an index entry or item describes. An entry without a message id or a
/// `due` is an error (nothing can take it: it is not a message); one whose other
/// attributes do not decode is a candidate marked [`malformed`](Candidate::malformed).
pub(crate) fn candidate(item: &Item) -> Result<Candidate> {
    let id = candidate_id(item).ok_or_else(|| shape("has no message id partition key"))?;
    let due = get_n::<u128>(item, DUE)?.ok_or_else(|| shape("has no due"))?;
    let mut malformed = None;
    let attempts = get_n::<u64>(item, ATTEMPTS).unwrap_or_else(|e| {
        malformed = Some(e.message().to_owned());
        None
    });
    let key = match item.get(PARTITION_KEY) {
        None => None,
        Some(AttributeValue::S(key)) => Some(key.clone()),
        Some(_) => {
            malformed = Some(format!(
                "the state item has a {PARTITION_KEY} that is not a string"
            ));
            None
        }
    };
    Ok(Candidate {
        id,
        due,
        attempts: attempts.unwrap_or(0),
        key,
        shard: get_s(item, SHARD)
            .and_then(|v| v.strip_prefix("q#"))
            .and_then(|v| v.parse().ok()),
        malformed,
    })
}

/// The payload of a message's body items, in part order, or why it does not decode.
fn payload_of(state: &Item, body: &[Item]) -> std::result::Result<Vec<u8>, String> {
    let parts = get_n::<usize>(state, PARTS)
        .map_err(|e| e.message().to_owned())?
        .unwrap_or(1);
    if body.is_empty() {
        return Err("the body is missing (deleted, or removed by its time to live)".into());
    }
    if body.len() != parts {
        return Err(format!("the body has {} of its {parts} parts", body.len()));
    }
    let mut payload = Vec::new();
    for (i, part) in body.iter().enumerate() {
        if get_s(part, SK) != Some(body_sk(i).as_str()) {
            return Err(format!("body part {i} is missing"));
        }
        match part.get(PAYLOAD) {
            Some(AttributeValue::B(blob)) => payload.extend_from_slice(blob.as_ref()),
            None => {}
            Some(_) => return Err("the payload is not binary".into()),
        }
    }
    Ok(payload)
}

/// The message a state item and its body items (sorted by sort key) hold, or why they
/// do not make a valid one (the reason a claim dead-letters it with).
pub(crate) fn decode_message(state: &Item, body: &[Item]) -> std::result::Result<Message, String> {
    let id = candidate_id(state).ok_or("the id does not decode")?;
    let payload = payload_of(state, body)?;
    let first = &body[0];
    let destination = get_s(state, DESTINATION)
        .or_else(|| get_s(first, DESTINATION))
        .ok_or("the destination is missing")?
        .to_owned();
    let headers = match get_s(first, HEADERS) {
        None => Headers::new(),
        Some(text) => {
            let json: serde_json::Value =
                serde_json::from_str(text).map_err(|e| format!("the headers are not JSON: {e}"))?;
            Headers::from_json(json).map_err(|e| format!("the headers do not decode: {e}"))?
        }
    };
    let number = |name: &str| get_n::<u64>(state, name).map_err(|e| e.message().to_owned());
    let created = number(CREATED)?.ok_or("created_us is missing")?;
    let attempts = number(ATTEMPTS)?.unwrap_or(0);
    let attempts =
        u32::try_from(attempts).map_err(|_| format!("attempts {attempts} is out of range"))?;
    Ok(Message::from(MessageParts {
        id,
        destination,
        partition_key: get_s(state, PARTITION_KEY).map(str::to_owned),
        payload,
        content_type: get_s(first, CONTENT_TYPE).map(str::to_owned),
        headers,
        created_at: from_micros(created),
        attempts,
        last_error: get_s(state, LAST_ERROR).map(str::to_owned),
    }))
}

/// What an operator can still read of a dead letter whose content does not decode (or
/// whose body was not read: `body` empty).
pub(crate) fn decode_lossy(state: &Item, body: &[Item]) -> Option<Message> {
    if let Ok(m) = decode_message(state, body) {
        return Some(m);
    }
    let id = candidate_id(state)?;
    let first = body.first();
    let headers = first
        .and_then(|f| get_s(f, HEADERS))
        .and_then(|t| serde_json::from_str(t).ok())
        .map(Headers::from_json_lossy)
        .unwrap_or_default();
    let attempts = get_n::<u64>(state, ATTEMPTS).ok().flatten().unwrap_or(0);
    Some(Message::from(MessageParts {
        id,
        destination: get_s(state, DESTINATION)
            .or_else(|| first.and_then(|f| get_s(f, DESTINATION)))
            .unwrap_or_default()
            .to_owned(),
        partition_key: get_s(state, PARTITION_KEY).map(str::to_owned),
        payload: payload_of(state, body).unwrap_or_default(),
        content_type: first
            .and_then(|f| get_s(f, CONTENT_TYPE))
            .map(str::to_owned),
        headers,
        created_at: from_micros(get_n::<u64>(state, CREATED).ok().flatten().unwrap_or(0)),
        attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
        last_error: get_s(state, LAST_ERROR).map(str::to_owned),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_split_into_parts_of_300_kib_the_first_smaller_under_large_headers() {
        let lens = |payload: &[u8], extra| -> Vec<usize> {
            body_parts(payload, extra).iter().map(|p| p.len()).collect()
        };
        assert_eq!(lens(&[], 0), vec![0]);
        assert_eq!(lens(&[1; 10], 0), vec![10]);
        assert_eq!(lens(&[1; PART_BYTES], 50_000), vec![PART_BYTES]);
        let large = vec![1u8; 2 * PART_BYTES + 5];
        assert_eq!(lens(&large, 0), vec![PART_BYTES, PART_BYTES, 5]);
        // Headers leaving less than a part's room: the first part shrinks to fit.
        let extra = 150_000;
        let room = MAX_ITEM_BYTES - BODY_ITEM_OVERHEAD - extra;
        assert_eq!(
            lens(&large, extra),
            vec![room, PART_BYTES, PART_BYTES + 5 - room]
        );
        // Exactly at the edge: nothing to shrink.
        let edge = MAX_ITEM_BYTES - BODY_ITEM_OVERHEAD - PART_BYTES;
        assert_eq!(lens(&large, edge), vec![PART_BYTES, PART_BYTES, 5]);
        assert_eq!(lens(&large, edge + 1)[0], PART_BYTES - 1);
        // Headers filling the whole item still give a part of one byte (the item check
        // refuses the message), never an empty one that would loop.
        assert_eq!(lens(&[1; 3], MAX_ITEM_BYTES)[0], 1);
        assert_eq!(body_parts(&large, extra).concat(), large);
    }

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
        assert_eq!(shard_value(id, 16), shard_value(id, 16));
        assert_eq!(candidate_id(&state_key(id)), Some(id));
        assert_eq!(candidate_id(&body_key(id, 2)), Some(id));
        assert_eq!(body_sk(2), "b#002");
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
            shard: None,
            malformed: None,
        };
        assert_eq!(c.seq(), 42);
    }

    #[test]
    fn malformed_projected_attributes_make_a_malformed_candidate_not_an_error() {
        let id = MessageId::new();
        let mut entry = state_key(id);
        entry.insert(DUE.into(), n(7));
        entry.insert(SHARD.into(), s("q#012"));
        entry.insert(ATTEMPTS.into(), n(2));
        entry.insert(PARTITION_KEY.into(), s("k"));
        let c = candidate(&entry).unwrap();
        assert_eq!((c.id, c.due, c.attempts), (id, 7, 2));
        assert_eq!(
            (c.key.as_deref(), c.shard, c.malformed),
            (Some("k"), Some(12), None)
        );
        let mut planted = entry.clone();
        planted.insert(ATTEMPTS.into(), s("two"));
        let c = candidate(&planted).unwrap();
        assert!(c.malformed.unwrap().contains("attempts"));
        let mut planted = entry.clone();
        planted.insert(PARTITION_KEY.into(), n(3));
        let c = candidate(&planted).unwrap();
        assert!(c.malformed.unwrap().contains(PARTITION_KEY));
        assert_eq!(c.key, None);
        // Not a message at all: no id, or no due.
        let mut junk = entry.clone();
        junk.insert(PK.into(), s("x"));
        assert!(candidate(&junk).is_err());
        entry.remove(DUE);
        assert!(candidate(&entry).is_err());
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
        let mut state = state_key(id);
        state.insert(DESTINATION.to_owned(), s("d"));
        state.insert(CREATED.to_owned(), n(5));
        let mut first = body_key(id, 0);
        first.insert(HEADERS.to_owned(), s("[1]"));
        first.insert(PAYLOAD.to_owned(), b(b"ab"));
        let reason = decode_message(&state, std::slice::from_ref(&first)).unwrap_err();
        assert!(reason.contains("headers"), "{reason}");
        let lossy = decode_lossy(&state, std::slice::from_ref(&first)).unwrap();
        assert_eq!(lossy.id, id);
        assert!(decode_message(&state, &[]).unwrap_err().contains("body"));
        first.insert(HEADERS.to_owned(), s("{\"a\":\"b\"}"));
        state.insert(ATTEMPTS.to_owned(), n(u64::MAX));
        let body = [first.clone()];
        assert!(decode_message(&state, &body)
            .unwrap_err()
            .contains("attempts"));
        state.insert(ATTEMPTS.to_owned(), n(2));
        let m = decode_message(&state, &body).unwrap();
        assert_eq!((m.attempts, m.headers.get("a")), (2, Some("b")));
        // The split layout: parts join in order; a missing part is a reason.
        state.insert(PARTS.to_owned(), n(2));
        assert!(decode_message(&state, &body).unwrap_err().contains("parts"));
        let mut second = body_key(id, 1);
        second.insert(PAYLOAD.to_owned(), b(b"cd"));
        let m = decode_message(&state, &[first, second]).unwrap();
        assert_eq!(m.payload, b"abcd");
    }
}
