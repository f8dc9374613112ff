//! The macro that turns the plan suite into tests.

/// Expands to one `#[tokio::test]` per plan case: each loads a fresh store with
/// history, without statistics, and fails if a statement a relay sends scans the
/// outbox table, or reaches rows it names other than by key.
///
/// `$make` names an `async fn() -> Option<H>` where
/// `H:`[`PlanHarness`](crate::PlanHarness); returning `None` skips the case (after
/// [`service_url`](crate::service_url) printed why). Backends without a query planner
/// (DynamoDB reads by key by construction) do not run it. The calling crate needs
/// `tokio` with the `macros` and `rt-multi-thread` features as a dev-dependency.
#[macro_export]
macro_rules! plan_suite {
    ($make:path) => {
        $crate::__suite_cases!(plan; [] $make; plain);
    };
}
