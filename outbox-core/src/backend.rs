//! Helpers for backend authors: what every storage backend needs besides the traits,
//! written once. Users of the library do not need this module; a crate that implements
//! [`OutboxStore`](crate::OutboxStore) and friends uses it so that the rules (message
//! limits, identifier rules, bounded error text, bound-parameter conversions) are the
//! same on every backend.

use std::time::Duration;

use crate::error::{Error, Result};

pub mod admin;
pub mod claim;
pub mod config;
mod enqueue;
pub mod entity;
pub mod held;
pub mod ident;
mod send_checks;
pub mod session_lock;

pub use crate::backoff::Backoff;
pub use crate::bounds::{bounded_error, in_id_order, validate_identifier, validate_lease};
pub use crate::message_parts::MessageParts;
pub use crate::schema::Schema;
pub use crate::store::default_settle::settle_then_claim;
#[doc(inline)]
pub use crate::{backend_send_checks, schema_from_inherent};
pub use admin::{dead_target, purge_limit, DeadChange, DeadTarget};
pub use claim::{finish_claim, release_claim, ClaimDecoder, CommittedClaim, DecodedClaim};
pub use config::{
    DedupTable, EntityTable, OutboxTable, SchemaRules, TableConfig, TableKind, TableOnlyRules,
    TableRules,
};
pub use enqueue::check_enqueue;
pub use entity::{entity_version, loaded_entity, stored_entity_version};
pub use held::{HeldBatches, HeldEngine, HeldRows, HeldSelect, HeldWhich};
pub use ident::{derived_identifier, QualifiedName, SqlDialect};
pub use session_lock::{LockSession, SessionLockGuard};

/// A duration as whole microseconds, for binding as a 64-bit integer.
///
/// # Errors
/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming `what` when it
/// does not fit (over about 292,000 years).
pub fn micros(what: &str, d: Duration) -> Result<i64> {
    i64::try_from(d.as_micros())
        .map_err(|_| Error::invalid_input(format!("{what} of {d:?} is too long")))
}

/// A duration as whole microseconds, saturating at `i64::MAX`: for ages, where "older
/// than anything" is what a huge value means. A backend whose clock arithmetic
/// overflows before that clamps further itself.
pub fn age_micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A row count for binding as `LIMIT` / `TOP`, clamped to `i64::MAX`: no table holds
/// that many rows, so the result is the same.
pub fn limit_param(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The error of an install that finds `table` recorded at layout version `found` when
/// the backend expects `expected`: [`ErrorKind::Schema`](crate::ErrorKind::Schema),
/// never an attempt to change a table of another layout.
pub fn layout_mismatch(table: &dyn std::fmt::Display, found: i64, expected: i64) -> Error {
    Error::new(
        crate::ErrorKind::Schema,
        format!("table {table} is at layout version {found}, this crate expects {expected}"),
    )
}

/// The statements of a checked-in DDL file (`sql/*.sql`): its lines without the `--`
/// comment lines, each ending in a newline, to compare with what `ddl()` renders.
pub fn ddl_file_statements(file: &str) -> String {
    file.lines()
        .filter(|l| !l.starts_with("--"))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn durations_and_counts_become_bound_integers() {
        assert_eq!(micros("x", Duration::from_millis(3)).unwrap(), 3000);
        let err = micros("lease", Duration::MAX).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("lease"), "{err}");
        assert_eq!(age_micros(Duration::from_micros(7)), 7);
        assert_eq!(age_micros(Duration::MAX), i64::MAX);
        assert_eq!(limit_param(0), 0);
        assert_eq!(limit_param(5), 5);
        assert_eq!(limit_param(usize::MAX), i64::MAX);
        let err = layout_mismatch(&"t", 7, 1);
        assert_eq!(err.kind(), ErrorKind::Schema);
        assert_eq!(
            err.message(),
            "table t is at layout version 7, this crate expects 1"
        );
        assert_eq!(ddl_file_statements("-- c\nA;\n\nB;"), "A;\n\nB;\n");
    }
}
