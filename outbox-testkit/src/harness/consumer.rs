//! What a backend implements to run the idempotent-consumer suite, and the harness of
//! the in-memory stores.
//!
//! The cases live in [`suite`](crate::suite) (the `consumer_*` functions) and become
//! tests through [`consumer_suite!`](crate::consumer_suite).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::consumer::EntityStore;
use outbox_core::{DedupStore, Result};

use crate::harness::declared::Sealed;
use crate::harness::dedup::DedupFeatures;
use crate::memory::dedup::MemoryDedupStore;
use crate::memory::entity::MemoryEntityStore;

/// Hands out the stores of the decoupled algorithm, isolated per case.
#[async_trait]
pub trait ConsumerHarness: Send + Sync + 'static {
    /// What the dedup store supports, as
    /// [`consumer_suite!`](crate::consumer_suite)`(make; lacks(short_retention))`
    /// declared it; answered by [`Declared`](crate::Declared), never by a backend.
    fn features(&self, _: Sealed) -> DedupFeatures {
        DedupFeatures::all()
    }

    /// A fresh, empty entity store in its own table or key prefix.
    async fn entities(&self) -> Result<Arc<dyn EntityStore>>;

    /// A fresh, empty, strongly consistent dedup store remembering ids for
    /// `retention`.
    async fn dedup(&self, retention: Duration) -> Result<Arc<dyn DedupStore>>;
}

/// Runs the consumer suite against [`MemoryEntityStore`] and [`MemoryDedupStore`].
#[derive(Debug, Clone, Default)]
pub struct MemoryConsumerHarness;

#[async_trait]
impl ConsumerHarness for MemoryConsumerHarness {
    async fn entities(&self) -> Result<Arc<dyn EntityStore>> {
        Ok(Arc::new(MemoryEntityStore::new()))
    }

    async fn dedup(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(MemoryDedupStore::new(retention)))
    }
}
