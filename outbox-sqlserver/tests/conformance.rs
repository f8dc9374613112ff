//! The outbox-testkit conformance suite against a real SQL Server.
//!
//! Run (with a server; see the crate README for the compose file):
//! `OUTBOX_TEST_MSSQL_URL='server=tcp:127.0.0.1,1433;user id=sa;password=...;TrustServerCertificate=true' cargo test -p outbox-sqlserver --test conformance`
//!
//! Without `OUTBOX_TEST_MSSQL_URL` every case prints a `SKIPPED` line.

mod common;

use async_trait::async_trait;
use outbox_core::{store::StoreCapabilities, Result};
use outbox_sqlserver::MssqlPool;
use outbox_testkit::{Features, Fixture, Harness};

/// Makes one schema per case on a shared database.
struct MssqlHarness {
    pool: MssqlPool,
}

#[async_trait]
impl Harness for MssqlHarness {
    fn features(&self) -> Features {
        Features::all()
    }

    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn Fixture>> {
        Ok(Box::new(
            common::MssqlFixture::installed(&self.pool, capabilities).await?,
        ))
    }
}

async fn make_harness() -> Option<MssqlHarness> {
    let url = common::url("outbox-sqlserver conformance")?;
    Some(MssqlHarness {
        pool: common::pool(&common::connection(&url), 10).await,
    })
}

outbox_testkit::conformance_suite!(make_harness; lacks(lease_renewal));
