//! Every outbox-testkit suite against a real PostgreSQL server: the conformance suite
//! in both claim modes, [`PgDedupStore`](outbox_postgres::PgDedupStore) in a fresh
//! schema per store, [`PgDistributedLock`] on pools of their own per handle, and the
//! idempotent consumer over [`PgEntityStore`] and the dedup store.
//!
//! Run: `OUTBOX_PG_URL=postgres://postgres@127.0.0.1:5432/outbox_test cargo test -p outbox-postgres --test conformance`

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::consumer::EntityStore;
use outbox_core::lock::LockGuard;
use outbox_core::store::StoreCapabilities;
use outbox_core::{ClaimMode, DedupStore, DistributedLock, Error, ErrorKind, Result};
use outbox_postgres::{PgDistributedLock, PgEntityConfig, PgEntityStore, PgOutbox, PgOutboxConfig};
use outbox_testkit::postgres::locks;
use outbox_testkit::{ConsumerHarness, DedupHarness, Fixture, Harness, LockHarness};
use sqlx::PgPool;

/// One schema per store on a shared database; lock handles on pools of their own.
struct PgHarness {
    url: String,
    pool: PgPool,
    mode: ClaimMode,
}

#[async_trait]
impl Harness for PgHarness {
    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        let config = PgOutboxConfig::default()
            .with_schema(common::schema_name())
            .with_ordering(capabilities.ordering)
            .with_retention(capabilities.retention)
            .with_claim_mode(self.mode)
            // Every claim sweeps, so an ended batch's attempt is charged before the
            // next claim in every case.
            .with_sweep_interval(Duration::ZERO)
            // Cases hold up to nine batches open at once.
            .with_held_connections(12);
        let outbox = PgOutbox::new(self.pool.clone(), config)?;
        outbox.install().await?;
        Ok(Box::new(common::PgFixture { outbox }))
    }
}

#[async_trait]
impl DedupHarness for PgHarness {
    async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(common::dedup_store(&self.pool, retention).await?))
    }

    async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(PgDistributedLock::new(self.pool.clone())))
    }
}

#[async_trait]
impl ConsumerHarness for PgHarness {
    async fn entities(&self) -> Result<Arc<dyn EntityStore>> {
        let config = PgEntityConfig::default().with_schema(common::schema_name());
        let store = PgEntityStore::new(self.pool.clone(), config)?;
        store.install().await?;
        Ok(Arc::new(store))
    }

    async fn dedup(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(common::dedup_store(&self.pool, retention).await?))
    }
}

/// The `application_name` of the lock handles' sessions, so that `sever` only ever
/// kills sessions of this test binary.
const LOCK_APP: &str = "outbox-lock-conformance";

/// Every lock handle is a pool of its own (another process, as far as the server can
/// tell); `sever` terminates the backend holding the guard's advisory lock.
#[async_trait]
impl LockHarness for PgHarness {
    async fn lock(&self) -> Result<Arc<dyn DistributedLock>> {
        let pool = common::pool_named(&self.url, 4, LOCK_APP).await;
        Ok(Arc::new(PgDistributedLock::new(pool)))
    }

    async fn sever(&self, guard: &dyn LockGuard) -> Result<()> {
        let pids: Vec<i32> = sqlx::query_scalar(locks::ADVISORY_LOCK_HOLDERS)
            .bind(guard.name().as_str())
            .bind(LOCK_APP)
            .fetch_all(&self.pool)
            .await
            .map_err(common::storage)?;
        let [pid] = pids[..] else {
            return Err(Error::new(
                ErrorKind::Storage,
                format!(
                    "expected one session holding {:?}, found {pids:?}",
                    guard.name()
                ),
            ));
        };
        let killed: bool = sqlx::query_scalar(locks::TERMINATE_SESSION)
            .bind(pid)
            .fetch_one(&self.pool)
            .await
            .map_err(common::storage)?;
        if killed {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::Storage,
                format!("could not terminate backend {pid}"),
            ))
        }
    }
}

async fn harness() -> Option<PgHarness> {
    harness_in(ClaimMode::Lease).await
}

async fn harness_in(mode: ClaimMode) -> Option<PgHarness> {
    let url = common::url("outbox-postgres conformance")?;
    Some(PgHarness {
        pool: common::pool(&url, 10).await,
        url,
        mode,
    })
}

outbox_testkit::backend_suites!(harness);

/// The conformance suite again with held-lock claims.
mod held_lock {
    use super::*;

    async fn harness() -> Option<PgHarness> {
        harness_in(ClaimMode::HeldLock).await
    }

    outbox_testkit::conformance_suite!(harness);
}
