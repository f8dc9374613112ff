//! The outbox-testkit idempotent-consumer and dedup suites against DynamoDB Local:
//! [`DynamoEntityStore`] and [`DynamoDedupStore`], each in a table of its own, with a
//! [`DynamoDistributedLock`] for the purgers.
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-dynamodb --test consumer_conformance`

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use outbox_core::consumer::EntityStore;
use outbox_core::{DedupStore, DistributedLock, Result};
use outbox_dynamodb::{DynamoDistributedLock, DynamoLockConfig};
use outbox_testkit::{ConsumerHarness, DedupFeatures, DedupHarness};
use tokio::sync::OnceCell;

#[derive(Debug)]
struct DynamoConsumerHarness {
    client: Client,
    /// The purgers' lock: one table per harness, installed on first use, shared by
    /// every handle the case asks for.
    lock: OnceCell<DynamoDistributedLock>,
    /// Under the fault mix: the injector `client` carries.
    faults: Option<outbox_dynamodb::faults::FaultInjector>,
}

impl Drop for DynamoConsumerHarness {
    /// Under faults, print what was injected into the case (shown when it fails).
    fn drop(&mut self) {
        if let Some(faults) = &self.faults {
            eprintln!("{faults}");
        }
    }
}

#[async_trait]
impl ConsumerHarness for DynamoConsumerHarness {
    fn features(&self) -> DedupFeatures {
        DedupFeatures::all()
    }

    async fn entities(&self) -> Result<Arc<dyn EntityStore>> {
        Ok(Arc::new(common::entities(&self.client).await?))
    }

    async fn dedup(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(common::dedup(&self.client, retention).await?))
    }
}

#[async_trait]
impl DedupHarness for DynamoConsumerHarness {
    fn features(&self) -> DedupFeatures {
        DedupFeatures::all()
    }

    async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(common::dedup(&self.client, retention).await?))
    }

    async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>> {
        let lock = self
            .lock
            .get_or_try_init(|| async {
                let config = DynamoLockConfig::default().with_table(common::table_name("locks"));
                let lock = DynamoDistributedLock::new(self.client.clone(), config)?;
                lock.install().await?;
                Ok::<_, outbox_core::Error>(lock)
            })
            .await?;
        Ok(Arc::new(lock.clone()))
    }
}

async fn harness() -> Option<DynamoConsumerHarness> {
    let client = common::client("outbox-dynamodb consumer conformance").await?;
    Some(DynamoConsumerHarness {
        client,
        lock: OnceCell::new(),
        faults: None,
    })
}

outbox_testkit::consumer_suite!(harness);

mod dedup {
    use super::harness;
    outbox_testkit::dedup_suite!(harness);
}

/// Both suites again, the entity, dedup and lock stores' requests under the crate's
/// fault mix (the seed is printed).
mod under_faults {
    use super::*;

    async fn harness() -> Option<DynamoConsumerHarness> {
        let what = "outbox-dynamodb consumer conformance under faults";
        let client = common::client(what).await?;
        let faults = common::fault_mix(what);
        Some(DynamoConsumerHarness {
            client: common::faulty_client(&client, &faults),
            lock: OnceCell::new(),
            faults: Some(faults),
        })
    }

    outbox_testkit::consumer_suite!(harness);

    mod dedup {
        use super::harness;
        outbox_testkit::dedup_suite!(harness);
    }
}
