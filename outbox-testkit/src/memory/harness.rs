//! The conformance harness for [`MemoryStore`].

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::{
    store::StoreCapabilities, MessageId, NewMessage, OutboxAdmin, OutboxStore, Result,
};

use crate::harness::{Fixture, Harness, RowLock};
use crate::memory::store::MemoryStore;

/// Runs the suite against [`MemoryStore`]; every feature is supported, and the stores
/// declare lease renewal.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryHarness;

#[async_trait]
impl Harness for MemoryHarness {
    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        Ok(Box::new(MemoryFixture(MemoryStore::with_capabilities(
            capabilities.with_lease_renewal(true),
        ))))
    }
}

#[derive(Debug)]
struct MemoryFixture(MemoryStore);

#[async_trait]
impl Fixture for MemoryFixture {
    fn store(&self) -> Arc<dyn OutboxStore> {
        Arc::new(self.0.clone())
    }

    fn admin(&self) -> Arc<dyn OutboxAdmin> {
        Arc::new(self.0.clone())
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<()> {
        self.0.enqueue(&messages)
    }

    async fn enqueue_rolled_back(&self, messages: Vec<NewMessage>) -> Result<()> {
        let mut tx = self.0.begin();
        for m in messages {
            tx.enqueue(m)?;
        }
        tx.rollback();
        Ok(())
    }

    async fn mark_dispatched(&self, id: MessageId) -> Result<()> {
        self.0.mark_dispatched(id);
        Ok(())
    }

    async fn lock_row(&self, id: MessageId) -> Result<Box<dyn RowLock>> {
        self.0.lock_row(id);
        Ok(Box::new(MemoryRowLock(self.0.clone(), id)))
    }
}

#[derive(Debug)]
struct MemoryRowLock(MemoryStore, MessageId);

#[async_trait]
impl RowLock for MemoryRowLock {
    async fn release(self: Box<Self>) -> Result<()> {
        self.0.unlock_row(self.1);
        Ok(())
    }
}
