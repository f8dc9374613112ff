//! The outbox-testkit conformance suite against a real PostgreSQL server.
//!
//! Run: `OUTBOX_PG_URL=postgres://postgres@127.0.0.1:5432/outbox_test cargo test -p outbox-postgres --test conformance`

mod common;

use async_trait::async_trait;
use std::time::Duration;

use outbox_core::{store::StoreCapabilities, ClaimMode, Result};
use outbox_postgres::{PgOutbox, PgOutboxConfig};
use outbox_testkit::{Features, Fixture, Harness};
use sqlx::PgPool;

/// Makes one schema per case on a shared database.
struct PgHarness {
    pool: PgPool,
    mode: ClaimMode,
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

async fn make_harness() -> Option<PgHarness> {
    harness(ClaimMode::Lease).await
}

async fn harness(mode: ClaimMode) -> Option<PgHarness> {
    let url = common::url("outbox-postgres conformance")?;
    Some(PgHarness {
        pool: common::pool(&url, 10).await,
        mode,
    })
}

outbox_testkit::conformance_suite!(make_harness);

/// The whole suite again with held-lock claims.
mod held_lock {
    use super::*;

    async fn make_harness() -> Option<PgHarness> {
        harness(ClaimMode::HeldLock).await
    }

    outbox_testkit::conformance_suite!(make_harness);
}
