//! The one declaration of what a backend under test lacks: the `lacks(...)` list of its
//! suite macro, handed to the cases through [`Declared`].
//!
//! A suite macro's list decides, at compile time, which cases show as ignored; the
//! same list reaches the cases that run, as the harness's features, through the
//! wrapper the macro puts around the backend's harness. A backend never states its
//! features a second time: the harness traits' `features` method takes a [`Sealed`]
//! argument no other crate can name, so only [`Declared`] answers it. What the store
//! itself declares ([`StoreCapabilities`](outbox_core::store::StoreCapabilities)) is
//! checked against the list by the case
//! [`declared_capabilities_match_the_store`](crate::suite::declared_capabilities_match_the_store).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::consumer::EntityStore;
use outbox_core::lock::LockGuard;
use outbox_core::store::StoreCapabilities;
use outbox_core::{DedupStore, DistributedLock, Result};

use crate::harness::consumer::ConsumerHarness;
use crate::harness::dedup::{DedupFeatures, DedupHarness, LockFeatures, LockHarness};
use crate::harness::plan::{PlanFixture, PlanHarness};
use crate::harness::publisher::{
    PublisherFeatures, PublisherHarness, PublisherNamespace, RestartableNamespace,
};
use crate::harness::{Features, Fixture, Harness};

mod sealed {
    /// The argument of the harness traits' `features`: public, so the traits can name
    /// it, in a private module, so no other crate can implement or call `features`.
    #[derive(Debug, Clone, Copy)]
    pub struct Sealed(pub(crate) ());
}

pub(crate) use sealed::Sealed;

/// The token cases pass to `features`.
pub(crate) const SEALED: Sealed = Sealed(());

/// A backend's harness with what its suite macro says it lacks: the value the suite
/// macros hand to every case (`lacks` holds the capability names, each one the macro
/// checked at compile time).
#[derive(Debug)]
pub struct Declared<H> {
    harness: H,
    lacks: &'static [&'static str],
}

impl<H> Declared<H> {
    /// `harness`, lacking the capabilities named in `lacks` (the suite macro's list).
    pub fn new(harness: H, lacks: &'static [&'static str]) -> Self {
        Declared { harness, lacks }
    }

    /// Whether the suite macro was told the backend lacks `capability`.
    pub fn lacks(&self, capability: &str) -> bool {
        self.lacks.contains(&capability)
    }
}

#[async_trait]
impl<H: Harness> Harness for Declared<H> {
    fn features(&self, _: Sealed) -> Features {
        Features::lacking(self.lacks)
    }

    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        self.harness.fixture(capabilities).await
    }
}

#[async_trait]
impl<H: DedupHarness> DedupHarness for Declared<H> {
    fn features(&self, _: Sealed) -> DedupFeatures {
        DedupFeatures::lacking(self.lacks)
    }

    async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        self.harness.store(retention).await
    }

    async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>> {
        self.harness.purge_lock().await
    }
}

#[async_trait]
impl<H: LockHarness> LockHarness for Declared<H> {
    fn features(&self, _: Sealed) -> LockFeatures {
        LockFeatures::lacking(self.lacks)
    }

    async fn lock(&self) -> Result<Arc<dyn DistributedLock>> {
        self.harness.lock().await
    }

    async fn sever(&self, guard: &dyn LockGuard) -> Result<()> {
        self.harness.sever(guard).await
    }
}

#[async_trait]
impl<H: ConsumerHarness> ConsumerHarness for Declared<H> {
    fn features(&self, _: Sealed) -> DedupFeatures {
        DedupFeatures::lacking(self.lacks)
    }

    async fn entities(&self) -> Result<Arc<dyn EntityStore>> {
        self.harness.entities().await
    }

    async fn dedup(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        self.harness.dedup(retention).await
    }
}

#[async_trait]
impl<H: PublisherHarness> PublisherHarness for Declared<H> {
    fn features(&self, _: Sealed) -> PublisherFeatures {
        PublisherFeatures::lacking(self.lacks)
    }

    async fn namespace(&self) -> Result<Box<dyn PublisherNamespace>> {
        self.harness.namespace().await
    }

    async fn restartable_namespace(&self) -> Result<Box<dyn RestartableNamespace>> {
        self.harness.restartable_namespace().await
    }
}

#[async_trait]
impl<H: PlanHarness> PlanHarness for Declared<H> {
    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn PlanFixture>> {
        self.harness.fixture(capabilities).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryDedupHarness, MemoryHarness, MemoryLockHarness, MemoryPublisherHarness};

    #[test]
    fn the_macro_list_is_what_the_cases_see() {
        let none = Declared::new(MemoryHarness, &[]);
        assert_eq!(none.features(SEALED), Features::all());
        let some = Declared::new(MemoryHarness, &["row_locks", "lease_renewal"]);
        let features = some.features(SEALED);
        assert!(!features.row_locks && !features.lease_renewal);
        assert!(features.per_key_ordering && features.keep_retention);
        assert!(features.transactional_enqueue);
        assert!(some.lacks("row_locks") && !some.lacks("keep_retention"));
        let dedup = Declared::new(MemoryDedupHarness::default(), &["short_retention"]);
        let d = DedupHarness::features(&dedup, SEALED);
        assert!(d.strong && !d.short_retention);
        let lock = Declared::new(MemoryLockHarness::default(), &["sever"]);
        assert!(!LockHarness::features(&lock, SEALED).sever);
        let publisher = Declared::new(MemoryPublisherHarness, &["dedup_window"]);
        let p = publisher.features(SEALED);
        assert!(!p.dedup_window && p.unroutable_is_permanent && p.broker_restart);
    }
}
