//! The outbox-testkit idempotent-consumer and dedup suites against DynamoDB Local:
//! [`DynamoEntityStore`] and [`DynamoDedupStore`], each in a table of its own.
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-dynamodb --test consumer_conformance`

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use outbox_core::consumer::EntityStore;
use outbox_core::{DedupStore, DistributedLock, Result};
use outbox_testkit::{ConsumerHarness, DedupFeatures, DedupHarness, MemoryLock};

#[derive(Debug)]
struct DynamoConsumerHarness {
    client: Client,
    /// This crate has no `DistributedLock` yet; the purger cases take unique lock
    /// names, so the testkit's in-process lock serves them.
    lock: MemoryLock,
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
        Ok(Arc::new(self.lock.clone()))
    }
}

async fn harness() -> Option<DynamoConsumerHarness> {
    let client = common::client("outbox-dynamodb consumer conformance").await?;
    Some(DynamoConsumerHarness {
        client,
        lock: MemoryLock::default(),
    })
}

outbox_testkit::consumer_suite!(harness);

mod dedup {
    use super::harness;
    outbox_testkit::dedup_suite!(harness);
}
