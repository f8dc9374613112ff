//! The operator's side of the contract for [`ToyOutbox`].

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{
    DeadLetter, DeadLetterFilter, DeadLetterPage, DeadLetterSelection, OutboxAdmin, OutboxStats,
    Result,
};

use crate::store::ToyOutbox;

#[async_trait]
impl OutboxAdmin for ToyOutbox {
    async fn stats(&self) -> Result<OutboxStats> {
        self.engine.stats().await
    }

    async fn dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>> {
        self.engine.dead_letters(page).await
    }

    async fn count_dead(&self, filter: &DeadLetterFilter) -> Result<u64> {
        self.engine.count_dead(filter).await
    }

    async fn requeue_dead(&self, selection: &DeadLetterSelection) -> Result<u64> {
        self.engine.requeue_dead(selection).await
    }

    async fn discard_dead(&self, selection: &DeadLetterSelection) -> Result<u64> {
        self.engine.discard_dead(selection).await
    }

    async fn purge_dispatched(&self, older_than: Duration, limit: usize) -> Result<u64> {
        self.engine.purge_dispatched(older_than, limit).await
    }

    async fn count_dispatched(&self, older_than: Duration) -> Result<u64> {
        self.engine.count_dispatched(older_than).await
    }
}
