//! Pipelining inside one relay loop (`RelayConfig::pipeline_depth`): how many batches a
//! loop holds while publishes hang, and that it counts as idle only once every settle
//! has landed. Run against the in-memory store; the conformance suite runs the store
//! behaviours with pipelining on and off.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{NewMessage, OutboxAdmin, Relay, RelayConfig};
use outbox_testkit::{MemoryStore, RecordingPublisher};

const DEADLINE: Duration = Duration::from_secs(20);

fn store_with(n: usize) -> MemoryStore {
    let store = MemoryStore::new();
    let messages: Vec<_> = (0..n)
        .map(|i| {
            NewMessage::builder("t")
                .payload(i.to_string().into_bytes())
                .build()
                .unwrap()
        })
        .collect();
    store.enqueue(&messages).unwrap();
    store
}

fn config(depth: usize) -> RelayConfig {
    RelayConfig::default()
        .batch_size(10)
        .publish(10, 1)
        .pipeline_depth(depth)
        .poll(Duration::from_millis(5), Duration::from_millis(20))
}

/// While every publish hangs, a loop claims batch after batch up to its depth and no
/// further; once publishes go through, every message is published once.
async fn holds_depth_batches_while_publishes_hang(depth: usize) {
    let store = store_with(60);
    let (publisher, gate) = RecordingPublisher::new().hold_destination("t");
    let relay = Relay::new(
        Arc::new(store.clone()),
        Arc::new(publisher.clone()),
        config(depth),
    )
    .unwrap();
    let handle = relay.spawn();
    publisher
        .wait_for_calls(depth as u64, DEADLINE)
        .await
        .unwrap();
    // Wakeups and the 5-20 ms poll ask for claims; a loop at its depth must not make
    // them. A bound on a non-event: ten poll intervals with no further call.
    handle.wake();
    assert!(
        publisher
            .wait_for_calls(depth as u64 + 1, Duration::from_millis(200))
            .await
            .is_err(),
        "depth {depth}: a batch was claimed beyond the depth"
    );
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.in_flight, stats.pending),
        (10 * depth as u64, 60 - 10 * depth as u64),
        "depth {depth}: one leased batch per publish call held"
    );
    assert_eq!(publisher.calls(), depth as u64);
    gate.open();
    relay.wait_idle(DEADLINE).await.unwrap();
    let report = handle.shutdown().await.unwrap();
    assert_eq!((report.dispatched, report.claimed), (60, 60));
    assert_eq!((publisher.unique_count(), publisher.duplicates()), (60, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpipelined_loop_holds_one_batch() {
    holds_depth_batches_while_publishes_hang(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_loop_claims_ahead_up_to_its_depth() {
    holds_depth_batches_while_publishes_hang(3).await;
}

/// `wait_idle` returns only when no batch is in flight and every settle, including
/// the ones merged into later claims, has landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_loop_is_idle_only_after_every_settle() {
    let store = store_with(500);
    let publisher = RecordingPublisher::new().with_delay(Duration::from_millis(2));
    let relay = Relay::new(
        Arc::new(store.clone()),
        Arc::new(publisher.clone()),
        config(4).publish(5, 2),
    )
    .unwrap();
    let handle = relay.spawn();
    relay.wait_idle(DEADLINE).await.unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.pending, stats.in_flight), (0, 0));
    assert_eq!(relay.report().dispatched, 500, "counted before shutdown");
    handle.shutdown().await.unwrap();
    assert_eq!(publisher.unique_count(), 500);
}
