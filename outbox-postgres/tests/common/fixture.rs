//! The conformance [`Fixture`] of a PostgreSQL outbox, shared by the suites that need
//! one (the conformance suite and the plan suite).

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::{MessageId, NewMessage, OutboxAdmin, OutboxStore, Result};
use outbox_postgres::PgOutbox;
use outbox_testkit::{Fixture, RowLock};
use sqlx::{Postgres, Transaction};

/// An outbox as the conformance suites see it: its store and admin, enqueue in a
/// committed or rolled-back transaction, a dispatched stamp as another tool would
/// write it, and row locks held by another transaction.
#[derive(Debug)]
pub struct PgFixture {
    /// The outbox under test.
    pub outbox: PgOutbox,
}

#[async_trait]
impl Fixture for PgFixture {
    fn store(&self) -> Arc<dyn OutboxStore> {
        Arc::new(self.outbox.clone())
    }

    fn admin(&self) -> Arc<dyn OutboxAdmin> {
        Arc::new(self.outbox.clone())
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<()> {
        let mut tx = self.outbox.pool().begin().await.map_err(super::storage)?;
        self.outbox.enqueue(&mut tx, &messages).await?;
        tx.commit().await.map_err(super::storage)
    }

    async fn enqueue_rolled_back(&self, messages: Vec<NewMessage>) -> Result<()> {
        let mut tx = self.outbox.pool().begin().await.map_err(super::storage)?;
        self.outbox.enqueue(&mut tx, &messages).await?;
        tx.rollback().await.map_err(super::storage)
    }

    async fn mark_dispatched(&self, id: MessageId) -> Result<()> {
        let sql = format!(
            "UPDATE {} SET dispatched_at = now() WHERE id = $1",
            self.outbox.qualified_name()
        );
        sqlx::query(&sql)
            .bind(id.as_uuid())
            .execute(self.outbox.pool())
            .await
            .map_err(super::storage)?;
        Ok(())
    }

    async fn lock_row(&self, id: MessageId) -> Result<Box<dyn RowLock>> {
        let mut tx = self.outbox.pool().begin().await.map_err(super::storage)?;
        let sql = format!(
            "SELECT 1 FROM {} WHERE id = $1 FOR UPDATE",
            self.outbox.qualified_name()
        );
        sqlx::query(&sql)
            .bind(id.as_uuid())
            .execute(&mut *tx)
            .await
            .map_err(super::storage)?;
        Ok(Box::new(PgRowLock { tx }))
    }
}

/// A transaction holding a row lock until released.
#[derive(Debug)]
struct PgRowLock {
    tx: Transaction<'static, Postgres>,
}

#[async_trait]
impl RowLock for PgRowLock {
    async fn release(self: Box<Self>) -> Result<()> {
        self.tx.rollback().await.map_err(super::storage)
    }
}
