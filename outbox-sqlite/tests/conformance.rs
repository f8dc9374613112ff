//! The outbox-testkit conformance suite against SQLite: every case on a database file
//! of its own (the mode services use), and again on a private in-memory database.
//!
//! Run: `cargo test -p outbox-sqlite --test conformance`

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::{MessageId, NewMessage, OutboxAdmin, OutboxStore, Result, StoreCapabilities};
use outbox_sqlite::{SqliteOutbox, SqliteOutboxConfig};
use outbox_testkit::{Features, Fixture, Harness};
use sqlx::SqlitePool;

/// Where each fixture's database lives.
#[derive(Debug, Clone, Copy)]
enum Storage {
    File,
    Memory,
}

struct SqliteHarness {
    storage: Storage,
}

#[async_trait]
impl Harness for SqliteHarness {
    /// SQLite has no row locks: a transaction holds the whole database, so the case
    /// "claims skip rows another transaction locked" does not apply.
    fn features(&self) -> Features {
        let mut features = Features::all();
        features.row_locks = false;
        features
    }

    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        let (pool, file) = match self.storage {
            Storage::File => {
                let db = common::TempDb::new().await;
                (db.pool().clone(), Some(db))
            }
            Storage::Memory => (outbox_sqlite::open_in_memory().await?, None),
        };
        let config = SqliteOutboxConfig::default()
            .with_ordering(capabilities.ordering)
            .with_retention(capabilities.retention);
        let outbox = SqliteOutbox::new(pool.clone(), config)?;
        outbox.install().await?;
        Ok(Box::new(SqliteFixture {
            outbox,
            pool,
            _file: file,
        }))
    }
}

#[derive(Debug)]
struct SqliteFixture {
    outbox: SqliteOutbox,
    pool: SqlitePool,
    _file: Option<common::TempDb>,
}

#[async_trait]
impl Fixture for SqliteFixture {
    fn store(&self) -> Arc<dyn OutboxStore> {
        Arc::new(self.outbox.clone())
    }

    fn admin(&self) -> Arc<dyn OutboxAdmin> {
        Arc::new(self.outbox.clone())
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<()> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(common::storage)?;
        self.outbox.enqueue(&mut tx, &messages).await?;
        tx.commit().await.map_err(common::storage)
    }

    async fn enqueue_rolled_back(&self, messages: Vec<NewMessage>) -> Result<()> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(common::storage)?;
        self.outbox.enqueue(&mut tx, &messages).await?;
        tx.rollback().await.map_err(common::storage)
    }

    async fn mark_dispatched(&self, id: MessageId) -> Result<()> {
        let sql = format!(
            "UPDATE {} SET dispatched_at = CAST(strftime('%s', 'now') AS INTEGER) * 1000000 \
             WHERE id = ?1",
            self.outbox.table_name()
        );
        sqlx::query(&sql)
            .bind(id.as_uuid().as_bytes().to_vec())
            .execute(&self.pool)
            .await
            .map_err(common::storage)?;
        Ok(())
    }
}

mod file {
    async fn harness() -> Option<super::SqliteHarness> {
        Some(super::SqliteHarness {
            storage: super::Storage::File,
        })
    }

    outbox_testkit::conformance_suite!(harness; lacks(row_locks, lease_renewal));
}

mod memory {
    async fn harness() -> Option<super::SqliteHarness> {
        Some(super::SqliteHarness {
            storage: super::Storage::Memory,
        })
    }

    outbox_testkit::conformance_suite!(harness; lacks(row_locks, lease_renewal));
}
