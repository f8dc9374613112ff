//! How an outbox message becomes an SQS message body and message attributes, its size
//! as SQS counts it, and the way back ([`decode`]) for consumers.
//!
//! # The mapping
//!
//! 1. **Body.** A payload that is non-empty UTF-8 holding only characters SQS accepts
//!    in a body (`#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF`) is
//!    the body as is. Any other payload (binary, invalid UTF-8, control characters) is
//!    sent as standard base64 with the attribute `outbox-payload-encoding: base64`. An
//!    empty payload (SQS refuses an empty body) is the body `-` with
//!    `outbox-payload-encoding: empty`. No byte is ever changed on the way.
//! 2. **Reserved attributes**, all of type `String`: `outbox-message-id` (always),
//!    `content-type`, `outbox-partition-key`, `outbox-payload-encoding` and, under a
//!    single-queue routing, `outbox-destination`: at most five.
//! 3. **Trace context.** The headers `traceparent` and `tracestate`, when their values
//!    can be attribute values, are attributes of their own, so consumers and tools read
//!    them without decoding anything.
//! 4. **Other headers.** When every other header can be an attribute (its name a valid
//!    attribute name outside the reserved ones, its value non-empty text SQS accepts)
//!    and the total stays within SQS's ten attributes, each is an attribute of its own
//!    name. Otherwise all of them travel as one JSON object in `outbox-headers`.
//!
//! A receiver reads the reserved attributes, then takes every other attribute as a
//! header and merges in `outbox-headers` if present ([`decode`] does exactly this).

use base64::Engine as _;
use outbox_core::{Error, ErrorKind, Headers, Message, MessageId, Result};

/// The attribute carrying [`Message::id`] (on every queue; FIFO queues also get it as
/// the `MessageDeduplicationId`).
pub const MESSAGE_ID_ATTRIBUTE: &str = "outbox-message-id";
/// The attribute carrying [`Message::content_type`].
pub const CONTENT_TYPE_ATTRIBUTE: &str = "content-type";
/// The attribute carrying [`Message::partition_key`] (FIFO queues also get it as the
/// `MessageGroupId`).
pub const PARTITION_KEY_ATTRIBUTE: &str = "outbox-partition-key";
/// The attribute saying how the body encodes the payload: absent for a UTF-8 payload
/// sent as is, `base64`, or `empty`.
pub const PAYLOAD_ENCODING_ATTRIBUTE: &str = "outbox-payload-encoding";
/// The attribute holding the message's headers as one JSON object, when they cannot
/// each be an attribute.
pub const HEADERS_ATTRIBUTE: &str = "outbox-headers";
/// The attribute carrying [`Message::destination`] under a single-queue routing.
pub const DESTINATION_ATTRIBUTE: &str = "outbox-destination";
/// How many message attributes SQS accepts on one message.
pub const MAX_ATTRIBUTES: usize = 10;

/// The `outbox-payload-encoding` value of a base64 body.
const BASE64: &str = "base64";
/// The `outbox-payload-encoding` value of an empty payload, and its body.
const EMPTY: &str = "empty";
const EMPTY_BODY: &str = "-";
/// The data type of every attribute the publisher sets.
const STRING: &str = "String";
/// Headers lifted into attributes of their own even when the rest go into JSON.
const TRACE_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// A message ready to be an SQS entry: body, attributes and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Prepared {
    pub(crate) body: String,
    pub(crate) attributes: Vec<(String, String)>,
    /// Bytes as SQS counts them: the body plus each attribute's name, data type and
    /// value.
    pub(crate) size: usize,
}

/// Whether SQS accepts `c` in a message body or a `String` attribute value.
fn is_sqs_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

fn is_sqs_text(s: &str) -> bool {
    s.chars().all(is_sqs_char)
}

/// Whether `name` is a valid message attribute name: 1 to 256 of `A-Z a-z 0-9 _ - .`,
/// no leading, trailing or doubled `.`, not starting with `AWS.` or `Amazon.` in any
/// case.
fn is_attribute_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !name.is_empty()
        && name.len() <= 256
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.")
}

/// Whether a header named `name` would clash with the publisher's own attributes.
fn is_reserved(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == CONTENT_TYPE_ATTRIBUTE || lower.starts_with("outbox-")
}

fn can_be_attribute(name: &str, value: &str) -> bool {
    is_attribute_name(name) && !is_reserved(name) && !value.is_empty() && is_sqs_text(value)
}

/// `json` with every character SQS refuses in an attribute value (serde_json leaves
/// U+FFFE and U+FFFF as they are) written as a JSON `\u` escape of four hex digits,
/// which any JSON decoder reads back. Such characters only occur inside JSON strings,
/// where the escape means the same character.
fn escape_non_sqs(json: &str) -> String {
    if is_sqs_text(json) {
        return json.to_owned();
    }
    let mut out = String::with_capacity(json.len() + 12);
    for c in json.chars() {
        if is_sqs_char(c) {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// The body and attributes of `message`; `with_destination` adds
/// [`DESTINATION_ATTRIBUTE`].
pub(crate) fn prepare(message: &Message, with_destination: bool) -> Prepared {
    let mut attributes: Vec<(String, String)> = Vec::with_capacity(MAX_ATTRIBUTES);
    let mut put = |name: &str, value: String| attributes.push((name.to_owned(), value));
    put(MESSAGE_ID_ATTRIBUTE, message.id.to_string());
    let body = match std::str::from_utf8(&message.payload) {
        Ok("") => {
            put(PAYLOAD_ENCODING_ATTRIBUTE, EMPTY.to_owned());
            EMPTY_BODY.to_owned()
        }
        Ok(text) if is_sqs_text(text) => text.to_owned(),
        _ => {
            put(PAYLOAD_ENCODING_ATTRIBUTE, BASE64.to_owned());
            base64::engine::general_purpose::STANDARD.encode(&message.payload)
        }
    };
    // Attribute values must be non-empty SQS text; anything else goes through the
    // JSON headers attribute, which escapes it.
    let mut rest = Headers::new();
    let mut lifted = Vec::new();
    for (name, value) in message.headers.iter() {
        if TRACE_HEADERS.contains(&name) && can_be_attribute(name, value) {
            lifted.push((name.to_owned(), value.to_owned()));
        } else {
            rest.insert(name, value);
        }
    }
    let mut fallback: Vec<(String, String)> = Vec::new();
    if let Some(content_type) = &message.content_type {
        if !content_type.is_empty() && is_sqs_text(content_type) {
            put(CONTENT_TYPE_ATTRIBUTE, content_type.clone());
        } else {
            fallback.push((CONTENT_TYPE_ATTRIBUTE.to_owned(), content_type.clone()));
        }
    }
    if let Some(key) = &message.partition_key {
        if !key.is_empty() && is_sqs_text(key) {
            put(PARTITION_KEY_ATTRIBUTE, key.clone());
        } else {
            fallback.push((PARTITION_KEY_ATTRIBUTE.to_owned(), key.clone()));
        }
    }
    if with_destination {
        let destination = &message.destination;
        if !destination.is_empty() && is_sqs_text(destination) {
            put(DESTINATION_ATTRIBUTE, destination.clone());
        } else {
            fallback.push((DESTINATION_ATTRIBUTE.to_owned(), destination.clone()));
        }
    }
    attributes.extend(lifted);
    let individually = fallback.is_empty()
        && attributes.len() + rest.len() <= MAX_ATTRIBUTES
        && rest.iter().all(|(n, v)| can_be_attribute(n, v));
    if individually {
        attributes.extend(rest.iter().map(|(n, v)| (n.to_owned(), v.to_owned())));
    } else if !rest.is_empty() || !fallback.is_empty() {
        // Fields that cannot be attribute values ride in the JSON object under their
        // attribute names, which no header can hold in individual mode.
        let mut object = serde_json::Map::new();
        object.insert("headers".to_owned(), rest.to_json());
        for (name, value) in fallback {
            object.insert(name, serde_json::Value::String(value));
        }
        attributes.push((
            HEADERS_ATTRIBUTE.to_owned(),
            escape_non_sqs(&serde_json::Value::Object(object).to_string()),
        ));
    }
    let size = body.len()
        + attributes
            .iter()
            .map(|(n, v)| n.len() + STRING.len() + v.len())
            .sum::<usize>();
    Prepared {
        body,
        attributes,
        size,
    }
}

/// An SQS message decoded back into the outbox message it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqsDelivery {
    /// The outbox message id (`outbox-message-id`).
    pub id: MessageId,
    /// The destination, under a single-queue routing (`outbox-destination`).
    pub destination: Option<String>,
    /// The partition key.
    pub partition_key: Option<String>,
    /// The content type.
    pub content_type: Option<String>,
    /// The payload bytes, exactly as enqueued.
    pub payload: Vec<u8>,
    /// The message's own headers.
    pub headers: Headers,
}

fn decode_error(what: impl Into<String>) -> Error {
    Error::new(ErrorKind::Decode, what)
}

/// Decode a message received from SQS (with `MessageAttributeNames` `All`) back into
/// the outbox message the publisher sent.
///
/// # Errors
/// [`ErrorKind::Decode`] when the message lacks `outbox-message-id` or it is not a
/// message id, a body does not decode by its `outbox-payload-encoding`, or
/// `outbox-headers` is not the publisher's JSON: a message the publisher did not send.
pub fn decode(message: &aws_sdk_sqs::types::Message) -> Result<SqsDelivery> {
    let mut id = None;
    let mut destination = None;
    let mut partition_key = None;
    let mut content_type = None;
    let mut encoding = None;
    let mut headers = Headers::new();
    let mut json = None;
    for (name, value) in message.message_attributes().into_iter().flatten() {
        let text = value
            .string_value()
            .map(str::to_owned)
            .ok_or_else(|| decode_error(format!("message attribute {name:?} is not a String")))?;
        match name.as_str() {
            MESSAGE_ID_ATTRIBUTE => id = Some(text),
            DESTINATION_ATTRIBUTE => destination = Some(text),
            PARTITION_KEY_ATTRIBUTE => partition_key = Some(text),
            CONTENT_TYPE_ATTRIBUTE => content_type = Some(text),
            PAYLOAD_ENCODING_ATTRIBUTE => encoding = Some(text),
            HEADERS_ATTRIBUTE => json = Some(text),
            _ => headers.insert(name.as_str(), text),
        }
    }
    if let Some(json) = json {
        let value: serde_json::Value = serde_json::from_str(&json)
            .map_err(|e| decode_error("outbox-headers is not JSON").with_source(e))?;
        let serde_json::Value::Object(mut object) = value else {
            return Err(decode_error("outbox-headers is not a JSON object"));
        };
        let inner = object.remove("headers").unwrap_or_default();
        for (name, value) in Headers::from_json(inner).map_err(decode_error)?.iter() {
            headers.insert(name, value);
        }
        for (name, value) in object {
            let serde_json::Value::String(value) = value else {
                return Err(decode_error(format!(
                    "outbox-headers field {name:?} is not a string"
                )));
            };
            match name.as_str() {
                CONTENT_TYPE_ATTRIBUTE => content_type = Some(value),
                PARTITION_KEY_ATTRIBUTE => partition_key = Some(value),
                DESTINATION_ATTRIBUTE => destination = Some(value),
                other => {
                    return Err(decode_error(format!(
                        "outbox-headers has an unknown field {other:?}"
                    )))
                }
            }
        }
    }
    let id = id.ok_or_else(|| decode_error("the message has no outbox-message-id attribute"))?;
    let id: MessageId = id
        .parse()
        .map_err(|_| decode_error(format!("outbox-message-id {id:?} is not a message id")))?;
    let body = message.body().unwrap_or_default();
    let payload = match encoding.as_deref() {
        None => body.as_bytes().to_vec(),
        Some(BASE64) => base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(|e| decode_error("the base64 body does not decode").with_source(e))?,
        Some(EMPTY) => Vec::new(),
        Some(other) => {
            return Err(decode_error(format!(
                "unknown outbox-payload-encoding {other:?}"
            )))
        }
    };
    Ok(SqsDelivery {
        id,
        destination,
        partition_key,
        content_type,
        payload,
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_sqs::types::MessageAttributeValue;
    use outbox_core::backend::MessageParts;
    use std::time::SystemTime;

    fn message(payload: &[u8], headers: &[(&str, &str)]) -> Message {
        Message::from(MessageParts {
            id: MessageId::new(),
            destination: "orders".into(),
            partition_key: Some("k-1".into()),
            payload: payload.to_vec(),
            content_type: Some("application/json".into()),
            headers: headers.iter().copied().collect(),
            created_at: SystemTime::now(),
            attempts: 1,
            last_error: None,
        })
    }

    /// What SQS hands back for `prepared`.
    fn received(prepared: &Prepared) -> aws_sdk_sqs::types::Message {
        let mut builder = aws_sdk_sqs::types::Message::builder().body(&prepared.body);
        for (name, value) in &prepared.attributes {
            builder = builder.message_attributes(
                name,
                MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(value)
                    .build()
                    .unwrap(),
            );
        }
        builder.build()
    }

    fn round_trip(m: &Message, with_destination: bool) -> (Prepared, SqsDelivery) {
        let prepared = prepare(m, with_destination);
        assert!(is_sqs_text(&prepared.body), "{:?}", prepared.body);
        for (name, value) in &prepared.attributes {
            assert!(!value.is_empty() && is_sqs_text(value), "{name}: {value:?}");
        }
        let back = decode(&received(&prepared)).unwrap();
        assert_eq!(back.id, m.id);
        assert_eq!(back.payload, m.payload);
        assert_eq!(back.headers, m.headers);
        assert_eq!(back.content_type, m.content_type);
        assert_eq!(back.partition_key, m.partition_key);
        assert!(prepared.attributes.len() <= MAX_ATTRIBUTES);
        (prepared, back)
    }

    fn names(p: &Prepared) -> Vec<&str> {
        p.attributes.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn text_goes_as_is_and_bytes_as_base64() {
        let (p, _) = round_trip(&message("{\"a\":\"café ✓\"}".as_bytes(), &[]), false);
        assert_eq!(p.body, "{\"a\":\"café ✓\"}");
        assert!(!names(&p).contains(&PAYLOAD_ENCODING_ATTRIBUTE));
        for binary in [
            &b"\0\xff\xfe"[..],
            b"a\x01b",
            "\u{FFFF}".as_bytes(),
            b"\xc3",
        ] {
            let (p, _) = round_trip(&message(binary, &[]), false);
            assert!(p
                .attributes
                .contains(&(PAYLOAD_ENCODING_ATTRIBUTE.into(), "base64".into())));
        }
        let (p, _) = round_trip(&message(b"", &[]), false);
        assert!(!p.body.is_empty(), "SQS refuses an empty body");
        let every: Vec<u8> = (0..=255).collect();
        round_trip(&message(&every, &[]), false);
        // Tabs and line breaks are SQS text.
        let (p, _) = round_trip(&message(b"a\tb\r\nc", &[]), false);
        assert_eq!(p.body, "a\tb\r\nc");
    }

    #[test]
    fn few_valid_headers_are_attributes_of_their_own() {
        let m = message(
            b"x",
            &[("traceparent", "00-ab-cd-01"), ("x-tenant", "acme")],
        );
        let (p, back) = round_trip(&m, true);
        assert_eq!(
            names(&p),
            [
                MESSAGE_ID_ATTRIBUTE,
                CONTENT_TYPE_ATTRIBUTE,
                PARTITION_KEY_ATTRIBUTE,
                DESTINATION_ATTRIBUTE,
                "traceparent",
                "x-tenant"
            ]
        );
        assert_eq!(back.destination.as_deref(), Some("orders"));
    }

    #[test]
    fn too_many_or_odd_headers_go_into_json_but_trace_context_stays_out() {
        let many: Vec<(String, String)> =
            (0..9).map(|i| (format!("h{i}"), format!("v{i}"))).collect();
        let mut headers: Vec<(&str, &str)> =
            many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        headers.push(("traceparent", "00-ab-cd-01"));
        headers.push(("tracestate", "v=1"));
        let (p, _) = round_trip(&message(b"x", &headers), false);
        assert_eq!(
            names(&p),
            [
                MESSAGE_ID_ATTRIBUTE,
                CONTENT_TYPE_ATTRIBUTE,
                PARTITION_KEY_ATTRIBUTE,
                "traceparent",
                "tracestate",
                HEADERS_ATTRIBUTE
            ]
        );
        for odd in [
            ("bad name", "v"),
            ("ok", ""),
            ("ok", "\u{1}"),
            ("outbox-message-id", "forged"),
            ("Content-Type", "x"),
            ("AWS.x", "v"),
            ("a..b", "v"),
            ("", "v"),
        ] {
            let (p, _) = round_trip(&message(b"x", &[odd, ("fine", "v")]), false);
            assert!(names(&p).contains(&HEADERS_ATTRIBUTE), "{odd:?}");
            assert!(!names(&p).contains(&"fine"), "all or nothing: {odd:?}");
        }
        // A trace header SQS cannot carry goes into the JSON with the rest.
        let (p, _) = round_trip(&message(b"x", &[("traceparent", "")]), false);
        assert!(names(&p).contains(&HEADERS_ATTRIBUTE));
    }

    #[test]
    fn fields_sqs_cannot_carry_ride_in_the_json() {
        let mut m = message(b"x", &[]);
        m.partition_key = Some("line\u{1}".into());
        m.content_type = Some(String::new());
        let (p, _) = round_trip(&m, false);
        assert!(names(&p).contains(&HEADERS_ATTRIBUTE));
    }

    #[test]
    fn characters_sqs_refuses_are_escaped_in_the_json() {
        let mut m = message(b"x", &[("x-odd", "a\u{FFFF}b\u{FFFE}\u{0}")]);
        m.partition_key = Some("k\u{FFFF}".into());
        m.content_type = Some("text/\u{FFFF}".into());
        let (p, _) = round_trip(&m, true);
        let json = &p
            .attributes
            .iter()
            .find(|(n, _)| n == HEADERS_ATTRIBUTE)
            .unwrap()
            .1;
        assert!(json.contains("\\uffff"), "{json}");
        // Characters SQS takes stay as they are, astral ones included.
        let m = message(b"x", &[("x-odd", "\u{1}é\u{1F600}")]);
        let (p, _) = round_trip(&m, false);
        let json = &p
            .attributes
            .iter()
            .find(|(n, _)| n == HEADERS_ATTRIBUTE)
            .unwrap()
            .1;
        assert!(json.contains("é\u{1F600}"), "{json}");
    }

    #[test]
    fn size_counts_body_and_every_attribute_name_type_and_value() {
        let m = message(b"hello", &[("a", "bc")]);
        let p = prepare(&m, false);
        let expected = 5
            + (MESSAGE_ID_ATTRIBUTE.len() + 6 + 36)
            + (CONTENT_TYPE_ATTRIBUTE.len() + 6 + "application/json".len())
            + (PARTITION_KEY_ATTRIBUTE.len() + 6 + 3)
            + (1 + 6 + 2);
        assert_eq!(p.size, expected);
        // base64 grows the body by a third.
        let p = prepare(&message(&[0u8; 300], &[]), false);
        assert!(p.size > 400, "{}", p.size);
    }

    #[test]
    fn decode_refuses_what_the_publisher_did_not_send() {
        let plain = aws_sdk_sqs::types::Message::builder().body("x").build();
        assert_eq!(decode(&plain).unwrap_err().kind(), ErrorKind::Decode);
        let p = prepare(&message(b"\0", &[]), false);
        let mut bad = p.clone();
        bad.body = "***".into();
        assert!(decode(&received(&bad)).is_err());
        let mut bad = p;
        bad.attributes
            .push((HEADERS_ATTRIBUTE.into(), "[1]".into()));
        assert!(decode(&received(&bad)).is_err());
    }
}
