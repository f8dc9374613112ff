//! The purger: bounded batches, the store's window, one purger at a time.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    store::ClaimRequest, store::StoreCapabilities, DistributedLock, KeyOrder, LockName, NewMessage,
    OutboxAdmin, OutboxStore, PurgeRun, Purger, Retention,
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
        .claim(ClaimRequest::new(dispatched, Duration::from_secs(60)).unwrap())
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
    let purger =
        Purger::for_outbox(Arc::new(store.clone()), Arc::new(MemoryLock::new()), 10).unwrap();
    assert_eq!(purger.run_once().await.unwrap(), PurgeRun::Purged(25));
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.dispatched, stats.pending), (0, 3));
}

#[tokio::test]
async fn keeps_history_inside_the_window() {
    let store = store_with_history(Duration::from_secs(3600), 5, 0).await;
    let purger =
        Purger::for_outbox(Arc::new(store.clone()), Arc::new(MemoryLock::new()), 10).unwrap();
    assert_eq!(purger.run_once().await.unwrap(), PurgeRun::Purged(0));
    assert_eq!(store.stats().await.unwrap().dispatched, 5);
}

#[tokio::test]
async fn skips_while_another_purger_holds_the_lock() {
    let store = store_with_history(Duration::ZERO, 5, 0).await;
    let lock = MemoryLock::new();
    let name = LockName::new(outbox_core::purge::PURGE_LOCK).unwrap();
    let held = lock.try_lock(&name).await.unwrap().unwrap();
    let purger = Purger::for_outbox(Arc::new(store.clone()), Arc::new(lock.clone()), 10).unwrap();
    assert_eq!(purger.run_once().await.unwrap(), PurgeRun::Skipped);
    held.unlock().await.unwrap();
    assert_eq!(purger.run_once().await.unwrap(), PurgeRun::Purged(5));
    assert!(
        lock.try_lock(&name).await.unwrap().is_some(),
        "the purger released its lock"
    );
}

#[tokio::test]
async fn batch_bounds_are_config_errors() {
    for batch in [0, outbox_core::admin::MAX_ADMIN_BATCH + 1] {
        let store = Arc::new(MemoryStore::new());
        let err = Purger::for_outbox(store, Arc::new(MemoryLock::new()), batch).unwrap_err();
        assert_eq!(err.kind(), outbox_core::ErrorKind::Config);
    }
    let store = Arc::new(MemoryStore::new());
    let max = outbox_core::admin::MAX_ADMIN_BATCH;
    Purger::for_outbox(store, Arc::new(MemoryLock::new()), max).unwrap();
}

#[tokio::test]
async fn delete_retention_has_nothing_to_purge_and_takes_no_lock() {
    let store = Arc::new(MemoryStore::new());
    let lock = MemoryLock::new();
    let name = LockName::new(outbox_core::purge::PURGE_LOCK).unwrap();
    let _held = lock.try_lock(&name).await.unwrap().unwrap();
    let purger = Purger::for_outbox(store, Arc::new(lock.clone()), 10).unwrap();
    assert_eq!(purger.run_once().await.unwrap(), PurgeRun::Purged(0));
}

#[tokio::test]
async fn spawned_purger_runs_until_shutdown() {
    let store = store_with_history(Duration::ZERO, 7, 1).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = Purger::for_outbox(Arc::new(store.clone()), Arc::new(MemoryLock::new()), 2)
        .unwrap()
        .spawn(Duration::from_millis(5), shutdown.clone().cancelled_owned());
    outbox_testkit::wait_until("the spawned purger to empty the history", || {
        let store = store.clone();
        async move { store.stats().await.unwrap().dispatched == 0 }
    })
    .await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the purger stops on shutdown")
        .unwrap();
    assert_eq!(
        store.stats().await.unwrap().pending,
        1,
        "pending rows are spared"
    );
}
