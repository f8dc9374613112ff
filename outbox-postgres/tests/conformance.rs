//! The outbox-testkit conformance suite against a real PostgreSQL server.
//!
//! Run: `OUTBOX_PG_URL=postgres://postgres@127.0.0.1:5432/outbox_test cargo test -p outbox-postgres --test conformance`

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::{MessageId, NewMessage, OutboxAdmin, OutboxStore, Result, StoreCapabilities};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use outbox_testkit::{Features, Fixture, Harness, RowLock};
use sqlx::{PgPool, Postgres, Transaction};

/// Makes one schema per case on a shared database.
struct PgHarness {
    pool: PgPool,
}

#[async_trait]
impl Harness for PgHarness {
    fn features(&self) -> Features {
        Features::all()
    }

    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        let config = PgOutboxConfig::default()
            .with_schema(common::schema_name())
            .with_ordering(capabilities.ordering)
            .with_retention(capabilities.retention);
        let outbox = PgOutbox::new(self.pool.clone(), config)?;
        outbox.install().await?;
        Ok(Box::new(PgFixture { outbox }))
    }
}

#[derive(Debug)]
struct PgFixture {
    outbox: PgOutbox,
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
        let mut tx = self.outbox.pool().begin().await.map_err(common::storage)?;
        self.outbox.enqueue(&mut tx, &messages).await?;
        tx.commit().await.map_err(common::storage)
    }

    async fn enqueue_rolled_back(&self, messages: Vec<NewMessage>) -> Result<()> {
        let mut tx = self.outbox.pool().begin().await.map_err(common::storage)?;
        self.outbox.enqueue(&mut tx, &messages).await?;
        tx.rollback().await.map_err(common::storage)
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
            .map_err(common::storage)?;
        Ok(())
    }

    async fn lock_row(&self, id: MessageId) -> Result<Box<dyn RowLock>> {
        let mut tx = self.outbox.pool().begin().await.map_err(common::storage)?;
        let sql = format!(
            "SELECT 1 FROM {} WHERE id = $1 FOR UPDATE",
            self.outbox.qualified_name()
        );
        sqlx::query(&sql)
            .bind(id.as_uuid())
            .execute(&mut *tx)
            .await
            .map_err(common::storage)?;
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
        self.tx.rollback().await.map_err(common::storage)
    }
}

async fn make_harness() -> Option<PgHarness> {
    let url = common::url("outbox-postgres conformance")?;
    Some(PgHarness {
        pool: common::pool(&url, 10).await,
    })
}

outbox_testkit::conformance_suite!(make_harness);
