//! The content of one logical decoding message: a [`NewMessage`] in a compact binary
//! layout, written by [`encode`] at enqueue and read back by [`decode`] in the relay.
//!
//! Layout (version 1), all integers big-endian:
//!
//! | field | bytes |
//! |---|---|
//! | version | `u8` = 1 |
//! | id | 16 (UUID) |
//! | destination | `u32` length + UTF-8 |
//! | partition key | `u8` flag (0/1), then `u32` length + UTF-8 when 1 |
//! | content type | `u8` flag (0/1), then `u32` length + UTF-8 when 1 |
//! | headers | `u32` count, then per header `u32` length + name, `u32` length + value |
//! | payload | `u32` length + bytes |
//!
//! The commit time is not stored: the relay takes it from the transaction's `BEGIN`
//! record, so `created_at` is the enqueuing transaction's commit time by the server clock.

use std::time::SystemTime;

use outbox_core::backend::MessageParts;
use outbox_core::{Headers, Message, MessageId, NewMessage};
use uuid::Uuid;

/// The layout version [`encode`] writes.
pub(crate) const VERSION: u8 = 1;

/// `message` as logical decoding message content.
pub(crate) fn encode(message: &NewMessage) -> Vec<u8> {
    let headers = message.headers();
    let mut out = Vec::with_capacity(
        64 + message.destination().len()
            + message.payload().len()
            + headers
                .iter()
                .map(|(n, v)| n.len() + v.len() + 8)
                .sum::<usize>(),
    );
    out.push(VERSION);
    out.extend_from_slice(message.id().as_uuid().as_bytes());
    put_str(&mut out, message.destination());
    put_opt(&mut out, message.partition_key());
    put_opt(&mut out, message.content_type());
    put_len(&mut out, headers.len());
    for (name, value) in headers.iter() {
        put_str(&mut out, name);
        put_str(&mut out, value);
    }
    put_len(&mut out, message.payload().len());
    out.extend_from_slice(message.payload());
    out
}

/// The message `content` carries, stamped with the enqueuing transaction's commit time
/// and `attempts` (the relay's delivery attempt, from 1).
///
/// # Errors
/// Why the content is not a message of this layout (truncated, wrong version, text
/// that is not UTF-8, bytes left over).
pub(crate) fn decode(
    content: &[u8],
    committed_at: SystemTime,
    attempts: u32,
) -> Result<Message, String> {
    let mut r = Reader(content);
    let version = r.u8()?;
    if version != VERSION {
        return Err(format!(
            "unknown message layout version {version} (this relay reads {VERSION})"
        ));
    }
    let id = Uuid::from_slice(r.take(16)?).map_err(|e| e.to_string())?;
    let destination = r.string()?;
    let partition_key = r.opt_string()?;
    let content_type = r.opt_string()?;
    let header_count = r.u32()?;
    let mut headers = Headers::new();
    for _ in 0..header_count {
        let name = r.string()?;
        let value = r.string()?;
        headers.insert(name, value);
    }
    let payload_len = r.len()?;
    let payload = r.take(payload_len)?.to_vec();
    if !r.0.is_empty() {
        return Err(format!("{} bytes after the payload", r.0.len()));
    }
    Ok(Message::from(MessageParts {
        id: MessageId::from_uuid(id),
        destination,
        partition_key,
        payload,
        content_type,
        headers,
        created_at: committed_at,
        attempts,
        last_error: None,
    }))
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    // Every length is bounded by `MessageLimits` (payloads at most a few MiB, names at
    // most 255 bytes) long before `u32::MAX`; saturating keeps this total anyway, and
    // decode then fails on the truncated field instead of misreading it.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

fn put_opt(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => {
            out.push(1);
            put_str(out, s);
        }
        None => out.push(0),
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "truncated: wanted {n} bytes, {} left",
                self.0.len()
            ));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn len(&mut self) -> Result<usize, String> {
        usize::try_from(self.u32()?).map_err(|e| e.to_string())
    }

    fn string(&mut self) -> Result<String, String> {
        let len = self.len()?;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| format!("text is not UTF-8: {e}"))
    }

    fn opt_string(&mut self) -> Result<Option<String>, String> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.string().map(Some),
            other => Err(format!("bad presence flag {other}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_field() {
        let m = NewMessage::builder("orders.created")
            .partition_key("customer-7")
            .content_type("application/json")
            .header("traceparent", "00-abc")
            .header("x", "")
            .payload(b"{\"a\":1}".to_vec())
            .build()
            .unwrap();
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(1_700_000_000_123_456);
        let d = decode(&encode(&m), at, 1).unwrap();
        assert_eq!(d.id, m.id());
        assert_eq!(d.destination, "orders.created");
        assert_eq!(d.partition_key.as_deref(), Some("customer-7"));
        assert_eq!(d.content_type.as_deref(), Some("application/json"));
        assert_eq!(d.headers, *m.headers());
        assert_eq!(d.payload, m.payload());
        assert_eq!(d.created_at, at);
        assert_eq!(d.attempts, 1);
    }

    #[test]
    fn round_trips_absent_fields_and_empty_payload() {
        let m = NewMessage::builder("d").build().unwrap();
        let d = decode(&encode(&m), SystemTime::UNIX_EPOCH, 3).unwrap();
        assert_eq!(d.partition_key, None);
        assert_eq!(d.content_type, None);
        assert!(d.headers.is_empty());
        assert!(d.payload.is_empty());
        assert_eq!(d.attempts, 3);
    }

    #[test]
    fn rejects_foreign_content() {
        let good = encode(
            &NewMessage::builder("d")
                .payload(vec![1, 2, 3])
                .build()
                .unwrap(),
        );
        assert!(decode(&[], SystemTime::UNIX_EPOCH, 1).is_err());
        assert!(decode(b"hello", SystemTime::UNIX_EPOCH, 1)
            .unwrap_err()
            .contains("version"));
        for cut in 1..good.len() {
            assert!(
                decode(&good[..cut], SystemTime::UNIX_EPOCH, 1).is_err(),
                "{cut}"
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert!(decode(&long, SystemTime::UNIX_EPOCH, 1)
            .unwrap_err()
            .contains("after the payload"));
        let mut bad_flag = good;
        // version + id + destination ("d": 4 + 1) precede the key's flag.
        bad_flag[1 + 16 + 5] = 7;
        assert!(decode(&bad_flag, SystemTime::UNIX_EPOCH, 1)
            .unwrap_err()
            .contains("flag"));
    }
}
