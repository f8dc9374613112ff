//! The outbox-testkit idempotent-consumer suite against a real MySQL or MariaDB
//! server: [`MySqlEntityStore`] and [`MySqlDedupStore`](outbox_mysql::MySqlDedupStore),
//! each in a fresh database per case.
//!
//! Run: `OUTBOX_MYSQL_URL=mysql://root@127.0.0.1:3306/outbox_test cargo test -p outbox-mysql --test consumer_conformance`

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::consumer::EntityStore;
use outbox_core::{DedupStore, Result};
use outbox_mysql::{MySqlEntityConfig, MySqlEntityStore};
use outbox_testkit::{ConsumerHarness, DedupFeatures};
use sqlx::MySqlPool;

#[derive(Debug)]
struct MySqlConsumerHarness {
    pool: MySqlPool,
}

#[async_trait]
impl ConsumerHarness for MySqlConsumerHarness {
    fn features(&self) -> DedupFeatures {
        DedupFeatures::all()
    }

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

async fn harness() -> Option<MySqlConsumerHarness> {
    let url = common::url("outbox-mysql consumer conformance")?;
    Some(MySqlConsumerHarness {
        pool: common::pool(&url, 10).await,
    })
}

outbox_testkit::consumer_suite!(harness);
