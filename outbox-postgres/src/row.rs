//! Turning claimed and listed rows into messages.
//!
//! Two kinds of failure are kept apart. A row of the wrong *shape* (a missing column, a
//! column of another type) is a schema problem that affects every row: an
//! [`ErrorKind::Decode`](outbox_core::ErrorKind::Decode) error. A row whose *content*
//! does not make a deliverable message (headers that are not a JSON object of strings,
//! a timestamp out of range, a field breaking the [`MessageLimits`], attempts at the
//! limit) is a poison row: the claim dead-letters it with the reason and returns the
//! others.

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use outbox_core::backend::MessageParts;
use outbox_core::backend::{ClaimDecoder, DecodedClaim};
use outbox_core::{
    store::LeaseToken, DeadLetter, Error, ErrorKind, Headers, Message, MessageId, MessageLimits,
    Result,
};
use sqlx::postgres::PgRow;
use sqlx::Row;
use uuid::Uuid;

use crate::error::from_sqlx;
use crate::sql::TIME_RANGE;

/// A column that must decode for the statement's own shape to make sense; failing is a
/// schema problem, reported as [`ErrorKind::Decode`].
pub(crate) fn get<'r, T>(row: &'r PgRow, column: &str) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(column)
        .map_err(|e| from_sqlx(&format!("decoding column {column}"), e))
}

pub(crate) fn decode_error(message: String) -> Error {
    Error::new(ErrorKind::Decode, message)
}

/// Decode a claim's rows, checking each against `limits`. An error is a schema problem
/// that affects the whole claim.
pub(crate) fn decode_claimed(
    rows: &[PgRow],
    token: LeaseToken,
    limits: &MessageLimits,
) -> Result<DecodedClaim<Uuid>> {
    let mut decoded = ClaimDecoder::new(token, rows.len());
    for row in rows {
        let id: Uuid = get(row, "id")?;
        let order: (DateTime<Utc>, i64) = (get(row, "due_at")?, get(row, "seq")?);
        let checked = checked_message(row, id)?.and_then(|message| {
            // A due time before the range would be harmless, but only another tool
            // writes one; a row the library would never write is not delivered.
            out_of_range(row, "due_at_invalid", "available_at")
                .map_err(|reason| format!("undecodable row: {reason}"))?;
            message.check_stored(limits)?;
            Ok(message)
        });
        decoded.push(order, id, checked, || {
            let expires: DateTime<Utc> = get(row, "lease_expires_at")?;
            Ok(SystemTime::from(expires))
        })?;
    }
    Ok(decoded.finish())
}

/// The message of a claimed row, or why its content does not make one.
fn checked_message(row: &PgRow, id: Uuid) -> Result<std::result::Result<Message, String>> {
    let headers = Headers::from_json(get(row, "headers")?);
    let attempts: i32 = get(row, "attempts")?;
    let attempts = u32::try_from(attempts).map_err(|_| format!("attempts is {attempts}"));
    let created = out_of_range(row, "created_at_invalid", "created_at");
    let message = match (headers, attempts, created) {
        (Ok(headers), Ok(attempts), Ok(())) => build_message(row, id, headers, attempts)?,
        (Err(reason), _, _) | (_, Err(reason), _) | (_, _, Err(reason)) => {
            return Ok(Err(format!("undecodable row: {reason}")))
        }
    };
    Ok(Ok(message))
}

/// `Err(reason)` when the statement flagged the column `name` as outside the timestamps
/// this crate returns, in its `flag` column (`<alias>_invalid`, named in full so that
/// decoding a row formats nothing).
fn out_of_range(row: &PgRow, flag: &str, name: &str) -> std::result::Result<(), String> {
    match row.try_get::<Option<String>, _>(flag) {
        Ok(None) => Ok(()),
        Ok(Some(value)) => Err(format!("{name} {value} is outside {TIME_RANGE}")),
        Err(e) => Err(format!("{name}: {e}")),
    }
}

/// Dead letters are listed even when their content does not decode (that is often why
/// they are dead): such a row is listed with the headers that are strings, attempts
/// below zero as 0 and timestamps held to the supported range, and its `last_error`
/// says what was wrong.
pub(crate) fn decode_dead_letter(row: &PgRow) -> Result<DeadLetter> {
    let id: Uuid = get(row, "id")?;
    let headers = Headers::from_json_lossy(get(row, "headers")?);
    let attempts: i32 = get(row, "attempts")?;
    let message = build_message(row, id, headers, u32::try_from(attempts).unwrap_or(0))?;
    let dead_at: DateTime<Utc> = get(row, "dead_at")?;
    Ok(DeadLetter::new(message, SystemTime::from(dead_at)))
}

fn build_message(row: &PgRow, id: Uuid, headers: Headers, attempts: u32) -> Result<Message> {
    let created_at: DateTime<Utc> = get(row, "created_at")?;
    Ok(Message::from(MessageParts {
        id: MessageId::from_uuid(id),
        destination: get(row, "destination")?,
        partition_key: get(row, "partition_key")?,
        payload: get(row, "payload")?,
        content_type: get(row, "content_type")?,
        headers,
        created_at: SystemTime::from(created_at),
        attempts,
        last_error: get(row, "last_error")?,
    }))
}
