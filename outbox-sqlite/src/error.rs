//! The one place where sqlx errors become [`outbox_core::Error`]s.
//!
//! SQLite errors are classified by their result code (sqlx reports the extended code;
//! its low byte is the primary code, <https://www.sqlite.org/rescode.html>); driver
//! errors by their sqlx variant. The cause stays reachable through
//! [`std::error::Error::source`].

use outbox_core::{Error, ErrorKind};
use outbox_sqlx::ErrorCodes;
use sqlx::error::DatabaseError;

/// `SQLITE_BUSY`: another connection holds the lock (after the busy timeout).
const BUSY: i32 = 5;
/// `SQLITE_LOCKED`: a conflict inside one connection or a shared cache.
const LOCKED: i32 = 6;
/// `SQLITE_INTERRUPT`.
const INTERRUPT: i32 = 9;
/// `SQLITE_IOERR`.
const IOERR: i32 = 10;
/// `SQLITE_FULL`: the disk is full.
const FULL: i32 = 13;
/// `SQLITE_CANTOPEN`.
const CANTOPEN: i32 = 14;
/// `SQLITE_TOOBIG`: a value over `SQLITE_MAX_LENGTH`.
const TOOBIG: i32 = 18;
/// `SQLITE_CONSTRAINT`.
const CONSTRAINT: i32 = 19;
/// `SQLITE_MISMATCH`.
const MISMATCH: i32 = 20;
/// `SQLITE_CONSTRAINT_PRIMARYKEY`.
const CONSTRAINT_PRIMARYKEY: i32 = 1555;
/// `SQLITE_CONSTRAINT_UNIQUE`.
const CONSTRAINT_UNIQUE: i32 = 2067;

/// The kind for an SQLite result code (extended or primary); its retryable status is
/// the kind's [`default_status`](ErrorKind::default_status).
///
/// | code | kind |
/// |---|---|
/// | `SQLITE_BUSY*`, `SQLITE_LOCKED*` | Contention (retryable: the lock frees) |
/// | `SQLITE_INTERRUPT` | Timeout |
/// | `SQLITE_IOERR*`, `SQLITE_FULL`, `SQLITE_CANTOPEN*` | Unavailable |
/// | `SQLITE_CONSTRAINT_UNIQUE`, `SQLITE_CONSTRAINT_PRIMARYKEY` | Conflict |
/// | other `SQLITE_CONSTRAINT*`, `SQLITE_TOOBIG`, `SQLITE_MISMATCH` | InvalidInput |
/// | anything else | Storage (or Schema, see [`Sqlite`]) |
pub(crate) fn kind_for_code(code: i32) -> ErrorKind {
    match code {
        CONSTRAINT_UNIQUE | CONSTRAINT_PRIMARYKEY => return ErrorKind::Conflict,
        _ => {}
    }
    match code & 0xff {
        BUSY | LOCKED => ErrorKind::Contention,
        INTERRUPT => ErrorKind::Timeout,
        IOERR | FULL | CANTOPEN => ErrorKind::Unavailable,
        CONSTRAINT | TOOBIG | MISMATCH => ErrorKind::InvalidInput,
        _ => ErrorKind::Storage,
    }
}

/// The SQLite side of [`outbox_sqlx::from_sqlx`]: codes are result codes, and a
/// generic `SQLITE_ERROR` naming a missing table or column is a [`ErrorKind::Schema`]
/// problem (not installed, or installed by another version).
pub(crate) struct Sqlite;

impl ErrorCodes for Sqlite {
    const CODE_LABEL: &'static str = "SQLite code";

    fn database_kind(db: &dyn DatabaseError) -> ErrorKind {
        match db.code().and_then(|c| c.parse::<i32>().ok()) {
            Some(code) => match kind_for_code(code) {
                ErrorKind::Storage if is_schema_message(db.message()) => ErrorKind::Schema,
                kind => kind,
            },
            None => ErrorKind::Storage,
        }
    }
}

/// Map a sqlx error met while doing `what` (for example `"claim"`) to the workspace
/// error, keeping the sqlx error as the source (see [`Sqlite`]).
pub(crate) fn from_sqlx(what: &str, err: sqlx::Error) -> Error {
    outbox_sqlx::from_sqlx::<Sqlite>(what, err)
}

/// SQLite reports a missing table or column as a plain `SQLITE_ERROR` whose message
/// says so.
fn is_schema_message(message: &str) -> bool {
    message.starts_with("no such table") || message.starts_with("no such column")
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorStatus;

    #[test]
    fn result_codes_map_to_kinds() {
        let table = [
            (5, ErrorKind::Contention),
            (517, ErrorKind::Contention), // SQLITE_BUSY_SNAPSHOT
            (773, ErrorKind::Contention), // SQLITE_BUSY_TIMEOUT
            (6, ErrorKind::Contention),
            (262, ErrorKind::Contention), // SQLITE_LOCKED_SHAREDCACHE
            (9, ErrorKind::Timeout),
            (10, ErrorKind::Unavailable),
            (266, ErrorKind::Unavailable), // SQLITE_IOERR_READ
            (13, ErrorKind::Unavailable),
            (14, ErrorKind::Unavailable),
            (2067, ErrorKind::Conflict),
            (1555, ErrorKind::Conflict),
            (19, ErrorKind::InvalidInput),
            (275, ErrorKind::InvalidInput),  // SQLITE_CONSTRAINT_CHECK
            (3091, ErrorKind::InvalidInput), // SQLITE_CONSTRAINT_DATATYPE (STRICT)
            (18, ErrorKind::InvalidInput),
            (20, ErrorKind::InvalidInput),
            (1, ErrorKind::Storage),
            (11, ErrorKind::Storage), // SQLITE_CORRUPT
        ];
        for (code, kind) in table {
            assert_eq!(kind_for_code(code), kind, "code {code}");
        }
        assert!(kind_for_code(5).default_status() == ErrorStatus::Temporary);
        assert!(is_schema_message("no such table: outbox_messages"));
        assert!(is_schema_message("no such column: seq"));
        assert!(!is_schema_message("near \"x\": syntax error"));
    }
}
