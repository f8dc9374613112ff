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
        $crate::__suite_group!([$($lacks)*] always; $make; plain;
            dedup_concurrent_records_give_exactly_one_new,
            dedup_declared_consistency_matches_the_harness,
            dedup_ids_are_scoped_by_consumer,
            dedup_consumer_names_follow_the_one_rule,
        );
        $crate::__suite_group!([$($lacks)*] strong; $make; plain;
            dedup_strong_store_reads_its_writes,
        );
        $crate::__suite_group!([$($lacks)*] short_retention; $make; plain;
            dedup_expired_ids_are_new_again_before_any_purge,
            dedup_purge_is_bounded_and_spares_fresh_records,
            dedup_purger_removes_expired_records_under_its_lock,
        );
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
        $crate::__suite_group!([$($lacks)*] always; $make; plain;
            lock_held_elsewhere_is_refused_without_waiting,
            lock_concurrent_try_locks_grant_one,
            lock_names_are_independent,
            lock_unlock_releases_at_once,
            lock_dropped_guard_is_released,
            lock_names_follow_the_one_rule,
        );
        $crate::__suite_group!([$($lacks)*] sever; $make; plain;
            lock_severed_session_releases_the_lock,
        );
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
        $crate::__suite_group!([$($lacks)*] always; $make; plain;
            consumer_concurrent_copies_apply_once,
            consumer_check_after_load_closes_the_article_race,
            consumer_crash_before_dispatch_redispatches_the_same_ids,
            consumer_crash_before_the_record_redispatches_the_same_ids,
            consumer_crash_before_cleanup_ends_with_the_state_removed,
            consumer_cleanup_survives_conflicts_and_removes_leftovers,
            consumer_an_eventually_consistent_store_is_refused,
            consumer_entity_store_checks_versions,
        );
        $crate::__suite_group!([$($lacks)*] short_retention; $make; plain;
            consumer_duplicates_are_detected_until_the_record_expires,
        );
    };
}
