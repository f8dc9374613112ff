//! Turning claimed and listed rows into [`Message`]s.

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use outbox_core::{
    ClaimedMessage, Error, ErrorKind, Headers, Lease, LeaseToken, Message, MessageId, Result,
};
use sqlx::postgres::PgRow;
use sqlx::Row;
use uuid::Uuid;

use crate::error::from_sqlx;

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

/// Decode a message row. The outer error is a schema problem (a column missing or of
/// the wrong type); the inner one is a row whose content does not make a message, with
/// the reason, to dead-letter.
pub(crate) fn decode_message(row: &PgRow) -> Result<std::result::Result<Message, (Uuid, String)>> {
    let id: Uuid = get(row, "id")?;
    let attempts: i32 = get(row, "attempts")?;
    let attempts =
        u32::try_from(attempts).map_err(|_| format!("undecodable row: attempts is {attempts}"));
    match (headers_from_json(get(row, "headers")?), attempts) {
        (Ok(headers), Ok(attempts)) => Ok(Ok(build_message(row, id, headers, attempts)?)),
        (Err(reason), _) | (_, Err(reason)) => Ok(Err((id, reason))),
    }
}

/// A claim's rows, decoded.
pub(crate) struct DecodedClaim {
    /// Ordered by due time, then `seq`.
    pub(crate) claimed: Vec<ClaimedMessage>,
    /// Rows whose content does not make a message, with the reason: to dead-letter.
    pub(crate) undecodable: Vec<(Uuid, String)>,
}

/// Decode a claim's rows. An error is a schema problem that affects the whole claim.
pub(crate) fn decode_claimed(rows: &[PgRow], token: LeaseToken) -> Result<DecodedClaim> {
    let mut claimed = Vec::with_capacity(rows.len());
    let mut undecodable = Vec::new();
    for row in rows {
        let due: (DateTime<Utc>, i64) = (get(row, "due_at")?, get(row, "seq")?);
        match decode_message(row)? {
            Ok(message) => {
                let expires: DateTime<Utc> = get(row, "lease_expires_at")?;
                let lease = Lease {
                    id: message.id,
                    token,
                    expires_at: SystemTime::from(expires),
                };
                claimed.push((due, ClaimedMessage { message, lease }));
            }
            Err((id, reason)) => undecodable.push((id, reason)),
        }
    }
    claimed.sort_by_key(|(due, _)| *due);
    Ok(DecodedClaim {
        claimed: claimed.into_iter().map(|(_, c)| c).collect(),
        undecodable,
    })
}

/// Dead letters are listed even when their content does not decode (that is often why
/// they are dead): such a row is listed with the headers that are strings, and its
/// `last_error` says what was wrong.
pub(crate) fn decode_dead_letter(row: &PgRow) -> Result<Message> {
    let id: Uuid = get(row, "id")?;
    let headers = match get(row, "headers")? {
        serde_json::Value::Object(map) => map
            .into_iter()
            .filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_owned())))
            .collect(),
        _ => Headers::new(),
    };
    let attempts: i32 = get(row, "attempts")?;
    build_message(row, id, headers, u32::try_from(attempts).unwrap_or(0))
}

fn build_message(row: &PgRow, id: Uuid, headers: Headers, attempts: u32) -> Result<Message> {
    let created_at: DateTime<Utc> = get(row, "created_at")?;
    Ok(Message::from_parts(
        MessageId::from_uuid(id),
        get(row, "destination")?,
        get(row, "partition_key")?,
        get(row, "payload")?,
        get(row, "content_type")?,
        headers,
        SystemTime::from(created_at),
        attempts,
        get(row, "last_error")?,
    ))
}

pub(crate) fn headers_json(headers: &Headers) -> serde_json::Value {
    serde_json::Value::Object(
        headers
            .iter()
            .map(|(k, v)| (k.to_owned(), serde_json::Value::String(v.to_owned())))
            .collect(),
    )
}

fn headers_from_json(value: serde_json::Value) -> std::result::Result<Headers, String> {
    let serde_json::Value::Object(map) = value else {
        return Err(format!(
            "undecodable row: headers are not a JSON object: {value}"
        ));
    };
    map.into_iter()
        .map(|(name, value)| match value {
            serde_json::Value::String(v) => Ok((name, v)),
            other => Err(format!(
                "undecodable row: header {name:?} is not a string: {other}"
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn headers_round_trip_and_reject_non_strings() {
        let headers: Headers = [("a", "1"), ("b", "two")].into_iter().collect();
        assert_eq!(headers_from_json(headers_json(&headers)).unwrap(), headers);
        assert!(headers_from_json(json!({"a": 1}))
            .unwrap_err()
            .contains("\"a\""));
        assert!(headers_from_json(json!(["a"])).is_err());
        assert!(headers_from_json(json!(null)).is_err());
    }
}
