//! The outbox-testkit idempotent-consumer, dedup and lock suites against SQLite
//! database files: [`SqliteEntityStore`], [`SqliteDedupStore`] and [`SqliteLock`].
//!
//! Run: `cargo test -p outbox-sqlite --test consumer_conformance`

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::consumer::EntityStore;
use outbox_core::{DedupStore, DistributedLock, Result};
use outbox_sqlite::{
    SqliteDedupConfig, SqliteDedupStore, SqliteEntityConfig, SqliteEntityStore, SqliteLock,
    SqliteLockConfig,
};
use outbox_testkit::{ConsumerHarness, DedupFeatures, DedupHarness, LockFeatures, LockHarness};

/// One database file per harness; every store of a case shares it, as the stores of a
/// service would.
#[derive(Debug)]
struct SqliteHarness {
    db: common::TempDb,
}

impl SqliteHarness {
    async fn new() -> Option<SqliteHarness> {
        Some(SqliteHarness {
            db: common::TempDb::new().await,
        })
    }

    async fn dedup_store(&self, retention: Duration) -> Result<SqliteDedupStore> {
        let config = SqliteDedupConfig::default()
            .with_table(format!("inbox_{}", uuid::Uuid::new_v4().simple()))
            .with_retention(retention);
        let store = SqliteDedupStore::new(self.db.pool().clone(), config)?;
        store.install().await?;
        Ok(store)
    }

    async fn lock(&self) -> Result<SqliteLock> {
        let lock = SqliteLock::new(self.db.pool().clone(), SqliteLockConfig::default())?;
        lock.install().await?;
        Ok(lock)
    }
}

#[async_trait]
impl ConsumerHarness for SqliteHarness {
    fn features(&self) -> DedupFeatures {
        DedupFeatures::all()
    }

    async fn entities(&self) -> Result<Arc<dyn EntityStore>> {
        let config = SqliteEntityConfig::default()
            .with_table(format!("entities_{}", uuid::Uuid::new_v4().simple()));
        let store = SqliteEntityStore::new(self.db.pool().clone(), config)?;
        store.install().await?;
        Ok(Arc::new(store))
    }

    async fn dedup(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(self.dedup_store(retention).await?))
    }
}

#[async_trait]
impl DedupHarness for SqliteHarness {
    fn features(&self) -> DedupFeatures {
        DedupFeatures::all()
    }

    async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(self.dedup_store(retention).await?))
    }

    async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(self.lock().await?))
    }
}

/// A lock holder's "session" is its renewal task and lease: there is no connection to
/// sever, so that case does not apply.
#[async_trait]
impl LockHarness for SqliteHarness {
    fn features(&self) -> LockFeatures {
        let mut features = LockFeatures::all();
        features.sever = false;
        features
    }

    async fn lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(SqliteHarness::lock(self).await?))
    }
}

outbox_testkit::consumer_suite!(SqliteHarness::new);

mod dedup {
    outbox_testkit::dedup_suite!(super::SqliteHarness::new);
}

mod lock {
    outbox_testkit::lock_suite!(super::SqliteHarness::new; lacks(sever));
}
