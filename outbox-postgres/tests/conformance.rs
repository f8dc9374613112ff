//! The outbox-testkit conformance suite against a real PostgreSQL server.
//!
//! Run: `OUTBOX_PG_URL=postgres://postgres@127.0.0.1:5432/outbox_test cargo test -p outbox-postgres --test conformance`

mod common;

use async_trait::async_trait;
use outbox_core::{Result, StoreCapabilities};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use outbox_testkit::{Features, Fixture, Harness};
use sqlx::PgPool;

/// Makes one schema per case on a shared database.
struct PgHarness {
    pool: PgPool,
}

#[async_trait]
impl Harness for PgHarness {
    fn features(&self) -> Features {
        Features::all()
    }

    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        let config = PgOutboxConfig::default()
            .with_schema(common::schema_name())
            .with_ordering(capabilities.ordering)
            .with_retention(capabilities.retention);
        let outbox = PgOutbox::new(self.pool.clone(), config)?;
        outbox.install().await?;
        Ok(Box::new(common::PgFixture { outbox }))
    }
}

async fn make_harness() -> Option<PgHarness> {
    let url = common::url("outbox-postgres conformance")?;
    Some(PgHarness {
        pool: common::pool(&url, 10).await,
    })
}

outbox_testkit::conformance_suite!(make_harness);
