//! Shared helpers for the integration tests: connecting, isolated schemas, waiting.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::Duration;

mod fixture;
pub use fixture::PgFixture;

use outbox_core::Error;
use outbox_testkit::isolation;
use outbox_testkit::postgres::schemas;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::OnceCell;

/// The variable naming the test database.
pub const URL_VAR: &str = "OUTBOX_PG_URL";
/// Deadline for anything a test waits on.
pub use outbox_testkit::wait::DEADLINE;

/// The database URL, or `None` (after a visible skip line) when it is not set.
pub fn url(what: &str) -> Option<String> {
    outbox_testkit::service_url(URL_VAR, what)
}

/// `service_test!` for the tests that need the database: ignored, with this reason,
/// when `OUTBOX_PG_URL` was not set at build time. Each test awaits its fixture first
/// (a future of `Option`: `None` skips it), for example [`service_url`] or [`connect`].
#[allow(unused_macros)]
macro_rules! pg_test {
    ($($tests:tt)*) => {
        outbox_testkit::service_test! {
            ignore = "OUTBOX_PG_URL was not set at build time (see the build warning)";
            $($tests)*
        }
    };
}

/// [`url`], as a `pg_test!` fixture for a test that opens its own pools.
pub async fn service_url(what: &str) -> Option<String> {
    url(what)
}

/// A `pg_test!` fixture: a [`pool`] of `max` connections on the test database.
pub async fn connect(what: &str, max: u32) -> Option<PgPool> {
    Some(pool(&url(what)?, max).await)
}

/// A small pool for one test. Pools are per test because each `#[tokio::test]` has its
/// own runtime and connections belong to the runtime that opened them.
pub async fn pool(url: &str, max: u32) -> PgPool {
    pool_named(url, max, "outbox-postgres-tests").await
}

/// As [`pool`], with an `application_name` so a test can find (and kill) its sessions.
pub async fn pool_named(url: &str, max: u32, application_name: &str) -> PgPool {
    let options: PgConnectOptions = url.parse().expect("valid OUTBOX_PG_URL");
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(20))
        .connect_with(options.application_name(application_name))
        .await
        .expect("connect to OUTBOX_PG_URL");
    drop_stale_schemas(&pool).await;
    pool
}

/// A fresh schema name ([`isolation::unique_name`]), so stale ones can be dropped.
pub fn schema_name() -> String {
    isolation::unique_name()
}

/// Drop the test schemas [`isolation::is_stale`] names, once per test binary.
async fn drop_stale_schemas(pool: &PgPool) {
    static ONCE: OnceCell<()> = OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let names: Vec<String> = sqlx::query_scalar(schemas::FIXTURE_SCHEMAS)
            .fetch_all(pool)
            .await
            .unwrap_or_default();
        for drop in schemas::drop_stale(names) {
            let _ = sqlx::raw_sql(&drop).execute(pool).await;
        }
    })
    .await;
}

/// A sqlx error from test plumbing, as a core error.
pub fn storage(e: sqlx::Error) -> Error {
    isolation::plumbing_error(e)
}

pub use outbox_testkit::{poll_for, wait_until};

/// A [`PgDedupStore`](outbox_postgres::PgDedupStore) remembering ids for `retention`,
/// installed in a fresh schema of its own.
pub async fn dedup_store(
    pool: &PgPool,
    retention: Duration,
) -> outbox_core::Result<outbox_postgres::PgDedupStore> {
    let config = outbox_postgres::PgDedupConfig::default()
        .with_schema(schema_name())
        .with_retention(retention);
    let store = outbox_postgres::PgDedupStore::new(pool.clone(), config)?;
    store.install().await?;
    Ok(store)
}
