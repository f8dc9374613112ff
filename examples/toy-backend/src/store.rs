//! The outbox: [`ToyOutbox`], its `enqueue` on the engine's own transaction
//! ([`ToyTx`]), and the relay's side of the contract.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::backend::check_enqueue;
use outbox_core::store::{
    ClaimIds, ClaimRequest, Claimed, Failure, Lease, Renewed, Settled, StoreCapabilities,
};
use outbox_core::{NewMessage, OutboxStore, Result};
use outbox_testkit::{MemoryStore, MemoryTx};

use crate::config::ToyOutboxConfig;

/// An outbox on the toy engine. Cheap to clone: clones share the store.
#[derive(Debug, Clone)]
pub struct ToyOutbox {
    pub(crate) engine: MemoryStore,
    config: ToyOutboxConfig,
}

/// The engine's own transaction, which the caller opens, writes business data in,
/// and commits: [`ToyOutbox::enqueue`] only adds to it.
#[derive(Debug)]
pub struct ToyTx(MemoryTx);

impl ToyTx {
    /// Make what was written visible, all or nothing.
    ///
    /// # Errors
    /// [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) when an id is already
    /// stored; nothing is written.
    pub fn commit(self) -> Result<()> {
        self.0.commit()
    }

    /// Drop what was written.
    pub fn rollback(self) {
        self.0.rollback();
    }
}

impl ToyOutbox {
    /// An outbox with these settings; the toy engine needs no install step.
    ///
    /// # Errors
    /// The config's validation error.
    pub fn new(config: ToyOutboxConfig) -> Result<Self> {
        config.validate()?;
        let capabilities =
            StoreCapabilities::new(config.ordering(), config.retention()).with_lease_renewal(true);
        let engine =
            MemoryStore::with_capabilities(capabilities).with_limits(config.limits().clone());
        Ok(ToyOutbox { engine, config })
    }

    /// Begin a transaction of the engine.
    pub fn begin(&self) -> ToyTx {
        ToyTx(self.engine.begin())
    }

    /// Stamp `id` dispatched as another tool writing to the engine might (the suites
    /// check a dead letter stamped so is still requeued whole).
    pub fn mark_dispatched(&self, id: outbox_core::MessageId) {
        self.engine.mark_dispatched(id);
    }

    /// Add `messages` to the caller's transaction; never commits. The batch is checked
    /// first ([`check_enqueue`]: the limits, no id twice), so a refused batch adds
    /// nothing.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) for a message
    /// over the limits or an id given twice.
    pub fn enqueue(&self, tx: &mut ToyTx, messages: &[NewMessage]) -> Result<()> {
        check_enqueue(messages, self.config.limits())?;
        for message in messages {
            tx.0.enqueue(message.clone())?;
        }
        Ok(())
    }
}

#[async_trait]
impl OutboxStore for ToyOutbox {
    fn capabilities(&self) -> StoreCapabilities {
        self.engine.capabilities()
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Claimed> {
        self.engine.claim(request).await
    }

    async fn claim_ids(&self, request: &ClaimIds) -> Result<Claimed> {
        self.engine.claim_ids(request).await
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Settled> {
        self.engine.complete(leases).await
    }

    async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        self.engine.fail(failures).await
    }

    async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        self.engine.release(leases).await
    }

    async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        self.engine.renew(leases, lease).await
    }
}
