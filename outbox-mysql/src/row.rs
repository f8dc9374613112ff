//! Turning claimed and listed rows into messages.
//!
//! A row of the wrong *shape* (a missing column, another type) is a schema problem:
//! [`ErrorKind::Decode`](outbox_core::ErrorKind::Decode) for the whole call. A row whose
//! *content* does not make a deliverable message (headers that are not a JSON object of
//! strings, text that is not UTF-8, negative attempts, a field over the limits) is a
//! poison row: the claim dead-letters it with the reason.

use std::time::SystemTime;

use chrono::NaiveDateTime;
use outbox_core::backend::{ClaimDecoder, DecodedClaim, MessageParts};
use outbox_core::{
    store::LeaseToken, DeadLetter, Headers, Message, MessageId, MessageLimits, Result,
};
use sqlx::mysql::MySqlRow;
use sqlx::Row;
use uuid::Uuid;

use crate::error::from_sqlx;

/// A column that must decode for the statement's shape to make sense.
pub(crate) fn get<'r, T>(row: &'r MySqlRow, column: &str) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::MySql> + sqlx::Type<sqlx::MySql>,
{
    row.try_get(column)
        .map_err(|e| from_sqlx(&format!("decoding column {column}"), e))
}

/// A time the statement reads as `NULL` when it is not a date (`0000-00-00`): the
/// time, or why the row is poison.
fn valid_time(row: &MySqlRow, column: &str) -> Result<std::result::Result<SystemTime, String>> {
    let at: Option<NaiveDateTime> = get(row, column)?;
    Ok(at
        .map(|at| SystemTime::from(at.and_utc()))
        .ok_or_else(|| format!("{column} is not a valid date")))
}

/// Bytes as text, or why they are not; `lossy` replaces what is not UTF-8 instead.
fn text(bytes: Vec<u8>, column: &str, lossy: bool) -> std::result::Result<String, String> {
    match String::from_utf8(bytes) {
        Ok(text) => Ok(text),
        Err(e) if lossy => Ok(String::from_utf8_lossy(e.as_bytes()).into_owned()),
        Err(_) => Err(format!("{column} is not UTF-8")),
    }
}

/// A claim's rows, checked against `limits`.
pub(crate) fn decode_claimed(
    rows: &[MySqlRow],
    token: LeaseToken,
    limits: &MessageLimits,
) -> Result<DecodedClaim<Uuid>> {
    let mut decoded = ClaimDecoder::new(token, rows.len());
    for row in rows {
        let (id, due, seq): (Uuid, Option<NaiveDateTime>, i64) =
            (get(row, "id")?, get(row, "due_time")?, get(row, "seq")?);
        let headers = Headers::from_json(get(row, "headers")?);
        let attempts: i32 = get(row, "attempts")?;
        let checked = match (headers, u32::try_from(attempts), due) {
            (_, _, None) => Err("due_at is not a valid date".to_owned()),
            (Ok(headers), Ok(attempts), _) => message(row, id, headers, attempts, false)?,
            (Err(reason), _, _) => Err(reason),
            (_, Err(_), _) => Err(format!("attempts is {attempts}")),
        }
        .map_err(|reason| format!("undecodable row: {reason}"))
        .and_then(|m| m.check_stored(limits).map(|()| m));
        let expiry = || {
            Ok(SystemTime::from(
                get::<NaiveDateTime>(row, "lease_expires_at")?.and_utc(),
            ))
        };
        decoded.push((due, seq), id, checked, expiry)?;
    }
    Ok(decoded.finish())
}

/// A dead letter, listed with what decodes: headers that are strings, negative
/// attempts as 0, text that is not UTF-8 replaced, times that are not dates as the
/// Unix epoch.
pub(crate) fn decode_dead_letter(row: &MySqlRow) -> Result<DeadLetter> {
    let headers = Headers::from_json_lossy(get(row, "headers")?);
    let attempts = u32::try_from(get::<i32>(row, "attempts")?).unwrap_or(0);
    let message = message(row, get(row, "id")?, headers, attempts, true)?;
    let message =
        message.map_err(|e| outbox_core::Error::new(outbox_core::ErrorKind::Decode, e))?;
    let dead_at = valid_time(row, "dead_time")?.unwrap_or(SystemTime::UNIX_EPOCH);
    Ok(DeadLetter::new(message, dead_at))
}

/// The message of a row, or why its content does not make one (never, with `lossy`).
fn message(
    row: &MySqlRow,
    id: Uuid,
    headers: Headers,
    attempts: u32,
    lossy: bool,
) -> Result<std::result::Result<Message, String>> {
    let optional = |c: &str| -> Result<std::result::Result<Option<String>, String>> {
        let bytes: Option<Vec<u8>> = get(row, c)?;
        Ok(bytes.map(|b| text(b, c, lossy)).transpose())
    };
    let parts = (
        text(get(row, "destination")?, "destination", lossy),
        optional("partition_key")?,
        optional("content_type")?,
    );
    let created_at = match valid_time(row, "created_at")? {
        Err(_) if lossy => Ok(SystemTime::UNIX_EPOCH),
        other => other,
    };
    let (destination, partition_key, content_type, created_at) = match (parts, created_at) {
        ((Ok(d), Ok(k), Ok(c)), Ok(at)) => (d, k, c, at),
        ((Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)), _) | (_, Err(e)) => return Ok(Err(e)),
    };
    Ok(Ok(Message::from(MessageParts {
        id: MessageId::from_uuid(id),
        destination,
        partition_key,
        payload: get(row, "payload")?,
        content_type,
        headers,
        created_at,
        attempts,
        last_error: get(row, "last_error")?,
    })))
}
