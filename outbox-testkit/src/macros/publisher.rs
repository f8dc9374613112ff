//! The macro that turns the publisher suite into tests.

/// Expands to one `#[tokio::test]` per [`Publisher`](outbox_core::Publisher)
/// conformance case.
///
/// `$make` names an `async fn() -> Option<H>` where
/// `H:`[`PublisherHarness`](crate::PublisherHarness); returning `None` skips the case
/// (after [`service_url`](crate::service_url) printed why). The calling crate needs
/// `tokio` with the `macros` and `rt-multi-thread` features as a dev-dependency. A
/// broker that lacks a [`PublisherFeatures`](crate::PublisherFeatures) capability says
/// so, `publisher_suite!(make; lacks(dedup_window))`, and the cases needing it show as
/// ignored.
///
/// ```no_run
/// use outbox_testkit::MemoryPublisherHarness;
///
/// async fn harness() -> Option<MemoryPublisherHarness> {
///     Some(MemoryPublisherHarness)
/// }
///
/// outbox_testkit::publisher_suite!(harness);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! publisher_suite {
    ($make:path) => {
        $crate::publisher_suite!($make; lacks());
    };
    ($make:path; lacks($($lacks:ident),* $(,)?)) => {
        $crate::__suite_known!(publisher: $($lacks),*);
        $crate::__suite_cases!(publisher; [$($lacks)*] $make; plain);
    };
}
