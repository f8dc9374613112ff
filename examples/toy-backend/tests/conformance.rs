//! Every shared suite against the toy backend, over one harness: what a backend's
//! `tests/conformance.rs` holds.
//!
//! Run: `cargo test -p example-toy-backend`

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use example_toy_backend::{
    ToyDedupStore, ToyDistributedLock, ToyEntityStore, ToyOutbox, ToyOutboxConfig,
};
use outbox_core::consumer::EntityStore;
use outbox_core::lock::LockGuard;
use outbox_core::store::StoreCapabilities;
use outbox_core::{
    DedupStore, DistributedLock, Error, ErrorKind, MessageId, NewMessage, OutboxAdmin, OutboxStore,
    Result,
};
use outbox_testkit::{ConsumerHarness, DedupHarness, Fixture, Harness, LockHarness};

/// One lock space per case, shared by its handles, as one engine would be.
#[derive(Debug, Default)]
struct ToyHarness {
    locks: ToyDistributedLock,
}

#[async_trait]
impl Harness for ToyHarness {
    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        let config = ToyOutboxConfig::default()
            .with_ordering(capabilities.ordering)
            .with_retention(capabilities.retention);
        Ok(Box::new(ToyFixture(ToyOutbox::new(config)?)))
    }
}

#[async_trait]
impl DedupHarness for ToyHarness {
    async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(ToyDedupStore::new(retention)))
    }

    async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(self.locks.clone()))
    }
}

#[async_trait]
impl LockHarness for ToyHarness {
    async fn lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(self.locks.clone()))
    }

    async fn sever(&self, guard: &dyn LockGuard) -> Result<()> {
        if self.locks.end_session(guard.name()) {
            Ok(())
        } else {
            Err(Error::new(ErrorKind::Storage, "no session holds the lock"))
        }
    }
}

#[async_trait]
impl ConsumerHarness for ToyHarness {
    async fn entities(&self) -> Result<Arc<dyn EntityStore>> {
        Ok(Arc::new(ToyEntityStore::new()))
    }

    async fn dedup(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(ToyDedupStore::new(retention)))
    }
}

/// One case's outbox, reached through the backend's own transaction.
#[derive(Debug)]
struct ToyFixture(ToyOutbox);

#[async_trait]
impl Fixture for ToyFixture {
    fn store(&self) -> Arc<dyn OutboxStore> {
        Arc::new(self.0.clone())
    }

    fn admin(&self) -> Arc<dyn OutboxAdmin> {
        Arc::new(self.0.clone())
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<()> {
        let mut tx = self.0.begin();
        self.0.enqueue(&mut tx, &messages)?;
        tx.commit()
    }

    async fn enqueue_rolled_back(&self, messages: Vec<NewMessage>) -> Result<()> {
        let mut tx = self.0.begin();
        self.0.enqueue(&mut tx, &messages)?;
        tx.rollback();
        Ok(())
    }

    async fn mark_dispatched(&self, id: MessageId) -> Result<()> {
        self.0.mark_dispatched(id);
        Ok(())
    }
}

async fn harness() -> Option<ToyHarness> {
    Some(ToyHarness::default())
}

// The toy engine holds no row locks another transaction could take.
outbox_testkit::backend_suites!(harness; lacks(row_locks));
