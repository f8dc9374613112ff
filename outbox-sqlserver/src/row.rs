//! Turning claimed and listed rows into messages.
//!
//! A row of the wrong *shape* (a missing column, another type) is a schema problem:
//! [`ErrorKind::Decode`](outbox_core::ErrorKind::Decode). A row whose *content* does
//! not make a deliverable message (headers that are not a JSON object of strings,
//! negative attempts, a field breaking the [`MessageLimits`], attempts at the limit) is
//! a poison row: the claim dead-letters it with the reason and returns the others.
//! Every `datetime2` decodes (timestamps arrive as microseconds since the Unix epoch),
//! so no timestamp makes a row poison here.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tiberius::Row;

use outbox_core::backend::MessageParts;
use outbox_core::backend::{ClaimDecoder, DecodedClaim};
use outbox_core::{
    store::LeaseToken, DeadLetter, Headers, Message, MessageId, MessageLimits, Result,
};
use uuid::Uuid;

use crate::exec::{row_bytes, row_i32, row_i64, row_id, row_opt_str, row_str};

/// Microseconds since the Unix epoch as a `SystemTime` (before 1970 too).
pub(crate) fn system_time(us: i64) -> SystemTime {
    let magnitude = Duration::from_micros(us.unsigned_abs());
    if us >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// Decode a claim's rows, checking each against `limits`. An error is a schema problem
/// that affects the whole claim.
pub(crate) fn decode_claimed(
    rows: &[Row],
    token: LeaseToken,
    limits: &MessageLimits,
) -> Result<DecodedClaim<[u8; 16]>> {
    let mut decoded = ClaimDecoder::new(token, rows.len());
    for row in rows {
        let id = row_id(row, "id")?;
        let order = (row_i64(row, "due_us")?, row_i64(row, "seq")?);
        let headers = Headers::from_json_value_text(&row_str(row, "headers")?);
        let attempts = row_i32(row, "attempts")?;
        let attempts = u32::try_from(attempts).map_err(|_| format!("attempts is {attempts}"));
        let checked = match (headers, attempts) {
            (Ok(headers), Ok(attempts)) => {
                let message = build_message(row, id, headers, attempts)?;
                message.check_stored(limits).map(|()| message)
            }
            (Err(reason), _) | (_, Err(reason)) => Err(format!("undecodable row: {reason}")),
        };
        decoded.push(order, id, checked, || {
            Ok(system_time(row_i64(row, "lease_us")?))
        })?;
    }
    Ok(decoded.finish())
}

/// Dead letters are listed even when their content does not decode: with the headers
/// that are strings, attempts below zero as 0.
pub(crate) fn decode_dead_letter(row: &Row) -> Result<DeadLetter> {
    let id = row_id(row, "id")?;
    let headers = Headers::from_json_text_lossy(&row_str(row, "headers")?);
    let attempts = u32::try_from(row_i32(row, "attempts")?).unwrap_or(0);
    let message = build_message(row, id, headers, attempts)?;
    Ok(DeadLetter::new(
        message,
        system_time(row_i64(row, "dead_us")?),
    ))
}

fn build_message(row: &Row, id: [u8; 16], headers: Headers, attempts: u32) -> Result<Message> {
    Ok(Message::from(MessageParts {
        id: MessageId::from_uuid(Uuid::from_bytes(id)),
        destination: row_str(row, "destination")?,
        partition_key: row_opt_str(row, "partition_key")?,
        payload: row_bytes(row, "payload")?,
        content_type: row_opt_str(row, "content_type")?,
        headers,
        created_at: system_time(row_i64(row, "created_us")?),
        attempts,
        last_error: row_opt_str(row, "last_error")?,
    }))
}

/// Parsing the `headers` column's JSON text.
trait HeadersText: Sized {
    fn from_json_value_text(text: &str) -> std::result::Result<Self, String>;
    fn from_json_text_lossy(text: &str) -> Self;
}

impl HeadersText for Headers {
    fn from_json_value_text(text: &str) -> std::result::Result<Self, String> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("headers are not JSON: {e}"))?;
        Headers::from_json(value)
    }

    fn from_json_text_lossy(text: &str) -> Self {
        serde_json::from_str(text)
            .map(Headers::from_json_lossy)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_micros_round_trip_both_sides_of_1970() {
        assert_eq!(system_time(0), UNIX_EPOCH);
        assert_eq!(
            system_time(1_500_000),
            UNIX_EPOCH + Duration::from_micros(1_500_000)
        );
        assert_eq!(system_time(-5), UNIX_EPOCH - Duration::from_micros(5));
        // datetime2's range, 0001-01-01 to 9999-12-31, in microseconds.
        let _ = system_time(-62_135_596_800_000_000);
        let _ = system_time(253_402_300_799_999_999);
    }

    #[test]
    fn headers_text_decodes_strictly_or_lossily() {
        assert!(Headers::from_json_value_text("{\"a\":\"b\"}").is_ok());
        assert!(Headers::from_json_value_text("{\"a\":1}").is_err());
        assert!(Headers::from_json_value_text("not json").is_err());
        assert!(Headers::from_json_text_lossy("not json").is_empty());
        assert_eq!(
            Headers::from_json_text_lossy("{\"a\":\"b\",\"n\":1}").get("a"),
            Some("b")
        );
    }
}
