//! The macros that turn the dedup, lock and consumer suites into tests.

/// Expands to one `#[tokio::test]` per [`DedupStore`](outbox_core::DedupStore)
/// conformance case.
///
/// `$make` names an `async fn() -> Option<H>` where
/// `H:`[`DedupHarness`](crate::DedupHarness); returning `None` skips the case (after
/// [`service_url`](crate::service_url) printed why). The calling crate needs `tokio`
/// with the `macros` and `rt-multi-thread` features as a dev-dependency. A store that
/// lacks `strong` consistency or `short_retention` says so,
/// `dedup_suite!(make; lacks(short_retention))`, and the cases needing it show as
/// ignored.
///
/// ```no_run
/// use outbox_testkit::MemoryDedupHarness;
///
/// async fn harness() -> Option<MemoryDedupHarness> {
///     Some(MemoryDedupHarness::default())
/// }
///
/// outbox_testkit::dedup_suite!(harness);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! dedup_suite {
    ($make:path) => {
        $crate::dedup_suite!($make; lacks());
    };
    ($make:path; lacks($($lacks:ident),* $(,)?)) => {
        $crate::__suite_known!(dedup: $($lacks),*);
        $crate::__suite_cases!(dedup; [$($lacks)*] $make; plain);
    };
}

/// Expands to one `#[tokio::test]` per [`DistributedLock`](outbox_core::DistributedLock)
/// conformance case.
///
/// `$make` names an `async fn() -> Option<H>` where
/// `H:`[`LockHarness`](crate::LockHarness); returning `None` skips the case. The
/// calling crate needs `tokio` with the `macros` and `rt-multi-thread` features as a
/// dev-dependency. A harness that cannot sever a holder's session says
/// `lock_suite!(make; lacks(sever))`, and that case shows as ignored.
///
/// ```no_run
/// use outbox_testkit::MemoryLockHarness;
///
/// async fn harness() -> Option<MemoryLockHarness> {
///     Some(MemoryLockHarness::default())
/// }
///
/// outbox_testkit::lock_suite!(harness);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! lock_suite {
    ($make:path) => {
        $crate::lock_suite!($make; lacks());
    };
    ($make:path; lacks($($lacks:ident),* $(,)?)) => {
        $crate::__suite_known!(lock: $($lacks),*);
        $crate::__suite_cases!(lock; [$($lacks)*] $make; plain);
    };
}

/// Expands to one `#[tokio::test]` per idempotent-consumer conformance case (the
/// decoupled algorithm over the harness's entity and dedup stores).
///
/// `$make` names an `async fn() -> Option<H>` where
/// `H:`[`ConsumerHarness`](crate::ConsumerHarness); returning `None` skips the case.
/// The calling crate needs `tokio` with the `macros` and `rt-multi-thread` features as
/// a dev-dependency. A dedup store without a retention under a second says
/// `consumer_suite!(make; lacks(short_retention))`, and that case shows as ignored.
///
/// ```no_run
/// use outbox_testkit::MemoryConsumerHarness;
///
/// async fn harness() -> Option<MemoryConsumerHarness> {
///     Some(MemoryConsumerHarness)
/// }
///
/// outbox_testkit::consumer_suite!(harness);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! consumer_suite {
    ($make:path) => {
        $crate::consumer_suite!($make; lacks());
    };
    ($make:path; lacks($($lacks:ident),* $(,)?)) => {
        $crate::__suite_known!(consumer: $($lacks),*);
        $crate::__suite_cases!(consumer; [$($lacks)*] $make; plain);
    };
}
