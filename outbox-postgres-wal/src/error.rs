//! The one place where driver errors (sqlx for statements, pgwire-replication for the
//! stream) become [`outbox_core::Error`]s.

use outbox_core::{Error, ErrorKind, ErrorStatus};
use pgwire_replication::PgWireError;

/// The kind for a PostgreSQL SQLSTATE: `outbox-postgres`'s table
/// ([`outbox_postgres::kind_for_sqlstate`]), plus `55006` (object_in_use: the slot is
/// active in another session) as Contention.
pub(crate) fn kind_for_sqlstate(code: &str) -> ErrorKind {
    match code {
        "55006" => ErrorKind::Contention,
        _ => outbox_postgres::kind_for_sqlstate(code),
    }
}

/// A sqlx error met while doing `what`, keeping it as the source (classified as
/// `outbox-postgres` classifies its own).
pub(crate) fn from_sqlx(what: &str, err: sqlx::Error) -> Error {
    outbox_postgres::from_sqlx(what, err)
}

/// A replication stream error met while doing `what`.
///
/// Network and protocol failures are temporary (the relay reconnects and resumes from
/// the confirmed position); authentication failures are permanent. A server error is
/// classified by its SQLSTATE: `42704` (undefined_object: the slot or the publication
/// does not exist) and class `28` (invalid authorization) are permanent
/// configuration errors; every other one is temporary. Whether the slot can still
/// serve changes (an invalidated slot) is not read from the error's text: the relay
/// asks the server about the slot after every temporary failure and stops when the
/// slot is invalidated or gone.
pub(crate) fn from_wire(what: &str, err: PgWireError) -> Error {
    let (kind, status) = match &err {
        PgWireError::Auth(_) | PgWireError::Tls(_) => (ErrorKind::Config, ErrorStatus::Permanent),
        PgWireError::Server(text) => match sqlstate(text) {
            Some("42704") => (ErrorKind::Config, ErrorStatus::Permanent),
            Some(code) if code.starts_with("28") => (ErrorKind::Config, ErrorStatus::Permanent),
            Some(code) => (kind_for_sqlstate(code), ErrorStatus::Temporary),
            None => (ErrorKind::Unavailable, ErrorStatus::Temporary),
        },
        _ => (ErrorKind::Unavailable, ErrorStatus::Temporary),
    };
    // The driver's text reaches the report once, as the source.
    Error::new(kind, format!("replication stream: {what} failed"))
        .with_status(status)
        .with_source(err)
}

/// The SQLSTATE pgwire-replication appends to a server error's text (`... (SQLSTATE
/// 42704)`).
fn sqlstate(text: &str) -> Option<&str> {
    let at = text.rfind("(SQLSTATE ")? + "(SQLSTATE ".len();
    let code = text.get(at..at + 5)?;
    (code.bytes().all(|b| b.is_ascii_alphanumeric()) && text[at + 5..].starts_with(')'))
        .then_some(code)
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
        let missing =
            PgWireError::Server("replication slot \"s\" does not exist (SQLSTATE 42704)".into());
        let missing = from_wire("start", missing);
        assert_eq!(missing.kind(), ErrorKind::Config);
        assert!(!missing.is_retryable());
        let auth = PgWireError::Server("password authentication failed (SQLSTATE 28P01)".into());
        assert!(!from_wire("connect", auth).is_retryable());
        // An invalidated slot (55000) is temporary here: the relay then reads the slot's
        // state and stops on what the server reports, whatever the message's language.
        let lost =
            PgWireError::Server("ne peut plus obtenir de modifications (SQLSTATE 55000)".into());
        assert!(from_wire("start", lost).is_retryable());
        let active = PgWireError::Server(
            "replication slot \"s\" is active for PID 7 (SQLSTATE 55006)".into(),
        );
        let active = from_wire("start", active);
        assert!(active.is_retryable());
        assert_eq!(active.kind(), ErrorKind::Contention);
        // Text alone never makes an error permanent.
        let text = PgWireError::Server("replication slot \"s\" does not exist".into());
        assert!(from_wire("start", text).is_retryable());
        assert_eq!(sqlstate("x (SQLSTATE 42704)"), Some("42704"));
        assert_eq!(sqlstate("x (SQLSTATE 427"), None);
    }
}
