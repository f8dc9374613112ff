//! The one place where tiberius and pool errors become [`outbox_core::Error`]s.
//!
//! Server errors are classified by their SQL Server error number. The numbers were
//! checked against Microsoft's documentation:
//!
//! - 1205 (`LK_VICTIM`, "chosen as the deadlock victim. Rerun the transaction"): the
//!   `MSSQLSERVER_1205` page of the Database Engine errors reference.
//! - 1222 ("Lock request time out period exceeded", raised when `LOCK_TIMEOUT`
//!   elapses) and 1204 ("cannot obtain a LOCK resource at this time"): the
//!   "Customizing the lock time-out" page and Microsoft.Data.SqlClient's
//!   `SqlConfigurableRetryFactory` transient list.
//! - 4060, 40197, 40501, 40613, 49918, 49919, 49920, 4221, 615, 926: Azure SQL's
//!   "List of transient fault error codes" (*Troubleshooting connectivity issues and
//!   other errors*); 10928 / 10929 (resource limits) and 40540 from the same family, as
//!   retried by EF's `SqlAzureExecutionStrategy`.
//! - 3960 (snapshot isolation update conflict) and 3635/3928-style aborts are not
//!   produced by this crate's statements, which run at READ COMMITTED; 3960 is still
//!   mapped as contention for callers' `SNAPSHOT` transactions.
//! - 2627 (violation of a PRIMARY KEY or UNIQUE constraint) and 2601 (duplicate key
//!   row in a unique index): the Database Engine errors reference, 2000-2999.
//! - 208 (invalid object name), 207 (invalid column name), 2812 (could not find stored
//!   procedure), 2760 (specified schema name does not exist).
//!
//! Driver errors are classified by their tiberius variant; the cause stays reachable
//! through [`std::error::Error::source`], never in the message.

use outbox_core::{Error, ErrorKind};

/// The kind for a SQL Server error number; its retryable status is the kind's
/// [`default_status`](ErrorKind::default_status).
///
/// | number | condition | kind |
/// |---|---|---|
/// | 1205 | deadlock victim | Contention |
/// | 1222 | lock request time-out (`LOCK_TIMEOUT`) | Contention |
/// | 1204 | cannot obtain a LOCK resource | Contention |
/// | 3960 | snapshot isolation update conflict | Contention |
/// | 40501 | service busy (throttling) | Contention |
/// | 10928, 10929 | resource limit reached / server too busy | Contention |
/// | 49918, 49919, 49920 | not enough resources / too many operations | Contention |
/// | 40613 | database not currently available | Unavailable |
/// | 40197, 40540 | service error processing the request (failover) | Unavailable |
/// | 4060 | cannot open database (transient during Azure reconfiguration) | Unavailable |
/// | 4221, 615, 926 | replica or database briefly unavailable during reconfiguration | Unavailable |
/// | 233, 64, 20, 10053, 10054, 10060 | transport-level connection errors | Unavailable |
/// | 2627, 2601 | unique constraint / unique index violation | Conflict |
/// | 515, 547, 8152, 2628, 8114, 8115, 245, 220 | NULL, constraint, truncation, conversion, overflow | InvalidInput |
/// | 208, 207, 2812, 2760 | missing object, column, procedure or schema | Schema |
/// | anything else | | Storage |
pub(crate) fn kind_for_number(number: u32) -> ErrorKind {
    match number {
        1205 | 1222 | 1204 | 3960 | 40501 | 10928 | 10929 | 49918 | 49919 | 49920 => {
            ErrorKind::Contention
        }
        40613 | 40197 | 40540 | 4060 | 4221 | 615 | 926 | 233 | 64 | 20 | 10053 | 10054 | 10060 => {
            ErrorKind::Unavailable
        }
        2627 | 2601 => ErrorKind::Conflict,
        515 | 547 | 8152 | 2628 | 8114 | 8115 | 245 | 220 => ErrorKind::InvalidInput,
        208 | 207 | 2812 | 2760 => ErrorKind::Schema,
        _ => ErrorKind::Storage,
    }
}

/// Map a tiberius error met while doing `what` (for example `"claim"`) to the
/// workspace error, keeping the tiberius error as the source.
pub(crate) fn from_tiberius(what: &str, err: tiberius::error::Error) -> Error {
    use tiberius::error::Error as E;
    let (kind, message) = match &err {
        E::Server(token) => (
            kind_for_number(token.code()),
            format!("{what} failed (SQL Server error {})", token.code()),
        ),
        E::Io { .. } | E::Tls(_) | E::Protocol(_) | E::Routing { .. } => {
            (ErrorKind::Unavailable, format!("{what} failed"))
        }
        E::Conversion(_) | E::Utf8 | E::Utf16 | E::ParseInt(_) | E::Encoding(_) => {
            (ErrorKind::Decode, format!("{what} failed"))
        }
        E::BulkInput(_) => (ErrorKind::InvalidInput, format!("{what} failed")),
        #[allow(unreachable_patterns)]
        _ => (ErrorKind::Storage, format!("{what} failed")),
    };
    Error::new(kind, message)
        .with_status(kind.default_status())
        .with_source(err)
}

/// Map an error of connecting (bb8-tiberius's manager) met while doing `what`.
pub(crate) fn from_connect(what: &str, err: bb8_tiberius::Error) -> Error {
    match err {
        bb8_tiberius::Error::Tiberius(e) => from_tiberius(what, e),
        bb8_tiberius::Error::Io(e) => {
            Error::new(ErrorKind::Unavailable, format!("{what} failed")).with_source(e)
        }
    }
}

/// Map an error of taking a connection from the pool met while doing `what`.
pub(crate) fn from_pool(what: &str, err: bb8::RunError<bb8_tiberius::Error>) -> Error {
    match err {
        bb8::RunError::User(e) => from_connect(what, e),
        bb8::RunError::TimedOut => Error::new(
            ErrorKind::Timeout,
            format!("{what} failed: timed out waiting for a pooled connection"),
        ),
    }
}

/// Whether `err` is a server error with one of these numbers.
pub(crate) fn has_number(err: &tiberius::error::Error, numbers: &[u32]) -> bool {
    err.code().is_some_and(|code| numbers.contains(&code))
}

/// A decode error for rows of an unexpected shape.
pub(crate) fn decode_error(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Decode, message)
}

/// The status a caller should give an error of `kind`: the kind's default.
#[cfg(test)]
fn status(kind: ErrorKind) -> outbox_core::ErrorStatus {
    kind.default_status()
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorStatus;
    use std::error::Error as _;

    /// Every number the brief and the Microsoft pages name, with its kind.
    const TABLE: &[(u32, ErrorKind)] = &[
        (1205, ErrorKind::Contention),
        (1222, ErrorKind::Contention),
        (1204, ErrorKind::Contention),
        (3960, ErrorKind::Contention),
        (40501, ErrorKind::Contention),
        (10928, ErrorKind::Contention),
        (10929, ErrorKind::Contention),
        (49918, ErrorKind::Contention),
        (49919, ErrorKind::Contention),
        (49920, ErrorKind::Contention),
        (40613, ErrorKind::Unavailable),
        (40197, ErrorKind::Unavailable),
        (40540, ErrorKind::Unavailable),
        (4060, ErrorKind::Unavailable),
        (4221, ErrorKind::Unavailable),
        (615, ErrorKind::Unavailable),
        (926, ErrorKind::Unavailable),
        (233, ErrorKind::Unavailable),
        (64, ErrorKind::Unavailable),
        (20, ErrorKind::Unavailable),
        (10053, ErrorKind::Unavailable),
        (10054, ErrorKind::Unavailable),
        (10060, ErrorKind::Unavailable),
        (2627, ErrorKind::Conflict),
        (2601, ErrorKind::Conflict),
        (515, ErrorKind::InvalidInput),
        (547, ErrorKind::InvalidInput),
        (8152, ErrorKind::InvalidInput),
        (2628, ErrorKind::InvalidInput),
        (8114, ErrorKind::InvalidInput),
        (8115, ErrorKind::InvalidInput),
        (245, ErrorKind::InvalidInput),
        (220, ErrorKind::InvalidInput),
        (208, ErrorKind::Schema),
        (207, ErrorKind::Schema),
        (2812, ErrorKind::Schema),
        (2760, ErrorKind::Schema),
        (102, ErrorKind::Storage),
        (50000, ErrorKind::Storage),
        (0, ErrorKind::Storage),
    ];

    #[test]
    fn error_number_table() {
        for &(number, kind) in TABLE {
            assert_eq!(kind_for_number(number), kind, "error {number}");
        }
    }

    #[test]
    fn transient_numbers_are_retryable_and_conflicts_are_not() {
        for number in [
            1205, 1222, 1204, 40501, 40613, 40197, 49918, 49919, 49920, 4060, 10928, 233,
        ] {
            assert_eq!(
                status(kind_for_number(number)),
                ErrorStatus::Temporary,
                "error {number}"
            );
        }
        for number in [2627, 2601, 208, 207, 515, 102] {
            assert_eq!(
                status(kind_for_number(number)),
                ErrorStatus::Permanent,
                "error {number}"
            );
        }
    }

    #[test]
    fn driver_errors() {
        use tiberius::error::Error as E;
        let cases = [
            (
                E::Io {
                    kind: std::io::ErrorKind::ConnectionReset,
                    message: "reset".into(),
                },
                ErrorKind::Unavailable,
                true,
            ),
            (E::Protocol("eof".into()), ErrorKind::Unavailable, true),
            (E::Tls("handshake".into()), ErrorKind::Unavailable, true),
            (
                E::Routing {
                    host: "h".into(),
                    port: 1,
                },
                ErrorKind::Unavailable,
                true,
            ),
            (E::Conversion("bad".into()), ErrorKind::Decode, false),
            (E::Utf16, ErrorKind::Decode, false),
        ];
        for (err, kind, retryable) in cases {
            let text = err.to_string();
            let mapped = from_tiberius("claim", err);
            assert_eq!(mapped.kind(), kind, "{text}");
            assert_eq!(mapped.is_retryable(), retryable, "{text}");
            assert_eq!(mapped.message(), "claim failed");
            assert!(mapped.source().is_some());
        }
        let io = bb8_tiberius::Error::Io(std::io::Error::other("refused"));
        let mapped = from_connect("connect", io);
        assert_eq!(mapped.kind(), ErrorKind::Unavailable);
        assert!(mapped.is_retryable());
        let timed_out = from_pool("claim", bb8::RunError::TimedOut);
        assert_eq!(timed_out.kind(), ErrorKind::Timeout);
        assert!(timed_out.is_retryable());
        assert!(!has_number(&E::Utf8, &[2627]));
    }
}
