//! The outbox-testkit dedup and lock suites against a real PostgreSQL server:
//! [`PgDedupStore`] in a fresh schema per store, [`PgDistributedLock`] on pools of their
//! own per handle.
//!
//! Run: `OUTBOX_PG_URL=postgres://postgres@127.0.0.1:5432/outbox_test cargo test -p outbox-postgres --test dedup_lock_conformance`

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{lock::LockGuard, DedupStore, DistributedLock, Error, ErrorKind, Result};
use outbox_postgres::PgDistributedLock;
use outbox_testkit::{DedupFeatures, DedupHarness, LockFeatures, LockHarness};
use sqlx::PgPool;

/// Makes one schema per dedup store on a shared database.
#[derive(Debug)]
struct PgDedupHarness {
    pool: PgPool,
}

#[async_trait]
impl DedupHarness for PgDedupHarness {
    fn features(&self) -> DedupFeatures {
        DedupFeatures::all()
    }

    async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(common::dedup_store(&self.pool, retention).await?))
    }

    async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(PgDistributedLock::new(self.pool.clone())))
    }
}

async fn dedup_harness() -> Option<PgDedupHarness> {
    let url = common::url("outbox-postgres dedup conformance")?;
    Some(PgDedupHarness {
        pool: common::pool(&url, 10).await,
    })
}

/// The `application_name` prefix of the lock handles' sessions, so that `sever` only
/// ever kills sessions of this test binary.
const LOCK_APP: &str = "outbox-lock-conformance";

/// Every handle is a pool of its own (another process, as far as the server can tell);
/// `sever` terminates the backend holding the guard's advisory lock.
#[derive(Debug)]
struct PgLockHarness {
    url: String,
    admin: PgPool,
}

/// The pid of the session of this test binary holding the advisory lock of `$1`, looked
/// up by the key `PgDistributedLock` documents (`hashtextextended(name, 0)`); `pg_locks`
/// shows a bigint key's high half as `classid` and its low half as `objid`.
const HOLDER: &str = "\
    SELECT l.pid FROM pg_locks l \
    JOIN pg_stat_activity a ON a.pid = l.pid \
    CROSS JOIN (SELECT hashtextextended($1, 0) AS k) key \
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
    AND l.classid = ((key.k >> 32) & 4294967295)::oid \
    AND l.objid = (key.k & 4294967295)::oid \
    AND a.application_name = $2";

#[async_trait]
impl LockHarness for PgLockHarness {
    fn features(&self) -> LockFeatures {
        LockFeatures::all()
    }

    async fn lock(&self) -> Result<Arc<dyn DistributedLock>> {
        let pool = common::pool_named(&self.url, 4, LOCK_APP).await;
        Ok(Arc::new(PgDistributedLock::new(pool)))
    }

    async fn sever(&self, guard: &dyn LockGuard) -> Result<()> {
        let pids: Vec<i32> = sqlx::query_scalar(HOLDER)
            .bind(guard.name().as_str())
            .bind(LOCK_APP)
            .fetch_all(&self.admin)
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
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&self.admin)
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

async fn lock_harness() -> Option<PgLockHarness> {
    let url = common::url("outbox-postgres lock conformance")?;
    let admin = common::pool(&url, 2).await;
    Some(PgLockHarness { url, admin })
}

outbox_testkit::dedup_suite!(dedup_harness);
outbox_testkit::lock_suite!(lock_harness);
