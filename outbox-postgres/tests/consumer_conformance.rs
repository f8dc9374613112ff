//! The outbox-testkit idempotent-consumer suite against a real PostgreSQL server:
//! [`PgEntityStore`] and [`PgDedupStore`], each in a fresh schema per case.
//!
//! Run: `OUTBOX_PG_URL=postgres://postgres@127.0.0.1:5432/outbox_test cargo test -p outbox-postgres --test consumer_conformance`

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::consumer::EntityStore;
use outbox_core::{DedupStore, Result};
use outbox_postgres::{PgEntityConfig, PgEntityStore};
use outbox_testkit::{ConsumerHarness, DedupFeatures};
use sqlx::PgPool;

#[derive(Debug)]
struct PgConsumerHarness {
    pool: PgPool,
}

#[async_trait]
impl ConsumerHarness for PgConsumerHarness {
    fn features(&self) -> DedupFeatures {
        DedupFeatures::all()
    }

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

async fn harness() -> Option<PgConsumerHarness> {
    let url = common::url("outbox-postgres consumer conformance")?;
    Some(PgConsumerHarness {
        pool: common::pool(&url, 10).await,
    })
}

outbox_testkit::consumer_suite!(harness);
