//! The lease lock beyond the shared suite: a holder renews its lease while it holds
//! the lock, and a lapsed lease is taken over.

use outbox_core::{DistributedLock, LockName};
use outbox_sqlite::{SqliteDistributedLock, SqliteLockConfig};
use outbox_testkit::wait_until;

use crate::common;

async fn expiry(db: &common::TempDb, name: &LockName) -> Option<i64> {
    sqlx::query_scalar("SELECT expires_at FROM outbox_locks WHERE name = ?1")
        .bind(name.as_str())
        .fetch_optional(db.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_is_renewed_and_a_lapsed_one_taken_over() {
    let db = common::TempDb::new().await;
    let config = SqliteLockConfig::default().with_lease(SqliteLockConfig::MIN_LEASE);
    let locks = SqliteDistributedLock::new(db.pool().clone(), config).unwrap();
    locks.install().await.unwrap();
    let name = LockName::new("renewed").unwrap();
    let guard = locks.try_lock(&name).await.unwrap().expect("free");
    let first = expiry(&db, &name).await.expect("a row while held");
    // Renewals come every third of the lease (5 s), again and again.
    wait_until("the holder renews its lease", || async {
        expiry(&db, &name).await.is_some_and(|e| e > first)
    })
    .await;
    let second = expiry(&db, &name).await.unwrap();
    wait_until("the holder renews its lease a second time", || async {
        expiry(&db, &name).await.is_some_and(|e| e > second)
    })
    .await;
    assert!(locks.try_lock(&name).await.unwrap().is_none(), "still held");
    guard.unlock().await.unwrap();
    assert_eq!(expiry(&db, &name).await, None, "unlock deletes the row");

    // A holder that died: its row is there, its lease over.
    sqlx::query(
        "INSERT INTO outbox_locks (name, holder, expires_at) VALUES (?1, randomblob(16), 0)",
    )
    .bind(name.as_str())
    .execute(db.pool())
    .await
    .unwrap();
    let taken = locks
        .try_lock(&name)
        .await
        .unwrap()
        .expect("a lapsed lease is taken over");
    assert!(expiry(&db, &name).await.unwrap() > first);
    taken.unlock().await.unwrap();
}
