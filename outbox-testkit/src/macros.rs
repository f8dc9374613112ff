//! The macro that turns the suite into tests.

/// Expands to one `#[tokio::test]` per conformance case, and, in a module
/// `pipelining_off`, one more per case that runs relays, with
/// [`RelayConfig::pipeline_depth`](outbox_core::RelayConfig::pipeline_depth) 1 (the
/// cases themselves run relays at the default depth).
///
/// `$make` names an `async fn() -> Option<H>` where `H:`[`Harness`](crate::Harness);
/// returning `None` skips the case (after [`service_url`](crate::service_url) printed
/// why). The calling crate needs `tokio` with the `macros` and `rt-multi-thread`
/// features as a dev-dependency.
///
/// A backend that lacks a capability says so after the harness, and the cases that
/// need it show in cargo's summary as ignored, with the reason:
/// `conformance_suite!(make; lacks(row_locks, lease_renewal))`. The capabilities are
/// the fields of [`Features`](crate::Features) (`per_key_ordering`, `keep_retention`,
/// `transactional_enqueue`, `row_locks`) and the store's `lease_renewal`; a name the
/// suite does not know fails to compile. A case that runs fails if the harness or
/// store does not declare what it needs, so the list here must match
/// [`Harness::features`](crate::Harness::features) and
/// [`StoreCapabilities`](outbox_core::StoreCapabilities).
///
/// See the [crate docs](crate#adding-a-backend) for a complete example.
#[macro_export]
macro_rules! conformance_suite {
    ($make:path) => {
        $crate::conformance_suite!($make; lacks());
    };
    ($make:path; lacks($($lacks:ident),* $(,)?)) => {
        $crate::__suite_known!(conformance: $($lacks),*);
        $crate::conformance_suite!(@store [$($lacks)*] $make);
        $crate::conformance_suite!(@relay [$($lacks)*] $make; plain);
        // The cases that run relays again with pipelining off (one claimed batch per
        // loop).
        mod pipelining_off {
            use super::*;
            $crate::conformance_suite!(@relay [$($lacks)*] $make; depth 1);
        }
    };
    (@store [$($lacks:ident)*] $make:path) => {
        $crate::__suite_group!([$($lacks)*] always; $make; plain;
            enqueued_fields_round_trip,
            delayed_messages_wait,
            claims_follow_availability_then_enqueue_order,
            claim_skips_live_leases,
            concurrent_claimers_claim_each_once,
            expired_leases_are_reclaimable,
            claim_ids_skips_rows_leased_elsewhere,
            claim_ids_skips_undue_dead_and_dispatched,
            stale_complete_is_rejected,
            stale_fail_and_release_are_rejected,
            expired_unclaimed_lease_still_completes,
            settled_leases_cannot_be_reused,
            fail_schedules_the_retry,
            dead_letters_are_listed_and_filtered,
            dead_letters_are_requeued_and_discarded_by_filter,
            dead_letters_are_listed_newest_first,
            dead_letters_are_found_by_id,
            dead_letters_are_counted_by_filter,
            a_dead_letter_stamped_dispatched_is_requeued_whole,
            delete_retention_keeps_no_history,
            stats_are_exact,
            invalid_batch_writes_nothing,
            duplicate_ids_write_nothing,
            settle_and_claim_settles_then_claims,
            settle_and_claim_reports_lost_leases,
            settle_and_claim_never_returns_what_it_settled,
            renewal_is_refused_unless_declared,
        );
        $crate::__suite_group!([$($lacks)*] keep_retention; $make; plain;
            dispatched_counts_match_what_purges_delete,
            purge_is_bounded_and_spares_undelivered,
        );
        $crate::__suite_group!([$($lacks)*] per_key_ordering; $make; plain;
            claims_take_only_key_heads,
            dead_head_does_not_block_its_key,
        );
        $crate::__suite_group!([$($lacks)*] transactional_enqueue; $make; plain;
            rolled_back_enqueue_leaves_nothing,
        );
        $crate::__suite_group!([$($lacks)*] row_locks; $make; plain;
            claim_skips_rows_locked_by_another_transaction,
            settle_and_claim_skips_locked_rows,
        );
        $crate::__suite_group!([$($lacks)*] lease_renewal; $make; plain;
            renewal_with_a_stale_token_changes_nothing,
            renewed_lease_is_not_claimable_by_others,
            unrenewed_lease_lapses_at_expiry,
        );
    };
    (@relay [$($lacks:ident)*] $make:path; $($how:tt)*) => {
        $crate::__suite_group!([$($lacks)*] always; $make; $($how)*;
            last_attempt_dead_letters,
            permanent_failure_dead_letters_at_once,
            requeued_dead_letters_are_delivered,
            shutdown_releases_leases,
            shutdown_finishes_in_flight_and_releases_the_rest,
            killed_relay_loses_nothing,
            relays_deliver_all_without_duplicates,
            explicit_dispatch_runs_alongside_sweeps,
            explicit_dispatch_does_not_block_the_sweeper,
        );
        $crate::__suite_group!([$($lacks)*] per_key_ordering; $make; $($how)*;
            per_key_order_holds_with_racing_relays,
        );
        $crate::__suite_group!([$($lacks)*] lease_renewal; $make; $($how)*;
            relay_renews_leases_across_publish_waves,
        );
    };
}
