//! Test plumbing for server-backed backends: names that isolate each test, stale
//! fixtures a later run may drop, and driver errors as core errors.
//!
//! Each fixture gets its own schema, table or key prefix named
//! `obx_<unix seconds>_<12 hex digits>` ([`unique_name`]), so tests run in parallel
//! and never see each other's rows. A test that crashes leaves its fixture behind; the
//! next run drops whatever [`is_stale`] says is older than [`STALE_AFTER`], once per
//! test binary (a `OnceCell` in the backend's `tests/common`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_core::{Error, ErrorKind};

/// How old a test fixture must be before another run may drop it: longer than any
/// test binary runs.
pub const STALE_AFTER: Duration = Duration::from_secs(3600);

/// The prefix every fixture name starts with.
pub const PREFIX: &str = "obx_";

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh fixture name, `obx_<unix seconds>_<12 hex digits>`: lower-case ASCII
/// letters, digits and `_` only, so it is a plain identifier on every engine.
pub fn unique_name() -> String {
    let rand = uuid::Uuid::new_v4().simple().to_string();
    format!("{PREFIX}{}_{}", unix_seconds(), &rand[..12])
}

/// Whether `name` is a fixture name ([`unique_name`], optionally followed by `_` and
/// more lower-case ASCII, digits and `_`) made more than [`STALE_AFTER`] ago. Other
/// names, whatever they look like, are never stale: a cleanup drops only what tests
/// made.
pub fn is_stale(name: &str) -> bool {
    let cutoff = unix_seconds().saturating_sub(STALE_AFTER.as_secs());
    let Some(rest) = name.strip_prefix(PREFIX) else {
        return false;
    };
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    let mut parts = rest.split('_');
    let secs = parts.next().and_then(|s| s.parse::<u64>().ok());
    let random = parts
        .next()
        .is_some_and(|r| r.len() == 12 && r.bytes().all(|b| b.is_ascii_hexdigit()));
    plain && random && secs.is_some_and(|s| s < cutoff)
}

/// A driver error from test plumbing, as a core [`ErrorKind::Storage`] error.
pub fn plumbing_error(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::new(ErrorKind::Storage, "test plumbing failed").with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_names_are_plain_and_not_stale() {
        let name = unique_name();
        assert!(name.starts_with("obx_"), "{name}");
        assert_eq!(name.len(), "obx_".len() + 10 + 1 + 12, "{name}");
        assert!(!is_stale(&name));
        assert!(!is_stale(&format!("{name}_outbox")));
        assert_ne!(unique_name(), unique_name());
    }

    #[test]
    fn only_old_fixture_names_are_stale() {
        let old = unix_seconds() - STALE_AFTER.as_secs() - 10;
        assert!(is_stale(&format!("obx_{old}_0123456789ab")));
        assert!(is_stale(&format!("obx_{old}_0123456789ab_dedup")));
        // Not made by a test: another prefix, upper case, no random part, not hex.
        assert!(!is_stale(&format!("app_{old}_0123456789ab")));
        assert!(!is_stale(&format!("obx_{old}_0123456789AB")));
        assert!(!is_stale(&format!("obx_{old}")));
        assert!(!is_stale(&format!("obx_{old}_0123456789zz")));
        assert!(!is_stale("obx_orders"));
        let recent = unix_seconds() - 10;
        assert!(!is_stale(&format!("obx_{recent}_0123456789ab")));
    }
}
