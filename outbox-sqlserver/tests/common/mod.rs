//! Shared helpers for the integration tests: the gate, connecting, isolated schemas.
//!
//! These tests need a SQL Server: set `OUTBOX_TEST_MSSQL_URL` to an ADO.NET connection
//! string (the crate README has the compose file and the one command). Without it,
//! every test prints a `SKIPPED` line and passes. This backend is exempt from
//! `OUTBOX_REQUIRE_INTEGRATION`: CI does not run a SQL Server.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::Duration;

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::{Error, MessageId, NewMessage, OutboxAdmin, OutboxStore, Result};
use outbox_sqlserver::tiberius::Query;
use outbox_sqlserver::{MssqlConnection, MssqlManager, MssqlOutbox, MssqlPool};
use outbox_testkit::isolation;
use outbox_testkit::{Fixture, RowLock};
use tokio::sync::OnceCell;

/// The variable naming the test server.
pub const URL_VAR: &str = "OUTBOX_TEST_MSSQL_URL";

/// The connection string, or `None` after a visible skip line when it is not set.
/// Deliberately not `outbox_testkit::service_url`: that panics under
/// `OUTBOX_REQUIRE_INTEGRATION=1`, and this backend is exempt from it.
pub fn url(what: &str) -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            eprintln!(
                "SKIPPED: {what}: {URL_VAR} not set (SQL Server tests run only against a \
                 server you provide; see outbox-sqlserver's README)"
            );
            None
        }
    }
}

/// The parsed connection string.
pub fn connection(url: &str) -> MssqlConnection {
    MssqlConnection::from_ado_string(url).expect("a valid OUTBOX_TEST_MSSQL_URL")
}

/// A small pool for one test (each `#[tokio::test]` has its own runtime, and
/// connections belong to the runtime that opened them).
pub async fn pool(connection: &MssqlConnection, max: u32) -> MssqlPool {
    let pool = connection
        .pool(max)
        .await
        .expect("connect to OUTBOX_TEST_MSSQL_URL");
    drop_stale_schemas(&pool).await;
    pool
}

/// A fresh schema name ([`isolation::unique_name`]), so stale ones can be dropped.
pub fn schema_name() -> String {
    isolation::unique_name()
}

/// Drop the test schemas (tables first) [`isolation::is_stale`] names, once per test
/// binary.
async fn drop_stale_schemas(pool: &MssqlPool) {
    static ONCE: OnceCell<()> = OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let Ok(mut client) = pool.get().await else {
            return;
        };
        let Ok(stream) = client
            .simple_query(
                "SELECT s.name AS schema_name, t.name AS table_name FROM sys.schemas AS s \
                 LEFT JOIN sys.tables AS t ON t.schema_id = s.schema_id \
                 WHERE s.name LIKE 'obx[_]%'",
            )
            .await
        else {
            return;
        };
        let Ok(rows) = stream.into_first_result().await else {
            return;
        };
        let mut drops = Vec::new();
        let mut schemas = std::collections::BTreeSet::new();
        for row in &rows {
            let Some(schema) = row.get::<&str, _>("schema_name") else {
                continue;
            };
            if !isolation::is_stale(schema) {
                continue;
            }
            schemas.insert(schema.to_owned());
            if let Some(table) = row.get::<&str, _>("table_name") {
                if table
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                {
                    drops.push(format!("DROP TABLE IF EXISTS [{schema}].[{table}];"));
                }
            }
        }
        for schema in schemas {
            drops.push(format!("DROP SCHEMA IF EXISTS [{schema}];"));
        }
        for statement in drops {
            // Names matched the test pattern above, so they are plain identifiers.
            if let Ok(stream) = client.simple_query(statement).await {
                let _ = stream.into_results().await;
            }
        }
    })
    .await;
}

/// A driver error from test plumbing, as a core error.
pub fn storage(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    isolation::plumbing_error(e)
}

/// Run `sql` (no parameters) on `client`, reading every result.
pub async fn run(client: &mut outbox_sqlserver::MssqlClient, sql: &str) -> outbox_core::Result<()> {
    client
        .simple_query(sql)
        .await
        .map_err(storage)?
        .into_results()
        .await
        .map_err(storage)?;
    Ok(())
}

/// A [`MssqlDedupStore`](outbox_sqlserver::MssqlDedupStore) remembering ids for
/// `retention`, installed in a fresh schema of its own.
pub async fn dedup_store(
    pool: &MssqlPool,
    retention: Duration,
) -> outbox_core::Result<outbox_sqlserver::MssqlDedupStore> {
    let config = outbox_sqlserver::MssqlDedupConfig::default()
        .with_schema(schema_name())
        .with_retention(retention);
    let store = outbox_sqlserver::MssqlDedupStore::new(pool.clone(), config)?;
    store.install().await?;
    Ok(store)
}

/// A conformance fixture on an installed outbox: enqueue in a transaction, mark
/// dispatched and lock rows with the test's own statements.
#[derive(Debug)]
pub struct MssqlFixture {
    pub outbox: MssqlOutbox,
}

impl MssqlFixture {
    /// An outbox with `capabilities`, installed in a fresh schema of its own.
    pub async fn installed(
        pool: &MssqlPool,
        capabilities: outbox_core::store::StoreCapabilities,
    ) -> Result<Self> {
        let config = outbox_sqlserver::MssqlOutboxConfig::default()
            .with_schema(schema_name())
            .with_ordering(capabilities.ordering)
            .with_retention(capabilities.retention);
        let outbox = MssqlOutbox::new(pool.clone(), config)?;
        outbox.install().await?;
        Ok(MssqlFixture { outbox })
    }

    /// Enqueue in a transaction and end it with `end` (`COMMIT` or `ROLLBACK`).
    async fn enqueue_then(&self, messages: Vec<NewMessage>, end: &str) -> Result<()> {
        let mut client = self.outbox.pool().get().await.map_err(storage)?;
        run(&mut client, "BEGIN TRANSACTION").await?;
        match self.outbox.enqueue(&mut *client, &messages).await {
            Ok(()) => run(&mut client, end).await,
            Err(err) => {
                run(&mut client, "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION").await?;
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
        let mut client = self.outbox.pool().get().await.map_err(storage)?;
        let mut query = Query::new(format!(
            "UPDATE {} SET dispatched_at = SYSUTCDATETIME() WHERE id = @P1",
            self.outbox.qualified_name()
        ));
        query.bind(id.as_uuid().as_bytes().to_vec());
        query.execute(&mut *client).await.map_err(storage)?;
        Ok(())
    }

    /// An exclusive row lock held by an open transaction, as a concurrent writer's
    /// `UPDATE` would hold it.
    async fn lock_row(&self, id: MessageId) -> Result<Box<dyn RowLock>> {
        let mut client = self.outbox.pool().get_owned().await.map_err(storage)?;
        run(&mut client, "BEGIN TRANSACTION").await?;
        let mut query = Query::new(format!(
            "UPDATE {} WITH (ROWLOCK) SET last_error = last_error WHERE id = @P1",
            self.outbox.qualified_name()
        ));
        query.bind(id.as_uuid().as_bytes().to_vec());
        query.execute(&mut *client).await.map_err(storage)?;
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
        run(&mut self.client, "ROLLBACK TRANSACTION").await
    }
}
