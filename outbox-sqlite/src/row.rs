//! Turning claimed and listed rows into messages.
//!
//! The tables are `STRICT`, so every stored value has its column's type; what another
//! writer can still get wrong is *content*: headers that are not a JSON object of
//! strings, an attempt count out of range, a field breaking the [`MessageLimits`]. Such
//! a row is a poison row: the claim dead-letters it with the reason and returns the
//! others. A column of another type (a table altered by hand) is a schema problem:
//! [`ErrorKind::Decode`](outbox_core::ErrorKind::Decode), and the claim is rolled back.

use outbox_core::backend::MessageParts;
use outbox_core::{
    store::ClaimedMessage, store::Lease, store::LeaseToken, DeadLetter, Error, ErrorKind, Headers,
    Message, MessageId, MessageLimits, Result,
};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;
use uuid::Uuid;

use crate::error::from_sqlx;
use crate::time::from_us;

/// Column `index` of `row`; failing is a schema problem ([`ErrorKind::Decode`]).
pub(crate) fn get<'r, T>(row: &'r SqliteRow, index: usize) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite>,
{
    row.try_get(index)
        .map_err(|e| from_sqlx(&format!("decoding column {index}"), e))
}

/// A 16-byte id column as a UUID.
pub(crate) fn uuid_at(row: &SqliteRow, index: usize) -> Result<Uuid> {
    let bytes: Vec<u8> = get(row, index)?;
    Uuid::from_slice(&bytes).map_err(|_| {
        Error::new(
            ErrorKind::Decode,
            format!(
                "column {index} holds {} bytes, not a 16-byte id",
                bytes.len()
            ),
        )
    })
}

/// A claim's rows, decoded.
#[derive(Debug, Default)]
pub(crate) struct DecodedClaim {
    /// In the order the rows were selected.
    pub(crate) claimed: Vec<ClaimedMessage>,
    /// `seq` and reason of the rows that cannot be delivered: to dead-letter.
    pub(crate) poison: Vec<(i64, String)>,
}

/// Decode a claim's rows (columns as [`crate::sql::CLAIMED_COLUMNS`]) in the order of
/// `order` (seqs as selected), checking each against `limits`.
pub(crate) fn decode_claimed(
    rows: &[SqliteRow],
    order: &[i64],
    token: LeaseToken,
    limits: &MessageLimits,
) -> Result<DecodedClaim> {
    let mut by_seq = std::collections::HashMap::with_capacity(rows.len());
    for row in rows {
        let seq: i64 = get(row, 0)?;
        by_seq.insert(seq, row);
    }
    let mut decoded = DecodedClaim::default();
    for seq in order {
        let Some(row) = by_seq.remove(seq) else {
            continue;
        };
        let checked =
            message_at(row, 1)?.and_then(|message| message.check_stored(limits).map(|()| message));
        match checked {
            Ok(message) => {
                let expires: i64 = get(row, 10)?;
                let expires_at = from_us(expires).ok_or_else(|| {
                    Error::new(ErrorKind::Decode, format!("lease expiry {expires} µs"))
                })?;
                let lease = Lease {
                    id: message.id,
                    token,
                    expires_at,
                };
                decoded.claimed.push(ClaimedMessage { message, lease });
            }
            Err(reason) => decoded.poison.push((*seq, reason)),
        }
    }
    Ok(decoded)
}

/// How text columns are read: as the bytes SQLite holds (statements select them as
/// `CAST(column AS BLOB)`), because a `TEXT` column, even in a `STRICT` table, accepts
/// bytes that are not UTF-8 from another writer. Claims dead-letter such a row; listings
/// show it lossily.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Text {
    Strict,
    Lossy,
}

impl Text {
    /// Text column `index` of `row`, or why it is not text.
    fn at(
        self,
        row: &SqliteRow,
        index: usize,
        name: &str,
    ) -> Result<std::result::Result<Option<String>, String>> {
        let bytes: Option<Vec<u8>> = get(row, index)?;
        Ok(match (bytes, self) {
            (None, _) => Ok(None),
            (Some(bytes), Text::Lossy) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            (Some(bytes), Text::Strict) => String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| format!("{name} is not UTF-8 text")),
        })
    }
}

/// The message in the nine columns from `first` (id, destination, partition key,
/// payload, content type, headers, created at, attempts, last error), or why its
/// content does not make one.
fn message_at(row: &SqliteRow, first: usize) -> Result<std::result::Result<Message, String>> {
    let created: i64 = get(row, first + 6)?;
    let attempts: i64 = get(row, first + 7)?;
    let headers = Text::Strict
        .at(row, first + 5, "headers")?
        .and_then(|text| {
            let text = text.unwrap_or_default();
            serde_json::from_str(&text)
                .map_err(|e| format!("headers are not JSON: {e}"))
                .and_then(Headers::from_json)
        });
    let attempts = u32::try_from(attempts).map_err(|_| format!("attempts is {attempts}"));
    let created_at =
        from_us(created).ok_or_else(|| format!("created_at {created} µs is out of range"));
    let parts = headers.and_then(|headers| {
        Ok(Parts {
            headers,
            attempts: attempts?,
            created_at: created_at?,
        })
    });
    let message = match parts {
        Ok(parts) => build(row, first, parts, Text::Strict)?,
        Err(reason) => Err(reason),
    };
    Ok(message.map_err(|reason| format!("undecodable row: {reason}")))
}

/// What [`build`] takes decoded already.
struct Parts {
    headers: Headers,
    attempts: u32,
    created_at: std::time::SystemTime,
}

fn build(
    row: &SqliteRow,
    first: usize,
    parts: Parts,
    text: Text,
) -> Result<std::result::Result<Message, String>> {
    let destination = text.at(row, first + 1, "destination")?;
    let partition_key = text.at(row, first + 2, "partition_key")?;
    let content_type = text.at(row, first + 4, "content_type")?;
    let last_error = text.at(row, first + 8, "last_error")?;
    let build = || -> std::result::Result<Message, String> {
        Ok(Message::from(MessageParts {
            id: MessageId::from_uuid(uuid_at(row, first).map_err(|e| e.to_string())?),
            destination: destination?.unwrap_or_default(),
            partition_key: partition_key?,
            payload: get(row, first + 3).map_err(|e| e.to_string())?,
            content_type: content_type?,
            headers: parts.headers,
            created_at: parts.created_at,
            attempts: parts.attempts,
            last_error: last_error?,
        }))
    };
    Ok(build())
}

/// Dead letters are listed even when their content does not decode (that is often why
/// they are dead): such a row is listed with the headers that are strings, text that
/// is not UTF-8 converted lossily, attempts out of range as 0 and times out of range
/// at the Unix epoch, and its `last_error` says what was wrong.
pub(crate) fn decode_dead_letter(row: &SqliteRow) -> Result<DeadLetter> {
    let headers = Text::Lossy
        .at(row, 5, "headers")?
        .unwrap_or_default()
        .unwrap_or_default();
    let headers = serde_json::from_str(&headers)
        .map(Headers::from_json_lossy)
        .unwrap_or_default();
    let attempts: i64 = get(row, 7)?;
    let created: i64 = get(row, 6)?;
    let dead: i64 = get(row, 9)?;
    let time = |us: i64| from_us(us).unwrap_or(std::time::UNIX_EPOCH);
    let parts = Parts {
        headers,
        attempts: u32::try_from(attempts).unwrap_or(0),
        created_at: time(created),
    };
    let message = build(row, 0, parts, Text::Lossy)?
        .map_err(|reason| Error::new(ErrorKind::Decode, reason))?;
    Ok(DeadLetter::new(message, time(dead)))
}
