//! The outbox-testkit conformance suite against a real MySQL or MariaDB server.
//!
//! Run: `OUTBOX_MYSQL_URL=mysql://root@127.0.0.1:3306/outbox_test cargo test -p outbox-mysql --test conformance`

mod common;

use async_trait::async_trait;
use outbox_core::{store::StoreCapabilities, ClaimMode, Result};
use outbox_mysql::{MySqlClaimConfig, MySqlOutbox, MySqlOutboxConfig};
use outbox_testkit::{Features, Fixture, Harness};
use sqlx::MySqlPool;

/// Makes one database per case on a shared server.
struct MySqlHarness {
    pool: MySqlPool,
    claims: MySqlClaimConfig,
}

#[async_trait]
impl Harness for MySqlHarness {
    fn features(&self) -> Features {
        Features::all()
    }

    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        let config = MySqlOutboxConfig::default()
            .with_schema(common::schema_name())
            .with_ordering(capabilities.ordering)
            .with_retention(capabilities.retention);
        let outbox = MySqlOutbox::new(self.pool.clone(), config)?.with_claims(self.claims.clone());
        outbox.install().await?;
        Ok(Box::new(common::MySqlFixture { outbox }))
    }
}

async fn harness(claims: MySqlClaimConfig) -> Option<MySqlHarness> {
    let url = common::url("outbox-mysql conformance")?;
    Some(MySqlHarness {
        pool: common::pool(&url, 10).await,
        claims,
    })
}

async fn make_harness() -> Option<MySqlHarness> {
    harness(MySqlClaimConfig::default()).await
}

outbox_testkit::conformance_suite!(make_harness);

/// The whole suite again with held-lock claims (sweeping before every claim, and
/// connections for the suite's concurrent claimers).
mod held_lock {
    use super::*;

    async fn make_harness() -> Option<MySqlHarness> {
        let claims = MySqlClaimConfig::default()
            .with_claim_mode(ClaimMode::HeldLock)
            .with_held_connections(12)
            .with_sweep_interval(std::time::Duration::ZERO);
        harness(claims).await
    }

    outbox_testkit::conformance_suite!(make_harness);
}
