//! The macro that turns the publisher suite into tests.

/// Expands to one `#[tokio::test]` per [`Publisher`](outbox_core::Publisher)
/// conformance case.
///
/// `$make` names an `async fn() -> Option<H>` where
/// `H:`[`PublisherHarness`](crate::PublisherHarness); returning `None` skips the case
/// (after [`service_url`](crate::service_url) printed why). The calling crate needs
/// `tokio` with the `macros` and `rt-multi-thread` features as a dev-dependency.
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
        $crate::publisher_suite!(@cases $make;
            publisher_returns_one_outcome_per_message_in_batch_order,
            publisher_delivers_headers_content_type_key_and_payload,
            publisher_sends_the_message_id_as_the_dedup_id,
            publisher_repeat_of_an_id_is_dropped_within_the_dedup_window,
            publisher_unroutable_is_permanent_and_spares_the_batch,
            publisher_concurrent_calls_all_land,
            publisher_large_batch,
            publisher_broker_restart_is_retryable_and_the_publisher_recovers,
        );
    };
    (@cases $make:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[cfg_attr(outbox_service_unset, ignore = "the backend's service URL was not set when these tests were built: run scripts/services.sh (see the build warning)")]
            async fn $case() {
                let Some(harness) = $make().await else { return };
                $crate::suite::$case(&harness).await;
            }
        )*
    };
}
