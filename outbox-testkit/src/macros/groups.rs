//! How the suite macros turn a group of cases into tests: run, or shown as ignored when
//! the backend lacks the capability the group needs.
//!
//! Each suite macro takes the capabilities its backend lacks
//! (`conformance_suite!(make; lacks(row_locks))`) and sorts its cases into groups by
//! the one capability each needs (or `always`). A group whose capability is lacked
//! expands to `#[ignore = "..."]` tests, so cargo's summary counts them as ignored with
//! the reason instead of as passed; every other group runs, with the harness wrapped in
//! [`Declared`](crate::Declared) so the cases read the same list as the harness's
//! features: the list is the one declaration. A case forced to run (`--ignored`)
//! without its capability fails ([`require`]).

/// Fails the case unless the harness declares `capability`.
///
/// A case that needs a capability runs only when its suite macro was not told the
/// backend lacks it; reaching here with the capability undeclared means an ignored
/// case was forced to run, or a case was called without its suite macro.
pub(crate) fn require(declared: bool, capability: &str) {
    assert!(
        declared,
        "the harness does not declare `{capability}`: expand the suite with \
         `lacks({capability})` so the cases that need it show as ignored"
    );
}

/// Expands one group of suite cases; used by the suite macros, not by hand.
///
/// `[lacked capabilities] capability; make; how; cases`: when `capability` (or
/// `always`) is not among the lacked ones, `how` says how each case runs (`plain`, or
/// `depth N` for [`with_pipeline_depth`](crate::suite::with_pipeline_depth)); when it
/// is, the cases become ignored tests naming the capability.
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_group {
    ([$($lacks:ident)*] $cap:ident; $($run:tt)*) => {
        $crate::__suite_group!(@find $cap [$($lacks)*] {$($lacks)*}; $($run)*);
    };
    // One rule per capability, each with its reason written out: the test attribute
    // takes only a string literal, not a `concat!`.
    (@find per_key_ordering [per_key_ordering $($r:ident)*] {$($all:ident)*}; $($run:tt)*) => {
        $crate::__suite_group!(@emit [ignore = "the backend lacks per_key_ordering (KeyOrder::PerKey)"] {$($all)*} $($run)*);
    };
    (@find keep_retention [keep_retention $($r:ident)*] {$($all:ident)*}; $($run:tt)*) => {
        $crate::__suite_group!(@emit [ignore = "the backend lacks keep_retention (Retention::Keep)"] {$($all)*} $($run)*);
    };
    (@find transactional_enqueue [transactional_enqueue $($r:ident)*] {$($all:ident)*}; $($run:tt)*) => {
        $crate::__suite_group!(@emit [ignore = "the backend lacks transactional_enqueue (Fixture::enqueue_rolled_back)"] {$($all)*} $($run)*);
    };
    (@find row_locks [row_locks $($r:ident)*] {$($all:ident)*}; $($run:tt)*) => {
        $crate::__suite_group!(@emit [ignore = "the backend lacks row_locks (Fixture::lock_row): nothing for claims to skip"] {$($all)*} $($run)*);
    };
    (@find lease_renewal [lease_renewal $($r:ident)*] {$($all:ident)*}; $($run:tt)*) => {
        $crate::__suite_group!(@emit [ignore = "the store lacks lease_renewal (StoreCapabilities::lease_renewal)"] {$($all)*} $($run)*);
    };
    (@find strong [strong $($r:ident)*] {$($all:ident)*}; $($run:tt)*) => {
        $crate::__suite_group!(@emit [ignore = "the dedup store lacks strong consistency (DedupFeatures::strong)"] {$($all)*} $($run)*);
    };
    (@find short_retention [short_retention $($r:ident)*] {$($all:ident)*}; $($run:tt)*) => {
        $crate::__suite_group!(@emit [ignore = "the dedup store lacks short_retention (retention under a second)"] {$($all)*} $($run)*);
    };
    (@find sever [sever $($r:ident)*] {$($all:ident)*}; $($run:tt)*) => {
        $crate::__suite_group!(@emit [ignore = "the lock harness lacks sever (LockHarness::sever)"] {$($all)*} $($run)*);
    };
    (@find dedup_window [dedup_window $($r:ident)*] {$($all:ident)*}; $($run:tt)*) => {
        $crate::__suite_group!(@emit [ignore = "the broker lacks dedup_window (it drops no repeated id)"] {$($all)*} $($run)*);
    };
    (@find unroutable_is_permanent [unroutable_is_permanent $($r:ident)*] {$($all:ident)*}; $($run:tt)*) => {
        $crate::__suite_group!(@emit [ignore = "the broker lacks unroutable_is_permanent"] {$($all)*} $($run)*);
    };
    (@find broker_restart [broker_restart $($r:ident)*] {$($all:ident)*}; $($run:tt)*) => {
        $crate::__suite_group!(@emit [ignore = "the harness lacks broker_restart (PublisherHarness::restartable_namespace)"] {$($all)*} $($run)*);
    };
    (@find $cap:ident [$head:ident $($r:ident)*] {$($all:ident)*}; $($run:tt)*) => {
        $crate::__suite_group!(@find $cap [$($r)*] {$($all)*}; $($run)*);
    };
    (@find $cap:ident [] {$($all:ident)*}; $($run:tt)*) => {
        $crate::__suite_group!(@emit [cfg_attr(outbox_service_unset, ignore = "the backend's service URL was not set when these tests were built: run scripts/services.sh (see the build warning)")] {$($all)*} $($run)*);
    };
    (@emit [$attr:meta] $all:tt $make:path; plain; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[$attr]
            async fn $case() {
                let Some(harness) = $make().await else { return };
                let harness = $crate::Declared::new(harness, $crate::__lacks_list! $all);
                $crate::suite::$case(&harness).await;
            }
        )*
    };
    (@emit [$attr:meta] $all:tt $make:path; depth $depth:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[$attr]
            async fn $case() {
                let Some(harness) = $make().await else { return };
                let harness = $crate::Declared::new(harness, $crate::__lacks_list! $all);
                $crate::suite::with_pipeline_depth($depth, $crate::suite::$case(&harness)).await;
            }
        )*
    };
}

/// `{a b}` as `&["a", "b"]`: a suite macro's lacked capabilities, for
/// [`Declared`](crate::Declared).
#[doc(hidden)]
#[macro_export]
macro_rules! __lacks_list {
    {$($cap:ident)*} => {
        &[$(stringify!($cap)),*]
    };
}

/// Refuses, at compile time, a capability name a suite does not know: `lacks(row_lock)`
/// would otherwise lack nothing.
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_known {
    ($suite:ident: $($cap:ident),*) => {
        $(const _: () = $crate::__capabilities::$suite::$cap;)*
    };
}

/// The capabilities each suite macro accepts in `lacks(...)`, as constants that
/// [`__suite_known!`] names.
#[doc(hidden)]
#[allow(non_upper_case_globals)]
pub mod capabilities {
    /// [`conformance_suite!`](crate::conformance_suite).
    pub mod conformance {
        /// [`Features::per_key_ordering`](crate::Features::per_key_ordering).
        pub const per_key_ordering: () = ();
        /// [`Features::keep_retention`](crate::Features::keep_retention).
        pub const keep_retention: () = ();
        /// [`Features::transactional_enqueue`](crate::Features::transactional_enqueue).
        pub const transactional_enqueue: () = ();
        /// [`Features::row_locks`](crate::Features::row_locks).
        pub const row_locks: () = ();
        /// [`StoreCapabilities::lease_renewal`](outbox_core::store::StoreCapabilities).
        pub const lease_renewal: () = ();
    }
    /// [`backend_suites!`](crate::backend_suites): every name of the four suites it runs.
    pub mod backend {
        pub use super::conformance::*;
        pub use super::dedup::*;
        pub use super::lock::*;
    }
    /// [`dedup_suite!`](crate::dedup_suite).
    pub mod dedup {
        /// [`DedupFeatures::strong`](crate::DedupFeatures::strong).
        pub const strong: () = ();
        /// [`DedupFeatures::short_retention`](crate::DedupFeatures::short_retention).
        pub const short_retention: () = ();
    }
    /// [`lock_suite!`](crate::lock_suite).
    pub mod lock {
        /// [`LockFeatures::sever`](crate::LockFeatures::sever).
        pub const sever: () = ();
    }
    /// [`consumer_suite!`](crate::consumer_suite).
    pub mod consumer {
        /// [`DedupFeatures::short_retention`](crate::DedupFeatures::short_retention).
        pub const short_retention: () = ();
    }
    /// [`publisher_suite!`](crate::publisher_suite).
    pub mod publisher {
        /// [`PublisherFeatures::dedup_window`](crate::PublisherFeatures::dedup_window).
        pub const dedup_window: () = ();
        /// [`PublisherFeatures::unroutable_is_permanent`](crate::PublisherFeatures::unroutable_is_permanent).
        pub const unroutable_is_permanent: () = ();
        /// [`PublisherFeatures::broker_restart`](crate::PublisherFeatures::broker_restart).
        pub const broker_restart: () = ();
    }
}
