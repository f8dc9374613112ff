//! The outbox-testkit idempotent-consumer suite against a real SQL Server:
//! [`MssqlEntityStore`] and [`MssqlDedupStore`](outbox_sqlserver::MssqlDedupStore),
//! each in a fresh schema per case.
//!
//! Run: `OUTBOX_TEST_MSSQL_URL='server=tcp:127.0.0.1,1433;user id=sa;password=...;TrustServerCertificate=true' cargo test -p outbox-sqlserver --test consumer_conformance`

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::consumer::EntityStore;
use outbox_core::{DedupStore, Result};
use outbox_sqlserver::{MssqlEntityConfig, MssqlEntityStore, MssqlPool};
use outbox_testkit::{ConsumerHarness, DedupFeatures};

#[derive(Debug)]
struct MssqlConsumerHarness {
    pool: MssqlPool,
}

#[async_trait]
impl ConsumerHarness for MssqlConsumerHarness {
    fn features(&self) -> DedupFeatures {
        DedupFeatures::all()
    }

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

async fn harness() -> Option<MssqlConsumerHarness> {
    let url = common::url("outbox-sqlserver consumer conformance")?;
    Some(MssqlConsumerHarness {
        pool: common::pool(&common::connection(&url), 10).await,
    })
}

outbox_testkit::consumer_suite!(harness);
