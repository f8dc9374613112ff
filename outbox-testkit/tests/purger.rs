//! The purger: bounded batches, the store's window, one purger at a time.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    ClaimRequest, DistributedLock, KeyOrder, NewMessage, OutboxStore, PurgeRun, Purger, Retention,
    StoreCapabilities,
};
use outbox_testkit::{MemoryLock, MemoryStore};

async fn store_with_history(window: Duration, dispatched: usize, pending: usize) -> MemoryStore {
    let store = MemoryStore::with_capabilities(StoreCapabilities::new(
        KeyOrder::Unordered,
        Retention::Keep { window },
    ));
    let msgs: Vec<_> = (0..dispatched + pending)
        .map(|_| NewMessage::builder("t").build().unwrap())
        .collect();
    store.enqueue(&msgs).unwrap();
    let claimed = store
        .claim(ClaimRequest::new(dispatched, Duration::from_secs(60)))
        .await
        .unwrap();
    let leases: Vec<_> = claimed.iter().map(|c| c.lease).collect();
    store
        .complete(&leases)
        .await
        .unwrap()
        .into_result()
        .unwrap();
    store
}

#[tokio::test]
async fn purges_expired_history_in_batches_and_spares_pending() {
    let store = store_with_history(Duration::ZERO, 25, 3).await;
    let purger = Purger::new(Arc::new(store.clone()), Arc::new(MemoryLock::new()), 10).unwrap();
    assert_eq!(purger.run_once().await.unwrap(), PurgeRun::Purged(25));
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.dispatched, stats.pending), (0, 3));
}

#[tokio::test]
async fn keeps_history_inside_the_window() {
    let store = store_with_history(Duration::from_secs(3600), 5, 0).await;
    let purger = Purger::new(Arc::new(store.clone()), Arc::new(MemoryLock::new()), 10).unwrap();
    assert_eq!(purger.run_once().await.unwrap(), PurgeRun::Purged(0));
    assert_eq!(store.stats().await.unwrap().dispatched, 5);
}

#[tokio::test]
async fn skips_while_another_purger_holds_the_lock() {
    let store = store_with_history(Duration::ZERO, 5, 0).await;
    let lock = MemoryLock::new();
    let held = lock
        .try_lock(outbox_core::purge::PURGE_LOCK)
        .await
        .unwrap()
        .unwrap();
    let purger = Purger::new(Arc::new(store.clone()), Arc::new(lock.clone()), 10).unwrap();
    assert_eq!(purger.run_once().await.unwrap(), PurgeRun::Skipped);
    held.unlock().await.unwrap();
    assert_eq!(purger.run_once().await.unwrap(), PurgeRun::Purged(5));
    assert!(
        lock.try_lock(outbox_core::purge::PURGE_LOCK)
            .await
            .unwrap()
            .is_some(),
        "the purger released its lock"
    );
}

#[tokio::test]
async fn zero_batch_is_a_config_error() {
    let err =
        Purger::new(Arc::new(MemoryStore::new()), Arc::new(MemoryLock::new()), 0).unwrap_err();
    assert_eq!(err.kind(), outbox_core::ErrorKind::Config);
}
