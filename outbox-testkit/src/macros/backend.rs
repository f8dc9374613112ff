//! The one macro a storage backend's test crate invokes: [`backend_suites!`].

/// Expands to every suite a storage backend runs, over one harness: the conformance
/// suite (and, in a module `pipelining_off`, its relay cases again with
/// [`RelayConfig::pipeline_depth`](outbox_core::RelayConfig::pipeline_depth) 1), the
/// [`DedupStore`](outbox_core::DedupStore) and
/// [`DistributedLock`](outbox_core::DistributedLock) suites, and the
/// idempotent-consumer suite: one `#[tokio::test]` per case.
///
/// `$make` names an `async fn() -> Option<H>` where `H` implements
/// [`Harness`](crate::Harness), [`DedupHarness`](crate::DedupHarness),
/// [`LockHarness`](crate::LockHarness) and
/// [`ConsumerHarness`](crate::ConsumerHarness); returning `None` skips the case (after
/// [`service_url`](crate::service_url) printed why). The calling crate needs `tokio`
/// with the `macros` and `rt-multi-thread` features as a dev-dependency.
///
/// `lacks(...)` is the one place the backend says what it lacks, across the four
/// suites: `per_key_ordering`, `keep_retention`, `transactional_enqueue`, `row_locks`,
/// `lease_renewal` (the store's own declaration, which a case checks against this
/// list), `strong`, `short_retention`, `sever`. The cases that need a lacked
/// capability show in cargo's summary as ignored, with the reason; the others see the
/// list as their harness's features (through [`Declared`](crate::Declared)). A name no
/// suite knows fails to compile.
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use async_trait::async_trait;
/// use outbox_core::consumer::EntityStore;
/// use outbox_core::store::StoreCapabilities;
/// use outbox_core::{DedupStore, DistributedLock, Result};
/// use outbox_testkit::{
///     ConsumerHarness, DedupHarness, Fixture, Harness, LockHarness, MemoryConsumerHarness,
///     MemoryDedupHarness, MemoryHarness, MemoryLockHarness,
/// };
///
/// /// One harness for every suite (here, the in-memory reference's, delegated to).
/// #[derive(Default)]
/// struct MyHarness {
///     dedup: MemoryDedupHarness,
///     lock: MemoryLockHarness,
/// }
///
/// #[async_trait]
/// impl Harness for MyHarness {
///     async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
///         MemoryHarness.fixture(capabilities).await
///     }
/// }
///
/// #[async_trait]
/// impl DedupHarness for MyHarness {
///     async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
///         self.dedup.store(retention).await
///     }
///     async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>> {
///         self.dedup.purge_lock().await
///     }
/// }
///
/// #[async_trait]
/// impl LockHarness for MyHarness {
///     async fn lock(&self) -> Result<Arc<dyn DistributedLock>> {
///         self.lock.lock().await
///     }
/// }
///
/// #[async_trait]
/// impl ConsumerHarness for MyHarness {
///     async fn entities(&self) -> Result<Arc<dyn EntityStore>> {
///         MemoryConsumerHarness.entities().await
///     }
///     async fn dedup(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
///         MemoryConsumerHarness.dedup(retention).await
///     }
/// }
///
/// async fn harness() -> Option<MyHarness> {
///     Some(MyHarness::default())
/// }
///
/// // This harness cannot sever a lock holder's session.
/// outbox_testkit::backend_suites!(harness; lacks(sever));
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! backend_suites {
    ($make:path) => {
        $crate::backend_suites!($make; lacks());
    };
    ($make:path; lacks($($lacks:ident),* $(,)?)) => {
        $crate::__suite_known!(backend: $($lacks),*);
        $crate::__suite_cases!(conformance; [$($lacks)*] $make; plain);
        $crate::__suite_cases!(dedup; [$($lacks)*] $make; plain);
        $crate::__suite_cases!(lock; [$($lacks)*] $make; plain);
        $crate::__suite_cases!(consumer; [$($lacks)*] $make; plain);
        /// The conformance cases that run relays, again with pipelining off.
        mod pipelining_off {
            use super::*;
            $crate::__suite_cases!(conformance_relays; [$($lacks)*] $make; depth 1);
        }
    };
}
