//! [`from_sqlx`]: sqlx errors as [`outbox_core::Error`]s.

use outbox_core::{Error, ErrorKind, ErrorStatus};
use sqlx::error::DatabaseError;

/// How a backend reads its database's errors: what [`from_sqlx`] needs of it. Implement
/// it on a private marker type next to the backend's code table (`error.rs`).
pub trait ErrorCodes {
    /// How messages name a database error code: `"SQLSTATE"`, `"SQLite code"`.
    const CODE_LABEL: &'static str;

    /// The kind of an error the database reported; its retryable status is the kind's
    /// [`default_status`](ErrorKind::default_status).
    fn database_kind(err: &dyn DatabaseError) -> ErrorKind;
}

/// Map a sqlx error met while doing `what` (for example `"claim"`) to the workspace
/// error, keeping the sqlx error as the source. The message is `"{what} failed"`, with
/// `" ({CODE_LABEL} {code})"` when the database gave a code; the driver's own text is
/// the source's, printed by `Error::report` once.
///
/// | sqlx error | kind |
/// |---|---|
/// | `Database` | [`ErrorCodes::database_kind`] |
/// | `Io`, `Tls`, `Protocol`, `WorkerCrashed` | Unavailable |
/// | `PoolTimedOut` | Timeout |
/// | `PoolClosed` | Unavailable, permanent: a closed pool never reopens |
/// | `Decode`, `ColumnDecode`, `ColumnNotFound`, `ColumnIndexOutOfBounds`, `TypeNotFound` | Decode |
/// | `Encode`, `InvalidArgument` | InvalidInput |
/// | `Configuration` | Config |
/// | anything else | Storage |
pub fn from_sqlx<C: ErrorCodes>(what: &str, err: sqlx::Error) -> Error {
    let (kind, status) = classify::<C>(&err);
    let message = match &err {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => format!("{what} failed ({} {code})", C::CODE_LABEL),
            None => format!("{what} failed"),
        },
        _ => format!("{what} failed"),
    };
    Error::new(kind, message)
        .with_status(status)
        .with_source(err)
}

fn classify<C: ErrorCodes>(err: &sqlx::Error) -> (ErrorKind, ErrorStatus) {
    use sqlx::Error as E;
    let kind = match err {
        E::Database(db) => C::database_kind(db.as_ref()),
        E::Io(_) | E::Tls(_) | E::Protocol(_) | E::WorkerCrashed => ErrorKind::Unavailable,
        E::PoolTimedOut => ErrorKind::Timeout,
        // A closed pool never reopens: unavailable, and retrying will not help.
        E::PoolClosed => return (ErrorKind::Unavailable, ErrorStatus::Permanent),
        E::Decode(_)
        | E::ColumnDecode { .. }
        | E::ColumnNotFound(_)
        | E::ColumnIndexOutOfBounds { .. }
        | E::TypeNotFound { .. } => ErrorKind::Decode,
        E::Encode(_) | E::InvalidArgument(_) => ErrorKind::InvalidInput,
        E::Configuration(_) => ErrorKind::Config,
        _ => ErrorKind::Storage,
    };
    (kind, kind.default_status())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    struct Codes;
    impl ErrorCodes for Codes {
        const CODE_LABEL: &'static str = "code";
        fn database_kind(_: &dyn DatabaseError) -> ErrorKind {
            ErrorKind::Conflict
        }
    }

    #[test]
    fn driver_errors() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let cases = [
            (sqlx::Error::Io(io), ErrorKind::Unavailable, true),
            (sqlx::Error::Tls("tls".into()), ErrorKind::Unavailable, true),
            (
                sqlx::Error::Protocol("eof".into()),
                ErrorKind::Unavailable,
                true,
            ),
            (sqlx::Error::PoolTimedOut, ErrorKind::Timeout, true),
            (sqlx::Error::PoolClosed, ErrorKind::Unavailable, false),
            (sqlx::Error::Decode("bad".into()), ErrorKind::Decode, false),
            (
                sqlx::Error::ColumnNotFound("x".into()),
                ErrorKind::Decode,
                false,
            ),
            (
                sqlx::Error::InvalidArgument("x".into()),
                ErrorKind::InvalidInput,
                false,
            ),
            (
                sqlx::Error::Configuration("x".into()),
                ErrorKind::Config,
                false,
            ),
            (sqlx::Error::RowNotFound, ErrorKind::Storage, false),
        ];
        for (err, kind, retryable) in cases {
            let text = err.to_string();
            let mapped = from_sqlx::<Codes>("claim", err);
            assert_eq!(mapped.kind(), kind, "{text}");
            assert_eq!(mapped.is_retryable(), retryable, "{text}");
            assert_eq!(mapped.message(), "claim failed");
            assert!(mapped.source().is_some());
        }
    }
}
