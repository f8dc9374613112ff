//! How `PgDistributedLock` maps onto PostgreSQL: the documented advisory-lock key, and a
//! dropped guard's session leaving its pool. Exclusion and release are in the shared
//! suite (`tests/conformance.rs`).

use outbox_core::{DistributedLock, LockName};
use outbox_postgres::PgDistributedLock;

use crate::common;

fn unique_name() -> LockName {
    LockName::new(format!("obx-test-{}", uuid::Uuid::new_v4())).unwrap()
}

pg_test! {
    async fn the_lock_is_the_documented_advisory_key(
        pool = common::connect("advisory lock key", 3)
    ) {
        let lock = PgDistributedLock::new(pool.clone());
        let name = unique_name();
        let sql_try = "SELECT pg_try_advisory_lock(hashtextextended($1, 0))";

        // Held by the library: SQL taking the documented key from another session is refused.
        let guard = lock.try_lock(&name).await.unwrap().expect("free lock");
        let mut other = pool.acquire().await.unwrap();
        let taken: bool = sqlx::query_scalar(sql_try)
            .bind(name.as_str())
            .fetch_one(&mut *other)
            .await
            .unwrap();
        assert!(
            !taken,
            "the library's lock is pg_try_advisory_lock(hashtextextended(name, 0))"
        );
        guard.unlock().await.unwrap();

        // Held by SQL: the library is refused.
        let taken: bool = sqlx::query_scalar(sql_try)
            .bind(name.as_str())
            .fetch_one(&mut *other)
            .await
            .unwrap();
        assert!(taken);
        assert!(lock.try_lock(&name).await.unwrap().is_none());
        sqlx::query("SELECT pg_advisory_unlock_all()")
            .execute(&mut *other)
            .await
            .unwrap();
    }

    async fn a_dropped_guard_frees_its_pool_slot(url = common::service_url("advisory lock drop")) {
        // One connection: the dropped guard's session must leave the pool (freeing the slot
        // for a fresh session) rather than be pooled, where `ours` would re-enter the lock
        // (advisory locks are re-entrant per session) and `theirs` never get it.
        let ours = PgDistributedLock::new(common::pool(&url, 1).await);
        let theirs = PgDistributedLock::new(common::pool(&url, 2).await);
        let name = unique_name();

        let guard = ours.try_lock(&name).await.unwrap().expect("free lock");
        drop(guard);
        let taken = common::poll_for("the dropped guard's lock to be released", || {
            let (theirs, name) = (theirs.clone(), name.clone());
            async move { theirs.try_lock(&name).await.unwrap() }
        })
        .await;
        // Our pool opened a fresh session in place of the detached one, and it is excluded.
        assert!(ours.try_lock(&name).await.unwrap().is_none());
        taken.unlock().await.unwrap();
        ours.try_lock(&name)
            .await
            .unwrap()
            .expect("free again")
            .unlock()
            .await
            .unwrap();
    }
}
