//! The message table's items: attribute names, keys, encoding a message into its
//! immutable items and decoding them back.
//!
//! | item | `pk` | `sk` | attributes |
//! |---|---|---|---|
//! | message, part 0 | `m#<id>` | `p#000` | `dest`, `pkey`, `ctype`, `headers`, `created_us`, `parts`, `payload`, `ttl` |
//! | message, part n | `m#<id>` | `p#<n>` (3 digits) | `payload`, `ttl` |
//! | dead letter | `dead` | `<dead_us, 20 digits>#<id>` | `id`, `dest`, `reason`, `attempts`, `shard`, `seq` |
//!
//! A payload past 300 KiB is split over parts, as `outbox-dynamodb` splits bodies, so
//! no item passes DynamoDB's 400 KB limit; the relay publishes on part 0's record and
//! reads the other parts from the table.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use outbox_core::backend::MessageParts;
use outbox_core::{Error, Headers, Message, MessageId, NewMessage, Result};
use outbox_dynamodb::kit::{body_parts, item_size, Item};
pub(crate) use outbox_dynamodb::kit::{from_micros, micros, now_us};
use outbox_dynamodb::MAX_ITEM_BYTES;
use uuid::Uuid;

pub(crate) const PK: &str = "pk";
pub(crate) const SK: &str = "sk";
pub(crate) const DESTINATION: &str = "dest";
pub(crate) const PARTITION_KEY: &str = "pkey";
pub(crate) const CONTENT_TYPE: &str = "ctype";
pub(crate) const HEADERS: &str = "headers";
pub(crate) const CREATED: &str = "created_us";
pub(crate) const PARTS: &str = "parts";
pub(crate) const PAYLOAD: &str = "payload";
/// The message items' time to live, epoch seconds (the table's TTL attribute).
pub(crate) const TTL: &str = "ttl";

/// The partition of dead letters.
pub(crate) const DEAD_PK: &str = "dead";
pub(crate) const DEAD_ID: &str = "id";
pub(crate) const REASON: &str = "reason";
pub(crate) const ATTEMPTS: &str = "attempts";
pub(crate) const DEAD_SHARD: &str = "shard";
pub(crate) const DEAD_SEQ: &str = "seq";

/// Room part 0 keeps for its key, attribute names, numbers and time to live.
const ITEM_OVERHEAD: usize = 256;

/// The id as stored: the hyphenated lowercase UUID.
pub(crate) fn id_text(id: MessageId) -> String {
    id.as_uuid().hyphenated().to_string()
}

/// The partition key of every item of message `id`.
pub(crate) fn message_pk(id: MessageId) -> String {
    format!("m#{}", id_text(id))
}

/// The sort key of part `n`.
pub(crate) fn part_sk(n: usize) -> String {
    format!("p#{n:03}")
}

/// The sort key of part 0, the item whose stream record publishes the message.
pub(crate) const FIRST_PART: &str = "p#000";

/// The sort key of a dead letter written at `dead_us` for `id`: they list in the order
/// they were written.
pub(crate) fn dead_sk(dead_us: u64, id: MessageId) -> String {
    format!("{dead_us:020}#{}", id_text(id))
}

pub(crate) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(crate) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub(crate) fn get_s<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name)
        .and_then(|v| v.as_s().ok())
        .map(String::as_str)
}

/// A number attribute that parses as `T`; `None` when absent or malformed.
pub(crate) fn get_n<T: std::str::FromStr>(item: &Item, name: &str) -> Option<T> {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|t| t.parse().ok())
}

/// The id a message item's partition key (`m#<id>`) holds.
pub(crate) fn message_id(item: &Item) -> Option<MessageId> {
    get_s(item, PK)
        .and_then(|t| t.strip_prefix("m#"))
        .and_then(|t| Uuid::parse_str(t).ok())
        .map(MessageId::from_uuid)
}

/// The items that store `m`, enqueued at `now_us`, expiring `ttl` later: part 0 with
/// the message's fields and the first chunk of its payload, then one item per further
/// 300 KiB.
///
/// # Errors
/// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) for an item over
/// [`MAX_ITEM_BYTES`] (headers too large to share an item with any payload).
pub(crate) fn message_items(m: &NewMessage, now_us: u64, ttl: Duration) -> Result<Vec<Item>> {
    let headers = m.headers().to_json().to_string();
    let fields = headers.len()
        + m.destination().len()
        + m.partition_key().map_or(0, str::len)
        + m.content_type().map_or(0, str::len)
        + ITEM_OVERHEAD;
    let chunks = body_parts(m.payload(), fields);
    let expires = (now_us / 1_000_000).saturating_add(ttl.as_secs());
    let pk = message_pk(m.id());
    let mut items = Vec::with_capacity(chunks.len());
    for (i, chunk) in chunks.iter().enumerate() {
        let mut item: Item = HashMap::from([
            (PK.to_owned(), s(&pk)),
            (SK.to_owned(), s(part_sk(i))),
            (
                PAYLOAD.to_owned(),
                AttributeValue::B(Blob::new(chunk.to_vec())),
            ),
            (TTL.to_owned(), n(expires)),
        ]);
        if i == 0 {
            item.insert(DESTINATION.into(), s(m.destination()));
            item.insert(HEADERS.into(), s(&headers));
            item.insert(CREATED.into(), n(now_us));
            item.insert(PARTS.into(), n(chunks.len()));
            if let Some(key) = m.partition_key() {
                item.insert(PARTITION_KEY.into(), s(key));
            }
            if let Some(ct) = m.content_type() {
                item.insert(CONTENT_TYPE.into(), s(ct));
            }
        }
        let size = item_size(&item);
        if size > MAX_ITEM_BYTES {
            return Err(Error::invalid_input(format!(
                "message {} makes an item of {size} bytes, over DynamoDB's item limit of \
                 {MAX_ITEM_BYTES}; keep headers small and store large bodies elsewhere (S3) \
                 with a reference in the message",
                m.id()
            )));
        }
        items.push(item);
    }
    Ok(items)
}

/// How many parts the message whose part 0 is `first` has (1 when not recorded).
pub(crate) fn parts_of(first: &Item) -> usize {
    get_n::<usize>(first, PARTS).unwrap_or(1).max(1)
}

/// The message part 0 (`first`) and the other parts (`rest`, in part order) hold, or
/// why they do not make one (the reason it is dead-lettered with).
pub(crate) fn decode_message(first: &Item, rest: &[Item]) -> std::result::Result<Message, String> {
    let id = message_id(first).ok_or("the id does not decode")?;
    let parts = parts_of(first);
    if rest.len() + 1 != parts {
        return Err(format!(
            "the message has {} of its {parts} parts",
            rest.len() + 1
        ));
    }
    let mut payload = Vec::new();
    for (i, part) in std::iter::once(first).chain(rest).enumerate() {
        if get_s(part, SK) != Some(part_sk(i).as_str()) {
            return Err(format!("part {i} is missing"));
        }
        match part.get(PAYLOAD) {
            Some(AttributeValue::B(blob)) => payload.extend_from_slice(blob.as_ref()),
            None => {}
            Some(_) => return Err(format!("part {i}'s payload is not binary")),
        }
    }
    let destination = get_s(first, DESTINATION)
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
    let created = get_n::<u64>(first, CREATED).ok_or("created_us is missing or malformed")?;
    Ok(Message::from(MessageParts {
        id,
        destination,
        partition_key: get_s(first, PARTITION_KEY).map(str::to_owned),
        payload,
        content_type: get_s(first, CONTENT_TYPE).map(str::to_owned),
        headers,
        created_at: from_micros(created),
        attempts: 0,
        last_error: None,
    }))
}

/// An attribute value of a stream record as the DynamoDB client's type (the two SDKs
/// have one type each for the same JSON shape), moved, not copied.
pub(crate) fn from_stream(v: aws_sdk_dynamodbstreams::types::AttributeValue) -> AttributeValue {
    use aws_sdk_dynamodbstreams::types::AttributeValue as V;
    match v {
        V::S(x) => AttributeValue::S(x),
        V::N(x) => AttributeValue::N(x),
        V::B(x) => AttributeValue::B(Blob::new(x.into_inner())),
        V::Bool(x) => AttributeValue::Bool(x),
        V::Null(x) => AttributeValue::Null(x),
        V::Ss(x) => AttributeValue::Ss(x),
        V::Ns(x) => AttributeValue::Ns(x),
        V::Bs(x) => AttributeValue::Bs(x.into_iter().map(|b| Blob::new(b.into_inner())).collect()),
        V::L(x) => AttributeValue::L(x.into_iter().map(from_stream).collect()),
        V::M(x) => AttributeValue::M(x.into_iter().map(|(k, v)| (k, from_stream(v))).collect()),
        // A type this SDK does not know: kept as null, which decodes as malformed.
        _ => AttributeValue::Null(true),
    }
}

/// A stream record's image as an item.
pub(crate) fn item_from_stream(
    image: HashMap<String, aws_sdk_dynamodbstreams::types::AttributeValue>,
) -> Item {
    image
        .into_iter()
        .map(|(k, v)| (k, from_stream(v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: Vec<u8>) -> NewMessage {
        NewMessage::builder("orders.paid")
            .partition_key("order-7")
            .content_type("application/json")
            .header("trace", "abc")
            .payload(payload)
            .build()
            .unwrap()
    }

    #[test]
    fn a_message_round_trips_through_its_items() {
        let m = message(b"{\"order\":7}".to_vec());
        let items = message_items(&m, 5_000_000, Duration::from_secs(100)).unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(get_s(&items[0], SK), Some(FIRST_PART));
        assert_eq!(get_n::<u64>(&items[0], TTL), Some(105));
        let back = decode_message(&items[0], &[]).unwrap();
        assert_eq!(back.id, m.id());
        assert_eq!(back.destination, "orders.paid");
        assert_eq!(back.partition_key.as_deref(), Some("order-7"));
        assert_eq!(back.content_type.as_deref(), Some("application/json"));
        assert_eq!(back.headers.get("trace"), Some("abc"));
        assert_eq!(back.payload, m.payload());
        assert_eq!(back.created_at, from_micros(5_000_000));
    }

    #[test]
    fn a_large_payload_splits_and_joins_in_order() {
        let payload: Vec<u8> = (0..700 * 1024_usize)
            .map(|i| u8::try_from(i % 251).unwrap())
            .collect();
        let m = message(payload.clone());
        let items = message_items(&m, 1, Duration::from_secs(1)).unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(parts_of(&items[0]), 3);
        assert!(items.iter().all(|i| item_size(i) <= MAX_ITEM_BYTES));
        assert_eq!(
            decode_message(&items[0], &items[1..]).unwrap().payload,
            payload
        );
        let reason = decode_message(&items[0], &items[1..2]).unwrap_err();
        assert!(reason.contains("2 of its 3"), "{reason}");
        let swapped = [items[2].clone(), items[1].clone()];
        assert!(decode_message(&items[0], &swapped)
            .unwrap_err()
            .contains("part 1"));
    }

    #[test]
    fn malformed_items_give_reasons() {
        let m = message(b"x".to_vec());
        let good = message_items(&m, 1, Duration::from_secs(1))
            .unwrap()
            .remove(0);
        let mut bad = good.clone();
        bad.insert(HEADERS.into(), s("[1]"));
        assert!(decode_message(&bad, &[]).unwrap_err().contains("headers"));
        let mut bad = good.clone();
        bad.remove(DESTINATION);
        assert!(decode_message(&bad, &[])
            .unwrap_err()
            .contains("destination"));
        let mut bad = good.clone();
        bad.insert(CREATED.into(), s("soon"));
        assert!(decode_message(&bad, &[])
            .unwrap_err()
            .contains("created_us"));
        let mut bad = good;
        bad.insert(PAYLOAD.into(), s("text"));
        assert!(decode_message(&bad, &[]).unwrap_err().contains("binary"));
    }

    #[test]
    fn stream_values_convert_whole() {
        use aws_sdk_dynamodbstreams::primitives::Blob as StreamBlob;
        use aws_sdk_dynamodbstreams::types::AttributeValue as V;
        let image = HashMap::from([
            ("s".to_owned(), V::S("a".into())),
            ("n".to_owned(), V::N("12".into())),
            ("b".to_owned(), V::B(StreamBlob::new(vec![1, 2]))),
            (
                "m".to_owned(),
                V::M(HashMap::from([("l".to_owned(), V::L(vec![V::Bool(true)]))])),
            ),
        ]);
        let item = item_from_stream(image);
        assert_eq!(get_s(&item, "s"), Some("a"));
        assert_eq!(get_n::<u32>(&item, "n"), Some(12));
        assert_eq!(item["b"], AttributeValue::B(Blob::new(vec![1, 2])));
        assert_eq!(
            item["m"],
            AttributeValue::M(HashMap::from([(
                "l".to_owned(),
                AttributeValue::L(vec![AttributeValue::Bool(true)])
            )]))
        );
    }
}
