//! Gating tests on external services.

/// The variable that turns a missing service from a skip into a failure.
pub const REQUIRE_INTEGRATION: &str = "OUTBOX_REQUIRE_INTEGRATION";

/// The value of the environment variable `var` naming a service URL.
///
/// When it is unset or empty: prints a visible `SKIPPED` line and returns `None`, or,
/// when `OUTBOX_REQUIRE_INTEGRATION=1`, panics so CI fails instead of skipping.
///
/// ```no_run
/// if let Some(url) = outbox_testkit::service_url("MY_BACKEND_URL", "my backend conformance") {
///     // connect to `url` and run the tests
/// }
/// ```
pub fn service_url(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ if integration_required() => panic!(
            "{var} is not set but {REQUIRE_INTEGRATION}=1: {what} must run. \
             Run scripts/services.sh (or set {var}) first."
        ),
        _ => {
            eprintln!("SKIPPED: {what}: {var} is not set (set it, or run scripts/services.sh)");
            None
        }
    }
}

/// Whether `OUTBOX_REQUIRE_INTEGRATION=1` is set.
pub fn integration_required() -> bool {
    std::env::var(REQUIRE_INTEGRATION).is_ok_and(|v| v.trim() == "1")
}
