//! Shared helpers for the integration tests: the gate, connecting, isolated schemas.
//!
//! These tests need a SQL Server: set `OUTBOX_TEST_MSSQL_URL` to an ADO.NET connection
//! string (the crate README has the compose file and the one command). Without it,
//! every test prints a `SKIPPED` line and passes. This backend is exempt from
//! `OUTBOX_REQUIRE_INTEGRATION`: no SQL Server can run on the project's machines.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::Duration;

use outbox_core::Error;
use outbox_sqlserver::{MssqlConnection, MssqlPool};
use outbox_testkit::isolation;
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
