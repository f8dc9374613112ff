//! Advisory locks: exclusive while held, released by unlock and by dropping the guard.

use outbox_core::DistributedLock;
use outbox_postgres::PgAdvisoryLock;

use crate::common;

#[tokio::test]
async fn advisory_locks_are_exclusive_and_released() {
    let Some(url) = common::url("advisory lock") else {
        return;
    };
    let ours = PgAdvisoryLock::new(common::pool(&url, 3).await);
    let theirs = PgAdvisoryLock::new(common::pool(&url, 3).await);
    let name = format!("obx-test-{}", uuid::Uuid::new_v4());

    let guard = ours.try_lock(&name).await.unwrap().expect("free lock");
    assert_eq!(guard.name(), name);
    assert!(theirs.try_lock(&name).await.unwrap().is_none());
    assert!(
        ours.try_lock(&name).await.unwrap().is_none(),
        "other sessions of one pool too"
    );
    let other = theirs.try_lock(&format!("{name}-other")).await.unwrap();
    assert!(other.is_some(), "other names are independent");
    other.unwrap().unlock().await.unwrap();

    guard.unlock().await.unwrap();
    let again = theirs
        .try_lock(&name)
        .await
        .unwrap()
        .expect("released by unlock");
    again.unlock().await.unwrap();
}

#[tokio::test]
async fn dropping_a_guard_releases_the_lock_and_never_pools_its_session() {
    let Some(url) = common::url("advisory lock drop") else {
        return;
    };
    // One connection: if the lock-holding session went back to this pool, `ours` would
    // re-enter the lock on it (advisory locks are re-entrant) and `theirs` never get it.
    let ours = PgAdvisoryLock::new(common::pool(&url, 1).await);
    let theirs = PgAdvisoryLock::new(common::pool(&url, 2).await);
    let name = format!("obx-test-{}", uuid::Uuid::new_v4());

    let guard = ours.try_lock(&name).await.unwrap().expect("free lock");
    assert!(theirs.try_lock(&name).await.unwrap().is_none());
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
