//! The outbox-testkit conformance suite against a real SQL Server.
//!
//! Run (with a server; see the crate README for the compose file):
//! `OUTBOX_TEST_MSSQL_URL='server=tcp:127.0.0.1,1433;user id=sa;password=...;TrustServerCertificate=true' cargo test -p outbox-sqlserver --test conformance`
//!
//! Without `OUTBOX_TEST_MSSQL_URL` every case prints a `SKIPPED` line.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::{MessageId, NewMessage, OutboxAdmin, OutboxStore, Result, StoreCapabilities};
use outbox_sqlserver::tiberius::Query;
use outbox_sqlserver::{MssqlManager, MssqlOutbox, MssqlOutboxConfig, MssqlPool};
use outbox_testkit::{Features, Fixture, Harness, RowLock};

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
        let config = MssqlOutboxConfig::default()
            .with_schema(common::schema_name())
            .with_ordering(capabilities.ordering)
            .with_retention(capabilities.retention);
        let outbox = MssqlOutbox::new(self.pool.clone(), config)?;
        outbox.install().await?;
        Ok(Box::new(MssqlFixture { outbox }))
    }
}

#[derive(Debug)]
struct MssqlFixture {
    outbox: MssqlOutbox,
}

impl MssqlFixture {
    /// Enqueue in a transaction and end it with `end` (`COMMIT` or `ROLLBACK`).
    async fn enqueue_then(&self, messages: Vec<NewMessage>, end: &str) -> Result<()> {
        let mut client = self.outbox.pool().get().await.map_err(common::storage)?;
        common::run(&mut client, "BEGIN TRANSACTION").await?;
        match self.outbox.enqueue(&mut *client, &messages).await {
            Ok(()) => common::run(&mut client, end).await,
            Err(err) => {
                common::run(&mut client, "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION").await?;
                Err(err)
            }
        }
    }
}

#[async_trait]
impl Fixture for MssqlFixture {
    fn store(&self) -> Arc<dyn OutboxStore> {
        Arc::new(self.outbox.clone())
    }

    fn admin(&self) -> Arc<dyn OutboxAdmin> {
        Arc::new(self.outbox.clone())
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<()> {
        self.enqueue_then(messages, "COMMIT TRANSACTION").await
    }

    async fn enqueue_rolled_back(&self, messages: Vec<NewMessage>) -> Result<()> {
        self.enqueue_then(messages, "ROLLBACK TRANSACTION").await
    }

    async fn mark_dispatched(&self, id: MessageId) -> Result<()> {
        let mut client = self.outbox.pool().get().await.map_err(common::storage)?;
        let mut query = Query::new(format!(
            "UPDATE {} SET dispatched_at = SYSUTCDATETIME() WHERE id = @P1",
            self.outbox.qualified_name()
        ));
        query.bind(id.as_uuid().as_bytes().to_vec());
        query.execute(&mut *client).await.map_err(common::storage)?;
        Ok(())
    }

    /// An exclusive row lock held by an open transaction, as a concurrent writer's
    /// `UPDATE` would hold it.
    async fn lock_row(&self, id: MessageId) -> Result<Box<dyn RowLock>> {
        let mut client = self
            .outbox
            .pool()
            .get_owned()
            .await
            .map_err(common::storage)?;
        common::run(&mut client, "BEGIN TRANSACTION").await?;
        let mut query = Query::new(format!(
            "UPDATE {} WITH (ROWLOCK) SET last_error = last_error WHERE id = @P1",
            self.outbox.qualified_name()
        ));
        query.bind(id.as_uuid().as_bytes().to_vec());
        query.execute(&mut *client).await.map_err(common::storage)?;
        Ok(Box::new(MssqlRowLock { client }))
    }
}

/// A transaction holding a row lock until released.
struct MssqlRowLock {
    client: bb8::PooledConnection<'static, MssqlManager>,
}

impl std::fmt::Debug for MssqlRowLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MssqlRowLock").finish_non_exhaustive()
    }
}

#[async_trait]
impl RowLock for MssqlRowLock {
    async fn release(mut self: Box<Self>) -> Result<()> {
        common::run(&mut self.client, "ROLLBACK TRANSACTION").await
    }
}

async fn make_harness() -> Option<MssqlHarness> {
    let url = common::url("outbox-sqlserver conformance")?;
    Some(MssqlHarness {
        pool: common::pool(&common::connection(&url), 10).await,
    })
}

outbox_testkit::conformance_suite!(make_harness; lacks(lease_renewal));
