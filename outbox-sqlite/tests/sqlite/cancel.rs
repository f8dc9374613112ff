//! Dropping an enqueue or a persist half-way leaves nothing behind: no open
//! transaction on the connection, no write lock held, no version past the store's.

use std::time::Duration;

use outbox_core::consumer::{EntityRecord, EntityStore, Persisted, Version};
use outbox_core::EntityKey;
use outbox_sqlite::{connect_options, SqliteEntityConfig, SqliteEntityStore};
use sqlx::sqlite::SqlitePoolOptions;

use crate::{common, msg, outbox, rows};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_enqueue_on_a_bare_connection_leaves_no_transaction_open() {
    let db = common::TempDb::new().await;
    let outbox = outbox(&db).await;
    let other = SqlitePoolOptions::new()
        .connect_with(connect_options(db.path()).busy_timeout(Duration::from_millis(200)))
        .await
        .unwrap();
    let mut conn = db.pool().acquire().await.unwrap();
    for n in 0..40 {
        let batch: Vec<_> = (0..200).map(|k| msg(n * 1000 + k)).collect();
        // Cancelled at its first await, in the middle of the insert, or not at all:
        // whatever it did is undone or committed whole.
        let limit = Duration::from_micros(u64::from(n) * 50);
        let _ = tokio::time::timeout(limit, outbox.enqueue(&mut conn, &batch)).await;
        sqlx::query("SELECT 1").execute(&mut *conn).await.unwrap();
        // Another connection can take the write lock at once.
        let writer = other.begin_with("BEGIN IMMEDIATE").await.unwrap();
        writer.rollback().await.unwrap();
    }
    let committed = rows(&outbox).await;
    assert!(
        committed % 200 == 0,
        "a cancelled batch is all or nothing: {committed} rows"
    );
    outbox.enqueue_one(&mut conn, &msg(99_999)).await.unwrap();
    assert_eq!(
        rows(&outbox).await,
        committed + 1,
        "the connection still works"
    );
}

#[tokio::test]
async fn a_version_past_what_sqlite_stores_is_a_conflict() {
    let db = common::TempDb::new().await;
    let store = SqliteEntityStore::new(db.pool().clone(), SqliteEntityConfig::default()).unwrap();
    store.install().await.unwrap();
    let key = EntityKey::new("account-1").unwrap();
    let record = EntityRecord {
        state: serde_json::json!({"balance": 1}),
        outbox: Default::default(),
    };
    let persisted = store
        .persist(&key, Some(Version::new(u64::MAX)), &record)
        .await
        .unwrap();
    assert_eq!(persisted, Persisted::Conflict);
    assert!(store.load(&key).await.unwrap().is_none());
}
