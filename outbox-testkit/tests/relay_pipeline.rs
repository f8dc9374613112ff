//! Pipelining inside one relay loop (`RelayConfig::pipeline_depth`): how many batches a
//! loop holds while publishes hang, and that it counts as idle only once every settle
//! has landed. Run against the in-memory store; the conformance suite runs the store
//! behaviours with pipelining on and off.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{
    store::ClaimIds, store::ClaimRequest, store::Failure, store::Lease, store::Settled,
    store::SettledAndClaimed, store::Settlement, store::StoreCapabilities, NewMessage, OutboxAdmin,
    OutboxStore, Relay, RelayConfig, Result,
};
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
        .with_batch_size(10)
        .with_publish_batch_size(10)
        .with_publish_concurrency(1)
        .with_pipeline_depth(depth)
        .with_poll_interval(Duration::from_millis(5))
        .with_max_poll_interval(Duration::from_millis(20))
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
        config(4)
            .with_publish_batch_size(5)
            .with_publish_concurrency(2),
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

/// A store whose claims take 50 ms of Tokio's clock, counting the claims that carried
/// no settle.
#[derive(Debug, Clone, Default)]
struct SlowClaims {
    inner: MemoryStore,
    bare: Arc<AtomicUsize>,
}

const CLAIM_TAKES: Duration = Duration::from_millis(50);

#[async_trait]
impl OutboxStore for SlowClaims {
    fn capabilities(&self) -> StoreCapabilities {
        self.inner.capabilities()
    }
    async fn claim(&self, request: ClaimRequest) -> Result<outbox_core::store::Claimed> {
        tokio::time::sleep(CLAIM_TAKES).await;
        self.bare.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(request).await
    }
    async fn claim_ids(&self, request: &ClaimIds) -> Result<outbox_core::store::Claimed> {
        self.inner.claim_ids(request).await
    }
    async fn complete(&self, leases: &[Lease]) -> Result<Settled> {
        self.inner.complete(leases).await
    }
    async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        self.inner.fail(failures).await
    }
    async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        self.inner.release(leases).await
    }
    async fn settle_and_claim(
        &self,
        settlement: Settlement<'_>,
        next: ClaimRequest,
    ) -> Result<SettledAndClaimed> {
        tokio::time::sleep(CLAIM_TAKES).await;
        if settlement.is_empty() {
            self.bare.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.settle_and_claim(settlement, next).await
    }
}

/// Drain 100 messages in batches of 10 at depth 2 with claims of 50 ms and publishes
/// of `publish` (Tokio's clock paused, so the timings are exact); the claims that
/// carried no settle.
async fn bare_claims_with_publishes_of(publish: Duration) -> usize {
    let store = SlowClaims {
        inner: store_with(100),
        ..SlowClaims::default()
    };
    let publisher = RecordingPublisher::new().with_delay(publish);
    let relay = Relay::new(
        Arc::new(store.clone()),
        Arc::new(publisher.clone()),
        config(2),
    )
    .unwrap();
    let handle = relay.spawn();
    relay.wait_idle(DEADLINE).await.unwrap();
    let bare = store.bare.load(Ordering::SeqCst);
    handle.shutdown().await.unwrap();
    assert_eq!((publisher.unique_count(), publisher.duplicates()), (100, 0));
    bare
}

/// A publish faster than a claim ends before the next claim would go out ahead, so
/// every claim after the first carries the last batch's settle: pipelining costs no
/// statement where there is nothing to overlap.
#[tokio::test(start_paused = true)]
async fn a_publish_faster_than_a_claim_is_not_claimed_ahead_of() {
    assert_eq!(
        bare_claims_with_publishes_of(Duration::from_millis(5)).await,
        1
    );
}

/// A publish slower than a claim has the next batch claimed while it runs.
#[tokio::test(start_paused = true)]
async fn a_publish_slower_than_a_claim_is_claimed_ahead_of() {
    assert!(bare_claims_with_publishes_of(Duration::from_millis(200)).await > 1);
}
