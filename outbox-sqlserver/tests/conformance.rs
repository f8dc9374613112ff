//! Every outbox-testkit suite against a real SQL Server: the conformance suite,
//! [`MssqlDedupStore`](outbox_sqlserver::MssqlDedupStore) in a fresh schema per store,
//! [`MssqlDistributedLock`] with a connection of its own per lock, and the idempotent
//! consumer over [`MssqlEntityStore`] and the dedup store.
//!
//! Run (with a server; see the crate README for the compose file):
//! `OUTBOX_TEST_MSSQL_URL='server=tcp:127.0.0.1,1433;user id=sa;password=...;TrustServerCertificate=true' cargo test -p outbox-sqlserver --test conformance`
//!
//! Without `OUTBOX_TEST_MSSQL_URL` when built, every case shows as ignored.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::consumer::EntityStore;
use outbox_core::lock::LockGuard;
use outbox_core::store::StoreCapabilities;
use outbox_core::{DedupStore, DistributedLock, Error, ErrorKind, Result};
use outbox_sqlserver::tiberius::Query;
use outbox_sqlserver::{
    MssqlConnection, MssqlDistributedLock, MssqlEntityConfig, MssqlEntityStore, MssqlPool,
};
use outbox_testkit::{ConsumerHarness, DedupHarness, Fixture, Harness, LockHarness};

/// One schema per store on a shared database; lock handles on pools of their own.
struct MssqlHarness {
    connection: MssqlConnection,
    pool: MssqlPool,
}

#[async_trait]
impl Harness for MssqlHarness {
    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        Ok(Box::new(
            common::MssqlFixture::installed(&self.pool, capabilities).await?,
        ))
    }
}

#[async_trait]
impl DedupHarness for MssqlHarness {
    async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(common::dedup_store(&self.pool, retention).await?))
    }

    async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(MssqlDistributedLock::new(self.pool.clone())))
    }
}

#[async_trait]
impl ConsumerHarness for MssqlHarness {
    async fn entities(&self) -> Result<Arc<dyn EntityStore>> {
        let config = MssqlEntityConfig::default().with_schema(common::schema_name());
        let store = MssqlEntityStore::new(self.pool.clone(), config)?;
        store.install().await?;
        Ok(Arc::new(store))
    }

    async fn dedup(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(common::dedup_store(&self.pool, retention).await?))
    }
}

/// The application name of the lock handles' sessions, so that `sever` only ever
/// kills sessions of this test binary.
const LOCK_APP: &str = "outbox-lock-conformance";

/// The session id a guard's `Debug` shows (`session_id: 57`).
fn session_id(guard: &dyn LockGuard) -> Option<i32> {
    let shown = format!("{guard:?}");
    let rest = shown.split("session_id: ").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Every lock handle opens connections of its own (another process, as far as the
/// server can tell); `sever` kills the session holding the guard's application lock.
#[async_trait]
impl LockHarness for MssqlHarness {
    async fn lock(&self) -> Result<Arc<dyn DistributedLock>> {
        // A pool of its own per handle, its sessions named so `sever` finds them.
        let connection = self.connection.with_application_name(LOCK_APP)?;
        let pool = connection.pool(2).await?;
        Ok(Arc::new(MssqlDistributedLock::new(pool)))
    }

    async fn sever(&self, guard: &dyn LockGuard) -> Result<()> {
        let spid = session_id(guard)
            .ok_or_else(|| Error::new(ErrorKind::Storage, format!("no session id in {guard:?}")))?;
        let mut client = self.pool.get().await.map_err(common::storage)?;
        // Only a session of this binary that holds an application lock.
        let mut check = Query::new(
            "SELECT COUNT(*) AS n FROM sys.dm_tran_locks AS l \
             JOIN sys.dm_exec_sessions AS s ON s.session_id = l.request_session_id \
             WHERE l.resource_type = 'APPLICATION' AND l.request_session_id = @P1 \
             AND s.program_name = @P2",
        );
        check.bind(spid);
        check.bind(LOCK_APP);
        let rows = check
            .query(&mut *client)
            .await
            .map_err(common::storage)?
            .into_first_result()
            .await
            .map_err(common::storage)?;
        let held: Option<i32> = rows.first().and_then(|r| r.get("n"));
        if held != Some(1) {
            return Err(Error::new(
                ErrorKind::Storage,
                format!("session {spid} does not hold one application lock ({held:?})"),
            ));
        }
        // `KILL` takes no parameter; the id is an integer read back from the server.
        common::run(&mut client, &format!("KILL {spid}")).await
    }
}

async fn harness() -> Option<MssqlHarness> {
    let url = common::url("outbox-sqlserver conformance")?;
    let connection = common::connection(&url);
    Some(MssqlHarness {
        pool: common::pool(&connection, 10).await,
        connection,
    })
}

// SQL Server cannot end an idle transaction, so its claims are leases only, and
// leases are not renewed.
outbox_testkit::backend_suites!(harness; lacks(lease_renewal));
