//! Shared helpers for the integration tests: connecting, isolated schemas, waiting.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_core::{Error, ErrorKind};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::sync::OnceCell;

/// The variable naming the test database.
pub const URL_VAR: &str = "OUTBOX_PG_URL";
/// Deadline for anything a test waits on.
pub use outbox_testkit::wait::DEADLINE;
/// How long test schemas are kept before a later run drops them.
const SCHEMA_TTL_SECS: u64 = 3600;

/// The database URL, or `None` (after a visible skip line) when it is not set.
pub fn url(what: &str) -> Option<String> {
    outbox_testkit::service_url(URL_VAR, what)
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

/// A fresh schema name, `obx_<unix seconds>_<random>`, so stale ones can be dropped.
pub fn schema_name() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let rand = uuid::Uuid::new_v4().simple().to_string();
    format!("obx_{secs}_{}", &rand[..12])
}

/// Drop test schemas older than an hour, once per test binary.
async fn drop_stale_schemas(pool: &PgPool) {
    static ONCE: OnceCell<()> = OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let cutoff = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs()
            .saturating_sub(SCHEMA_TTL_SECS);
        let stale: Vec<String> = sqlx::query_scalar(
            "SELECT nspname::text FROM pg_namespace \
             WHERE nspname ~ '^obx_[0-9]+_[0-9a-f]+$' \
             AND split_part(nspname, '_', 2)::bigint < $1",
        )
        .bind(i64::try_from(cutoff).expect("seconds fit i64"))
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        for schema in stale {
            // Names matched the pattern above, so they are plain identifiers.
            let _ = sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                .execute(pool)
                .await;
        }
    })
    .await;
}

/// A sqlx error from test plumbing, as a core error.
pub fn storage(e: sqlx::Error) -> Error {
    Error::new(ErrorKind::Storage, "test plumbing failed").with_source(e)
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
