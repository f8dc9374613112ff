//! The macro that turns the suite into tests. Its cases, like every suite macro's,
//! come from `__suite_cases!`, which `build.rs` generates from `src/suite/`.

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
/// [`StoreCapabilities`](outbox_core::store::StoreCapabilities).
///
/// See the [crate docs](crate#adding-a-backend) for a complete example.
#[macro_export]
macro_rules! conformance_suite {
    ($make:path) => {
        $crate::conformance_suite!($make; lacks());
    };
    ($make:path; lacks($($lacks:ident),* $(,)?)) => {
        $crate::__suite_known!(conformance: $($lacks),*);
        $crate::__suite_cases!(conformance; [$($lacks)*] $make; plain);
        // The cases that run relays again with pipelining off (one claimed batch per
        // loop).
        mod pipelining_off {
            use super::*;
            $crate::__suite_cases!(conformance_relays; [$($lacks)*] $make; depth 1);
        }
    };
}
