//! The one place where sqlx errors become [`outbox_core::Error`]s.
//!
//! Server errors are classified by their MySQL/MariaDB error number (MySQL Server Error
//! Message Reference; MariaDB Error Codes); messages show the SQLSTATE, the number is in
//! the source. Driver errors map by their sqlx variant ([`outbox_sqlx::from_sqlx`]).

use outbox_core::{Error, ErrorKind};
use outbox_sqlx::ErrorCodes;
use sqlx::error::DatabaseError;
use sqlx::mysql::MySqlDatabaseError;

/// The kind for a server error number; its retryable status is the kind's
/// [`default_status`](ErrorKind::default_status).
pub(crate) fn kind_for_number(number: u16) -> ErrorKind {
    match number {
        // Lock wait timeout, deadlock, NOWAIT lock refused.
        1205 | 1213 | 3572 => ErrorKind::Contention,
        // Too many connections, shutdown, aborted or killed connection, network errors.
        1040 | 1053 | 1077 | 1152 | 1158..=1161 | 1927 => ErrorKind::Unavailable,
        // Statement time limit (MySQL, MariaDB), query interrupted.
        3024 | 1969 | 1317 => ErrorKind::Timeout,
        1062 | 1586 => ErrorKind::Conflict, // Duplicate key.
        // Null, range, value, length, foreign key, JSON and CHECK violations.
        1048 | 1264 | 1292 | 1366 | 1406 | 1452 | 3140 | 3819 | 4025 => ErrorKind::InvalidInput,
        1049 | 1054 | 1146 => ErrorKind::Schema, // Unknown database, column, table.
        _ => ErrorKind::Storage,
    }
}

/// The server error number of `err`, if it is a MySQL error.
pub(crate) fn number(err: &sqlx::Error) -> Option<u16> {
    err.as_database_error()?
        .try_downcast_ref::<MySqlDatabaseError>()
        .map(MySqlDatabaseError::number)
}

/// The MySQL side of [`outbox_sqlx::from_sqlx`].
pub(crate) struct MySql;

impl ErrorCodes for MySql {
    const CODE_LABEL: &'static str = "SQLSTATE";

    fn database_kind(err: &dyn DatabaseError) -> ErrorKind {
        err.try_downcast_ref::<MySqlDatabaseError>()
            .map_or(ErrorKind::Storage, |e| kind_for_number(e.number()))
    }
}

/// Map a sqlx error met while doing `what` to the workspace error, keeping the sqlx
/// error as the source.
pub(crate) fn from_sqlx(what: &str, err: sqlx::Error) -> Error {
    outbox_sqlx::from_sqlx::<MySql>(what, err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorStatus;

    #[test]
    fn error_number_table() {
        use ErrorKind::*;
        let table = [
            (1205, Contention),
            (1213, Contention),
            (3572, Contention),
            (1040, Unavailable),
            (1053, Unavailable),
            (1159, Unavailable),
            (1927, Unavailable),
            (3024, Timeout),
            (1969, Timeout),
            (1062, Conflict),
            (1586, Conflict),
            (1406, InvalidInput),
            (4025, InvalidInput),
            (1146, Schema),
            (1054, Schema),
            (1049, Schema),
            (1064, Storage),
        ];
        for (number, kind) in table {
            assert_eq!(kind_for_number(number), kind, "error {number}");
        }
        assert_eq!(
            kind_for_number(1213).default_status(),
            ErrorStatus::Temporary
        );
        assert_eq!(
            kind_for_number(1062).default_status(),
            ErrorStatus::Permanent
        );
    }
}
