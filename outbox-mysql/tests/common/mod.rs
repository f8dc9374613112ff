//! Shared helpers for the integration tests: connecting, isolated databases (a MySQL
//! "schema" is a database), the conformance fixture.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{Error, MessageId, NewMessage, OutboxAdmin, OutboxStore, Result};
use outbox_mysql::MySqlOutbox;
use outbox_testkit::{isolation, Fixture, RowLock};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{MySql, MySqlPool, Transaction};
use tokio::sync::OnceCell;

/// The variable naming the test database.
pub const URL_VAR: &str = "OUTBOX_MYSQL_URL";

/// The database URL, or `None` (after a visible skip line) when it is not set.
pub fn url(what: &str) -> Option<String> {
    outbox_testkit::service_url(URL_VAR, what)
}

/// `service_test!` for the tests that need the database: ignored, with this reason,
/// when `OUTBOX_MYSQL_URL` was not set at build time. Each test awaits its fixture first
/// (a future of `Option`: `None` skips it), for example [`service_url`] or [`connect`].
#[allow(unused_macros)]
macro_rules! mysql_test {
    ($($tests:tt)*) => {
        outbox_testkit::service_test! {
            ignore = "OUTBOX_MYSQL_URL was not set at build time (see the build warning)";
            $($tests)*
        }
    };
}

/// [`url`], as a `mysql_test!` fixture for a test that opens its own pools.
pub async fn service_url(what: &str) -> Option<String> {
    url(what)
}

/// A `mysql_test!` fixture: a [`pool`] of `max` connections on the test database.
pub async fn connect(what: &str, max: u32) -> Option<MySqlPool> {
    Some(pool(&url(what)?, max).await)
}

/// A small pool for one test (each `#[tokio::test]` has its own runtime).
pub async fn pool(url: &str, max: u32) -> MySqlPool {
    let options: MySqlConnectOptions = url.parse().expect("valid OUTBOX_MYSQL_URL");
    let pool = MySqlPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(20))
        .connect_with(options)
        .await
        .expect("connect to OUTBOX_MYSQL_URL");
    drop_stale_databases(&pool).await;
    pool
}

/// A fresh database name ([`isolation::unique_name`]).
pub fn schema_name() -> String {
    isolation::unique_name()
}

/// Drop the test databases [`isolation::is_stale`] names, once per test binary.
async fn drop_stale_databases(pool: &MySqlPool) {
    static ONCE: OnceCell<()> = OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(schema_name AS CHAR) FROM information_schema.schemata \
             WHERE schema_name LIKE 'obx\\_%'",
        )
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        for name in names.into_iter().filter(|n| isolation::is_stale(n)) {
            let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS `{name}`"))
                .execute(pool)
                .await;
        }
    })
    .await;
}

/// A sqlx error from test plumbing, as a core error.
pub fn storage(e: sqlx::Error) -> Error {
    isolation::plumbing_error(e)
}

/// A [`MySqlDedupStore`](outbox_mysql::MySqlDedupStore) remembering ids for
/// `retention`, installed in a fresh database.
pub async fn dedup_store(
    pool: &MySqlPool,
    retention: Duration,
) -> Result<outbox_mysql::MySqlDedupStore> {
    let config = outbox_mysql::MySqlDedupConfig::default()
        .with_schema(schema_name())
        .with_retention(retention);
    let store = outbox_mysql::MySqlDedupStore::new(pool.clone(), config)?;
    store.install().await?;
    Ok(store)
}

/// An outbox as the conformance suites see it.
#[derive(Debug)]
pub struct MySqlFixture {
    /// The outbox under test.
    pub outbox: MySqlOutbox,
}

#[async_trait]
impl Fixture for MySqlFixture {
    fn store(&self) -> Arc<dyn OutboxStore> {
        Arc::new(self.outbox.clone())
    }

    fn admin(&self) -> Arc<dyn OutboxAdmin> {
        Arc::new(self.outbox.clone())
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) -> Result<()> {
        let mut tx = self.outbox.pool().begin().await.map_err(storage)?;
        self.outbox.enqueue(&mut tx, &messages).await?;
        tx.commit().await.map_err(storage)
    }

    async fn enqueue_rolled_back(&self, messages: Vec<NewMessage>) -> Result<()> {
        let mut tx = self.outbox.pool().begin().await.map_err(storage)?;
        self.outbox.enqueue(&mut tx, &messages).await?;
        tx.rollback().await.map_err(storage)
    }

    async fn mark_dispatched(&self, id: MessageId) -> Result<()> {
        let sql = format!(
            "UPDATE {} SET dispatched_at = UTC_TIMESTAMP(6) WHERE id = ?",
            self.outbox.qualified_name()
        );
        sqlx::query(&sql)
            .bind(id.as_uuid())
            .execute(self.outbox.pool())
            .await
            .map_err(storage)?;
        Ok(())
    }

    async fn lock_row(&self, id: MessageId) -> Result<Box<dyn RowLock>> {
        let mut tx = self.outbox.pool().begin().await.map_err(storage)?;
        let sql = format!(
            "SELECT 1 FROM {} WHERE id = ? FOR UPDATE",
            self.outbox.qualified_name()
        );
        sqlx::query(&sql)
            .bind(id.as_uuid())
            .execute(&mut *tx)
            .await
            .map_err(storage)?;
        Ok(Box::new(MySqlRowLock { tx }))
    }
}

/// A transaction holding a row lock until released.
#[derive(Debug)]
struct MySqlRowLock {
    tx: Transaction<'static, MySql>,
}

#[async_trait]
impl RowLock for MySqlRowLock {
    async fn release(self: Box<Self>) -> Result<()> {
        self.tx.rollback().await.map_err(storage)
    }
}
