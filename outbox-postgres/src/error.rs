//! The one place where sqlx errors become [`outbox_core::Error`]s.
//!
//! Server errors are classified by SQLSTATE (PostgreSQL documentation, Appendix A
//! "PostgreSQL Error Codes"); driver errors by their sqlx variant. The cause stays
//! reachable through [`std::error::Error::source`].

use outbox_core::{Error, ErrorKind};
use outbox_sqlx::ErrorCodes;
use sqlx::error::DatabaseError;

/// The kind for a PostgreSQL SQLSTATE code; its retryable status is the kind's
/// [`default_status`](ErrorKind::default_status).
///
/// | code | condition | kind |
/// |---|---|---|
/// | `40001` | serialization_failure | Contention |
/// | `40P01` | deadlock_detected | Contention |
/// | `55P03` | lock_not_available | Contention |
/// | `08xxx` | connection exceptions | Unavailable |
/// | `57P01` `57P02` `57P03` | admin_shutdown, crash_shutdown, cannot_connect_now | Unavailable |
/// | `53xxx` | insufficient resources (disk full, out of memory, too many connections) | Unavailable |
/// | `57014` | query_canceled (statement_timeout) | Timeout |
/// | `23505` | unique_violation | Conflict |
/// | other `23xxx` | integrity constraint violations | InvalidInput |
/// | `22xxx` | data exceptions | InvalidInput |
/// | `42P01` `42703` `3F000` | undefined_table, undefined_column, invalid_schema_name | Schema |
/// | anything else | | Storage |
///
/// Public for crates that talk to PostgreSQL beside this one (the log-tailing relay)
/// and should classify its errors the same way.
pub fn kind_for_sqlstate(code: &str) -> ErrorKind {
    match code {
        "40001" | "40P01" | "55P03" => ErrorKind::Contention,
        "57P01" | "57P02" | "57P03" => ErrorKind::Unavailable,
        "57014" => ErrorKind::Timeout,
        "23505" => ErrorKind::Conflict,
        "42P01" | "42703" | "3F000" => ErrorKind::Schema,
        _ if code.starts_with("08") || code.starts_with("53") => ErrorKind::Unavailable,
        _ if code.starts_with("23") || code.starts_with("22") => ErrorKind::InvalidInput,
        _ => ErrorKind::Storage,
    }
}

/// The PostgreSQL side of [`outbox_sqlx::from_sqlx`]: codes are SQLSTATEs.
pub(crate) struct Pg;

impl ErrorCodes for Pg {
    const CODE_LABEL: &'static str = "SQLSTATE";

    fn database_kind(err: &dyn DatabaseError) -> ErrorKind {
        err.code()
            .map_or(ErrorKind::Storage, |code| kind_for_sqlstate(&code))
    }
}

/// Map a sqlx error met while doing `what` (for example `"claim"`) to the workspace
/// error, keeping the sqlx error as the source; database errors are classified with
/// [`kind_for_sqlstate`].
pub fn from_sqlx(what: &str, err: sqlx::Error) -> Error {
    outbox_sqlx::from_sqlx::<Pg>(what, err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorStatus;

    #[test]
    fn sqlstate_table() {
        let table = [
            ("40001", ErrorKind::Contention),
            ("40P01", ErrorKind::Contention),
            ("55P03", ErrorKind::Contention),
            ("08000", ErrorKind::Unavailable),
            ("08003", ErrorKind::Unavailable),
            ("08006", ErrorKind::Unavailable),
            ("08P01", ErrorKind::Unavailable),
            ("57P01", ErrorKind::Unavailable),
            ("57P02", ErrorKind::Unavailable),
            ("57P03", ErrorKind::Unavailable),
            ("53000", ErrorKind::Unavailable),
            ("53100", ErrorKind::Unavailable),
            ("53200", ErrorKind::Unavailable),
            ("53300", ErrorKind::Unavailable),
            ("57014", ErrorKind::Timeout),
            ("23505", ErrorKind::Conflict),
            ("23502", ErrorKind::InvalidInput),
            ("23503", ErrorKind::InvalidInput),
            ("23514", ErrorKind::InvalidInput),
            ("22001", ErrorKind::InvalidInput),
            ("22021", ErrorKind::InvalidInput),
            ("22P02", ErrorKind::InvalidInput),
            ("42P01", ErrorKind::Schema),
            ("42703", ErrorKind::Schema),
            ("3F000", ErrorKind::Schema),
            ("42601", ErrorKind::Storage),
            ("25P02", ErrorKind::Storage),
            ("XX000", ErrorKind::Storage),
        ];
        for (code, kind) in table {
            assert_eq!(kind_for_sqlstate(code), kind, "SQLSTATE {code}");
        }
    }

    #[test]
    fn transient_kinds_are_retryable() {
        for code in [
            "40001", "40P01", "55P03", "08006", "57P01", "53300", "57014",
        ] {
            assert_eq!(
                kind_for_sqlstate(code).default_status(),
                ErrorStatus::Temporary,
                "SQLSTATE {code}"
            );
        }
        for code in ["23505", "22001", "42P01", "XX000"] {
            assert_eq!(
                kind_for_sqlstate(code).default_status(),
                ErrorStatus::Permanent,
                "SQLSTATE {code}"
            );
        }
    }
}
