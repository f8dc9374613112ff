//! Every outbox-testkit suite against DynamoDB Local, plainly and again under a seeded
//! mix of AWS's faults: [`DynamoOutbox`](outbox_dynamodb::DynamoOutbox) in a table of
//! its own per case, [`DynamoDedupStore`](outbox_dynamodb::DynamoDedupStore) and
//! [`DynamoEntityStore`](outbox_dynamodb::DynamoEntityStore) each in a table of its
//! own, and [`DynamoDistributedLock`] over a lock table per case, every handle with a
//! client (connections) of its own.
//!
//! Under faults (`outbox_dynamodb::faults`, module `under_faults`): 5% of every
//! data-plane attempt throttled (`ThrottlingException` or
//! `ProvisionedThroughputExceededException`, with throttling reasons), one statement of
//! 5% of the batched completes failing with `ThrottlingError`, and 1% of enqueue
//! transactions cancelled for a `TransactionConflict`, all before the request is
//! applied (no lagging index here: see `common::fault_mix`). The client retries as
//! recommended for DynamoDB (standard mode, 10 attempts, 5 to 200 ms backoff); the
//! fixture resends an enqueue that failed retryably, as a caller would. Every guarantee
//! the plain run checks must hold. Each case prints its seed and, when it ends, what
//! was injected into it (shown for a failing case). Replay one with
//! `OUTBOX_FAULT_SEED=<seed>`.
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-dynamodb --test conformance`

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use outbox_core::consumer::EntityStore;
use outbox_core::lock::LockGuard;
use outbox_core::store::StoreCapabilities;
use outbox_core::{DedupStore, DistributedLock, Result};
use outbox_dynamodb::{DynamoDistributedLock, DynamoLockConfig};
use outbox_testkit::{ConsumerHarness, DedupHarness, Fixture, Harness, LockHarness};
use tokio::sync::OnceCell;

/// The suites' stores on one DynamoDB Local, through `outbox`'s client (with the fault
/// mix registered, under faults); the lock table is installed on first use.
#[derive(Debug)]
struct DynamoSuites {
    outbox: common::DynamoHarness,
    url: String,
    /// A client without faults, to lapse a lease as a stopped holder would.
    admin: Client,
    /// The case's lock table: the purgers' lock and the lock suite's handles.
    locks: OnceCell<DynamoLockConfig>,
}

impl DynamoSuites {
    async fn new(what: &str, under_faults: bool) -> Option<Self> {
        let url = common::url(what)?;
        let admin = common::client(what).await?;
        let outbox = if under_faults {
            common::DynamoHarness::under_faults(&admin, what)
        } else {
            common::DynamoHarness::plain(admin.clone())
        };
        Some(DynamoSuites {
            outbox,
            url,
            admin,
            locks: OnceCell::new(),
        })
    }

    /// The case's installed lock table: short leases, so that a broken release (a
    /// drop that sent nothing) would still end within the suite's deadline.
    async fn locks(&self) -> Result<&DynamoLockConfig> {
        self.locks
            .get_or_try_init(|| async {
                let config = DynamoLockConfig::default()
                    .with_lease(Duration::from_secs(5))
                    .with_renew_every(Duration::from_secs(1))
                    .with_table(common::table_name("locks"));
                DynamoDistributedLock::new(self.admin.clone(), config.clone())?
                    .install()
                    .await?;
                Ok(config)
            })
            .await
    }

    /// A lock handle with a client of its own, as another process would have (under
    /// faults, with the case's fault mix).
    async fn handle(&self) -> Result<DynamoDistributedLock> {
        let client = common::client_for(&self.url);
        let client = match &self.outbox.faults {
            Some(faults) => common::faulty_client(&client, faults),
            None => client,
        };
        DynamoDistributedLock::new(client, self.locks().await?.clone())
    }
}

#[async_trait]
impl Harness for DynamoSuites {
    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        self.outbox.fixture(capabilities).await
    }
}

#[async_trait]
impl DedupHarness for DynamoSuites {
    async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(
            common::dedup(&self.outbox.client, retention).await?,
        ))
    }

    async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(self.handle().await?))
    }
}

#[async_trait]
impl ConsumerHarness for DynamoSuites {
    async fn entities(&self) -> Result<Arc<dyn EntityStore>> {
        Ok(Arc::new(common::entities(&self.outbox.client).await?))
    }

    async fn dedup(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(
            common::dedup(&self.outbox.client, retention).await?,
        ))
    }
}

/// `sever` makes a guard's lease lapse in the table, as a holder that stopped renewing
/// (a crash, a partition) would leave it.
#[async_trait]
impl LockHarness for DynamoSuites {
    async fn lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(self.handle().await?))
    }

    async fn sever(&self, guard: &dyn LockGuard) -> Result<()> {
        let table = self.locks().await?.table().to_owned();
        common::lapse_lock(&self.admin, &table, guard.name()).await
    }
}

async fn harness() -> Option<DynamoSuites> {
    DynamoSuites::new("outbox-dynamodb conformance", false).await
}

// DynamoDB has no transaction that holds an item: nothing for claims to skip.
outbox_testkit::backend_suites!(harness; lacks(row_locks));

/// Every suite again under the fault mix (the seed is printed).
mod under_faults {
    use super::*;

    async fn harness() -> Option<DynamoSuites> {
        DynamoSuites::new("outbox-dynamodb conformance under faults", true).await
    }

    outbox_testkit::backend_suites!(harness; lacks(row_locks));
}
