//! The outbox-testkit dedup and lock suites against a real MySQL or MariaDB server:
//! [`MySqlDedupStore`](outbox_mysql::MySqlDedupStore) in a fresh database per store,
//! [`MySqlDistributedLock`] on pools of their own per handle.
//!
//! Run: `OUTBOX_MYSQL_URL=mysql://root@127.0.0.1:3306/outbox_test cargo test -p outbox-mysql --test dedup_lock_conformance`

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{lock::LockGuard, DedupStore, DistributedLock, Error, ErrorKind, Result};
use outbox_mysql::MySqlDistributedLock;
use outbox_testkit::{DedupFeatures, DedupHarness, LockFeatures, LockHarness};
use sqlx::MySqlPool;

#[derive(Debug)]
struct MySqlDedupHarness {
    pool: MySqlPool,
}

#[async_trait]
impl DedupHarness for MySqlDedupHarness {
    fn features(&self) -> DedupFeatures {
        DedupFeatures::all()
    }

    async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(common::dedup_store(&self.pool, retention).await?))
    }

    async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(MySqlDistributedLock::new(self.pool.clone())))
    }
}

async fn dedup_harness() -> Option<MySqlDedupHarness> {
    let url = common::url("outbox-mysql dedup conformance")?;
    Some(MySqlDedupHarness {
        pool: common::pool(&url, 10).await,
    })
}

/// Every handle is a pool of its own; `sever` kills the connection holding the
/// guard's lock, found with `IS_USED_LOCK` on the name `MySqlDistributedLock`
/// documents.
#[derive(Debug)]
struct MySqlLockHarness {
    url: String,
    admin: MySqlPool,
}

#[async_trait]
impl LockHarness for MySqlLockHarness {
    fn features(&self) -> LockFeatures {
        LockFeatures::all()
    }

    async fn lock(&self) -> Result<Arc<dyn DistributedLock>> {
        let pool = common::pool(&self.url, 4).await;
        Ok(Arc::new(MySqlDistributedLock::new(pool)))
    }

    async fn sever(&self, guard: &dyn LockGuard) -> Result<()> {
        let holder: Option<i64> =
            sqlx::query_scalar("SELECT IS_USED_LOCK(CONCAT('outbox:', SHA2(?, 224)))")
                .bind(guard.name().as_str())
                .fetch_one(&self.admin)
                .await
                .map_err(common::storage)?;
        let Some(id) = holder else {
            return Err(Error::new(
                ErrorKind::Storage,
                format!("no session holds {:?}", guard.name()),
            ));
        };
        // A connection id the server gave, not input.
        sqlx::raw_sql(&format!("KILL {id}"))
            .execute(&self.admin)
            .await
            .map_err(common::storage)?;
        Ok(())
    }
}

async fn lock_harness() -> Option<MySqlLockHarness> {
    let url = common::url("outbox-mysql lock conformance")?;
    let admin = common::pool(&url, 2).await;
    Some(MySqlLockHarness { url, admin })
}

outbox_testkit::dedup_suite!(dedup_harness);
outbox_testkit::lock_suite!(lock_harness);
