//! Every outbox-testkit suite against a real MySQL or MariaDB server: the conformance
//! suite in both claim modes, [`MySqlDedupStore`](outbox_mysql::MySqlDedupStore) in a
//! fresh database per store, [`MySqlDistributedLock`] on pools of their own per handle,
//! and the idempotent consumer over [`MySqlEntityStore`] and the dedup store.
//!
//! Run: `OUTBOX_MYSQL_URL=mysql://root@127.0.0.1:3306/outbox_test cargo test -p outbox-mysql --test conformance`

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::consumer::EntityStore;
use outbox_core::lock::LockGuard;
use outbox_core::store::StoreCapabilities;
use outbox_core::{ClaimMode, DedupStore, DistributedLock, Error, ErrorKind, Result};
use outbox_mysql::{
    MySqlClaimConfig, MySqlDistributedLock, MySqlEntityConfig, MySqlEntityStore, MySqlOutbox,
    MySqlOutboxConfig,
};
use outbox_testkit::{ConsumerHarness, DedupHarness, Fixture, Harness, LockHarness};
use sqlx::MySqlPool;

/// One database per store on a shared server; lock handles on pools of their own.
struct MySqlHarness {
    url: String,
    pool: MySqlPool,
    claims: MySqlClaimConfig,
}

#[async_trait]
impl Harness for MySqlHarness {
    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        let config = MySqlOutboxConfig::default()
            .with_schema(common::schema_name())
            .with_ordering(capabilities.ordering)
            .with_retention(capabilities.retention);
        let outbox = MySqlOutbox::new(self.pool.clone(), config)?.with_claims(self.claims.clone());
        outbox.install().await?;
        Ok(Box::new(common::MySqlFixture { outbox }))
    }
}

#[async_trait]
impl DedupHarness for MySqlHarness {
    async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(common::dedup_store(&self.pool, retention).await?))
    }

    async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(MySqlDistributedLock::new(self.pool.clone())))
    }
}

#[async_trait]
impl ConsumerHarness for MySqlHarness {
    async fn entities(&self) -> Result<Arc<dyn EntityStore>> {
        let config = MySqlEntityConfig::default().with_schema(common::schema_name());
        let store = MySqlEntityStore::new(self.pool.clone(), config)?;
        store.install().await?;
        Ok(Arc::new(store))
    }

    async fn dedup(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(common::dedup_store(&self.pool, retention).await?))
    }
}

/// Every lock handle is a pool of its own; `sever` kills the connection holding the
/// guard's lock, found with `IS_USED_LOCK` on the name `MySqlDistributedLock`
/// documents.
#[async_trait]
impl LockHarness for MySqlHarness {
    async fn lock(&self) -> Result<Arc<dyn DistributedLock>> {
        let pool = common::pool(&self.url, 4).await;
        Ok(Arc::new(MySqlDistributedLock::new(pool)))
    }

    async fn sever(&self, guard: &dyn LockGuard) -> Result<()> {
        let holder: Option<i64> =
            sqlx::query_scalar("SELECT IS_USED_LOCK(CONCAT('outbox:', SHA2(?, 224)))")
                .bind(guard.name().as_str())
                .fetch_one(&self.pool)
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
            .execute(&self.pool)
            .await
            .map_err(common::storage)?;
        Ok(())
    }
}

async fn harness_with(claims: MySqlClaimConfig) -> Option<MySqlHarness> {
    let url = common::url("outbox-mysql conformance")?;
    Some(MySqlHarness {
        pool: common::pool(&url, 10).await,
        url,
        claims,
    })
}

async fn harness() -> Option<MySqlHarness> {
    harness_with(MySqlClaimConfig::default()).await
}

outbox_testkit::backend_suites!(harness);

/// The conformance suite again with held-lock claims (sweeping before every claim,
/// and connections for the suite's concurrent claimers).
mod held_lock {
    use super::*;

    async fn harness() -> Option<MySqlHarness> {
        let claims = MySqlClaimConfig::default()
            .with_claim_mode(ClaimMode::HeldLock)
            .with_held_connections(12)
            .with_sweep_interval(Duration::ZERO);
        harness_with(claims).await
    }

    outbox_testkit::conformance_suite!(harness);
}
