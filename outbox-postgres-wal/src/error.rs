//! The one place where driver errors (sqlx for statements, pgwire-replication for the
//! stream) become [`outbox_core::Error`]s.

use outbox_core::{Error, ErrorKind, ErrorStatus};
use outbox_sqlx::ErrorCodes;
use pgwire_replication::PgWireError;
use sqlx::error::DatabaseError;

/// The kind for a PostgreSQL SQLSTATE (the same table as `outbox-postgres`'s, cut to
/// what this crate's statements can meet).
///
/// | code | condition | kind |
/// |---|---|---|
/// | `40001` `40P01` `55P03` | serialization failure, deadlock, lock not available | Contention |
/// | `08xxx`, `53xxx`, `57P01`..`57P03` | connection, resources, shutdown | Unavailable |
/// | `57014` | query_canceled | Timeout |
/// | `55006` | object_in_use (the slot is active in another session) | Contention |
/// | `23505` | unique_violation | Conflict |
/// | `42P01` `42703` `3F000` | undefined table, column or schema | Schema |
/// | anything else | | Storage |
pub(crate) fn kind_for_sqlstate(code: &str) -> ErrorKind {
    match code {
        "40001" | "40P01" | "55P03" | "55006" => ErrorKind::Contention,
        "57P01" | "57P02" | "57P03" => ErrorKind::Unavailable,
        "57014" => ErrorKind::Timeout,
        "23505" => ErrorKind::Conflict,
        "42P01" | "42703" | "3F000" => ErrorKind::Schema,
        _ if code.starts_with("08") || code.starts_with("53") => ErrorKind::Unavailable,
        _ => ErrorKind::Storage,
    }
}

struct Pg;

impl ErrorCodes for Pg {
    const CODE_LABEL: &'static str = "SQLSTATE";

    fn database_kind(err: &dyn DatabaseError) -> ErrorKind {
        err.code()
            .map_or(ErrorKind::Storage, |code| kind_for_sqlstate(&code))
    }
}

/// A sqlx error met while doing `what`, keeping it as the source.
pub(crate) fn from_sqlx(what: &str, err: sqlx::Error) -> Error {
    outbox_sqlx::from_sqlx::<Pg>(what, err)
}

/// A replication stream error met while doing `what`.
///
/// Network and protocol failures are temporary (the relay reconnects and resumes from
/// the confirmed position); authentication failures are permanent. Server errors are
/// temporary unless the server says the slot can no longer serve changes (an
/// invalidated slot) or does not exist: those stop the relay.
pub(crate) fn from_wire(what: &str, err: PgWireError) -> Error {
    let (kind, status) = match &err {
        PgWireError::Auth(_) | PgWireError::Tls(_) => (ErrorKind::Config, ErrorStatus::Permanent),
        PgWireError::Server(text) if is_invalidated(text) => {
            (ErrorKind::Storage, ErrorStatus::Permanent)
        }
        PgWireError::Server(text) if text.contains("does not exist") => {
            (ErrorKind::Config, ErrorStatus::Permanent)
        }
        _ => (ErrorKind::Unavailable, ErrorStatus::Temporary),
    };
    Error::new(kind, format!("replication stream: {what}: {err}"))
        .with_status(status)
        .with_source(err)
}

/// Whether a server error says the slot was invalidated (PostgreSQL 13+: "can no
/// longer get changes from replication slot", "This slot has been invalidated").
pub(crate) fn is_invalidated(text: &str) -> bool {
    text.contains("can no longer get changes") || text.contains("has been invalidated")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates() {
        assert_eq!(kind_for_sqlstate("40001"), ErrorKind::Contention);
        assert_eq!(kind_for_sqlstate("55006"), ErrorKind::Contention);
        assert_eq!(kind_for_sqlstate("08006"), ErrorKind::Unavailable);
        assert_eq!(kind_for_sqlstate("53300"), ErrorKind::Unavailable);
        assert_eq!(kind_for_sqlstate("57P01"), ErrorKind::Unavailable);
        assert_eq!(kind_for_sqlstate("57014"), ErrorKind::Timeout);
        assert_eq!(kind_for_sqlstate("23505"), ErrorKind::Conflict);
        assert_eq!(kind_for_sqlstate("42P01"), ErrorKind::Schema);
        assert_eq!(kind_for_sqlstate("XX000"), ErrorKind::Storage);
    }

    #[test]
    fn wire_errors() {
        let io = PgWireError::Io(std::sync::Arc::new(std::io::Error::other("reset")));
        assert!(from_wire("recv", io).is_retryable());
        assert!(!from_wire("connect", PgWireError::Auth("bad password".into())).is_retryable());
        let lost = PgWireError::Server(
            "ERROR: can no longer get changes from replication slot \"s\"".into(),
        );
        assert!(!from_wire("start", lost).is_retryable());
        let missing = PgWireError::Server("replication slot \"s\" does not exist".into());
        assert_eq!(from_wire("start", missing).kind(), ErrorKind::Config);
        let active = PgWireError::Server("replication slot \"s\" is active for PID 7".into());
        assert!(from_wire("start", active).is_retryable());
    }
}
