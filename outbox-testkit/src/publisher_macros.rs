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
        $crate::__suite_group!([$($lacks)*] always; $make; plain;
            publisher_returns_one_outcome_per_message_in_batch_order,
            publisher_delivers_headers_content_type_key_and_payload,
            publisher_sends_the_message_id_as_the_dedup_id,
            publisher_concurrent_calls_all_land,
            publisher_large_batch,
        );
        $crate::__suite_group!([$($lacks)*] dedup_window; $make; plain;
            publisher_repeat_of_an_id_is_dropped_within_the_dedup_window,
        );
        $crate::__suite_group!([$($lacks)*] unroutable_is_permanent; $make; plain;
            publisher_unroutable_is_permanent_and_spares_the_batch,
        );
        $crate::__suite_group!([$($lacks)*] broker_restart; $make; plain;
            publisher_broker_restart_is_retryable_and_the_publisher_recovers,
        );
    };
}
