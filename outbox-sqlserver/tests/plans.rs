//! The testkit's plan suite on SQL Server: every statement a relay operation sends,
//! exactly as the store builds it, compiled under `SET SHOWPLAN_XML ON` against a
//! table loaded with 100,000 rows of history whose statistics are not updated
//! (`sp_autostats ... 'OFF'`), and read for how it reaches the outbox's rows.
//!
//! Runs only against a server you provide (see the crate README):
//! `OUTBOX_TEST_MSSQL_URL='server=tcp:127.0.0.1,1433;database=outbox_test;user id=sa;password=...;TrustServerCertificate=true' cargo test -p outbox-sqlserver --test plans`

mod common;

use async_trait::async_trait;
use outbox_core::{store::StoreCapabilities, MessageId, Result};
use outbox_sqlserver::{MssqlPool, PlanAccess};
use outbox_testkit::{
    Access, Fixture, History, PlanFixture, PlanHarness, PlannedStatement, RelayOp,
};
use uuid::Uuid;

struct MssqlPlanHarness {
    pool: MssqlPool,
}

#[async_trait]
impl PlanHarness for MssqlPlanHarness {
    async fn fixture(&self, capabilities: StoreCapabilities) -> Result<Box<dyn PlanFixture>> {
        Ok(Box::new(
            common::MssqlFixture::installed(&self.pool, capabilities).await?,
        ))
    }
}

/// The store's name for each relay operation (see `MssqlOutbox::explain_relay`).
fn op_name(op: RelayOp) -> &'static str {
    match op {
        RelayOp::Claim => "claim",
        RelayOp::ClaimIds => "claim_ids",
        RelayOp::Complete => "complete",
        RelayOp::Fail => "fail",
        RelayOp::Release => "release",
        RelayOp::SettleAndClaim => "settle_and_claim",
        RelayOp::Purge => "purge",
        other => panic!("no statements for {other:?}"),
    }
}

fn access(step: PlanAccess) -> Access {
    let bare = |name: String| {
        name.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned()
    };
    match step {
        PlanAccess::ByKey => Access::ByKey,
        PlanAccess::Seek(index) => Access::Index(bare(index)),
        PlanAccess::Scan(index) => Access::Scan(bare(index)),
    }
}

#[async_trait]
impl PlanFixture for common::MssqlFixture {
    fn fixture(&self) -> &dyn Fixture {
        self
    }

    async fn add_history(&self, history: History) -> Result<()> {
        let t = self.outbox.qualified_name();
        let rows = history.dispatched + history.dead + history.due + history.waiting;
        let (settled, dead) = (history.dispatched, history.dispatched + history.dead);
        let due_end = dead + history.due;
        // Counts the test computed itself, formatted as integers.
        let load = format!(
            "EXEC sp_autostats N'{t}', 'OFF'; \
             WITH n AS (SELECT TOP ({rows}) ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS i \
                        FROM sys.all_objects AS a CROSS JOIN sys.all_objects AS b) \
             INSERT INTO {t} (id, destination, partition_key, payload, headers, available_at, \
                              dispatched_at, dead_at) \
             SELECT CAST(NEWID() AS binary(16)), N'plans', CONCAT(N'k', n.i % 8), 0x00, N'{{}}', \
                    CASE WHEN n.i > {due_end} THEN DATEADD(HOUR, 1, SYSUTCDATETIME()) \
                         ELSE DATEADD(MINUTE, -1, SYSUTCDATETIME()) END, \
                    CASE WHEN n.i <= {settled} THEN SYSUTCDATETIME() END, \
                    CASE WHEN n.i > {settled} AND n.i <= {dead} THEN SYSUTCDATETIME() END \
             FROM n ORDER BY n.i;"
        );
        let mut client = self.outbox.pool().get().await.map_err(common::storage)?;
        common::run(&mut client, &load).await
    }

    async fn plans(&self, op: RelayOp) -> Result<Vec<PlannedStatement>> {
        let ids = self.backlog_ids().await?;
        let table = self.outbox.qualified_name().table().to_owned();
        let explained = self.outbox.explain_relay(op_name(op), &ids).await?;
        Ok(explained
            .into_iter()
            .map(|e| PlannedStatement {
                accesses: outbox_sqlserver::showplan_accesses(&e.plan, &table)
                    .into_iter()
                    .map(access)
                    .collect(),
                text: e.sql,
                variant: "estimated".to_owned(),
                plan: e.plan,
            })
            .collect())
    }
}

impl common::MssqlFixture {
    /// Due rows of the backlog: the ids a settle or a claim by id would name.
    async fn backlog_ids(&self) -> Result<Vec<MessageId>> {
        let t = self.outbox.qualified_name();
        let mut client = self.outbox.pool().get().await.map_err(common::storage)?;
        let rows = client
            .simple_query(format!(
                "SELECT TOP (64) id FROM {t} WHERE dispatched_at IS NULL AND dead_at IS NULL \
                 ORDER BY seq"
            ))
            .await
            .map_err(common::storage)?
            .into_first_result()
            .await
            .map_err(common::storage)?;
        Ok(rows
            .iter()
            .filter_map(|row| row.get::<&[u8], _>("id"))
            .filter_map(|id| Uuid::from_slice(id).ok())
            .map(MessageId::from_uuid)
            .collect())
    }
}

async fn harness() -> Option<MssqlPlanHarness> {
    let url = common::url("outbox-sqlserver plans")?;
    Some(MssqlPlanHarness {
        pool: common::pool(&common::connection(&url), 4).await,
    })
}

outbox_testkit::plan_suite!(harness);
