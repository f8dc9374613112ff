//! A message's AMQP properties: `message-id`, `delivery-mode`, `content-type`,
//! `timestamp` and the headers table.

use std::time::UNIX_EPOCH;

use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::BasicProperties;
use outbox_core::Message;

/// The AMQP header that carries a message's
/// [`partition_key`](outbox_core::Message::partition_key). It replaces a message header
/// of the same name.
pub const PARTITION_KEY_HEADER: &str = "x-outbox-partition-key";

/// AMQP `delivery-mode` 2: the broker writes the message to disk in durable queues.
pub const PERSISTENT: u8 = 2;

/// The AMQP properties of `message`, or why it cannot be sent.
pub(crate) fn properties(message: &Message) -> std::result::Result<BasicProperties, String> {
    let short = |what: &str, text: &str| {
        ShortString::try_new(text).map_err(|e| format!("{what} cannot be sent over AMQP: {e}"))
    };
    let mut headers = FieldTable::default();
    for (name, value) in message.headers.iter() {
        headers.insert(
            short("a header name", name)?,
            AMQPValue::LongString(value.into()),
        );
    }
    if let Some(key) = &message.partition_key {
        headers.insert(
            PARTITION_KEY_HEADER.into(),
            AMQPValue::LongString(key.as_str().into()),
        );
    }
    let seconds = message
        .created_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut properties = BasicProperties::default()
        .with_message_id(message.id.to_string().into())
        .with_delivery_mode(PERSISTENT)
        .with_timestamp(seconds);
    if !headers.inner().is_empty() {
        properties = properties.with_headers(headers);
    }
    if let Some(content_type) = &message.content_type {
        properties = properties.with_content_type(short("the content type", content_type)?);
    }
    Ok(properties)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use outbox_core::backend::MessageParts;
    use outbox_core::{Headers, MessageId};

    use super::*;

    fn message() -> Message {
        let mut headers = Headers::new();
        headers.insert("traceparent", "00-abc-01");
        headers.insert(PARTITION_KEY_HEADER, "overridden");
        Message::from(MessageParts {
            id: MessageId::new(),
            destination: "orders".into(),
            partition_key: Some("order-42".into()),
            payload: vec![1, 2, 3],
            content_type: Some("application/json".into()),
            headers,
            created_at: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            attempts: 1,
            last_error: None,
        })
    }

    fn header<'a>(p: &'a BasicProperties, name: &str) -> Option<&'a AMQPValue> {
        p.headers().as_ref().and_then(|h| h.inner().get(name))
    }

    #[test]
    fn properties_carry_the_message() {
        let m = message();
        let p = properties(&m).unwrap();
        assert_eq!(
            p.message_id().as_ref().map(ShortString::as_str),
            Some(m.id.to_string().as_str())
        );
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(
            p.content_type().as_ref().map(ShortString::as_str),
            Some("application/json")
        );
        assert_eq!(*p.timestamp(), Some(1_700_000_000));
        assert_eq!(
            header(&p, "traceparent"),
            Some(&AMQPValue::LongString("00-abc-01".into()))
        );
        assert_eq!(
            header(&p, PARTITION_KEY_HEADER),
            Some(&AMQPValue::LongString("order-42".into())),
            "the partition key wins over a header of the same name"
        );
    }

    #[test]
    fn a_bare_message_has_no_headers_table() {
        let mut m = message();
        m.headers = Headers::new();
        m.partition_key = None;
        m.content_type = None;
        m.created_at = SystemTime::UNIX_EPOCH - Duration::from_secs(1);
        let p = properties(&m).unwrap();
        assert!(p.headers().is_none());
        assert!(p.content_type().is_none());
        assert_eq!(*p.timestamp(), Some(0));
    }

    #[test]
    fn an_over_long_content_type_is_refused() {
        let mut m = message();
        m.content_type = Some("c".repeat(256));
        let reason = properties(&m).unwrap_err();
        assert!(reason.contains("content type"), "{reason}");
    }
}
