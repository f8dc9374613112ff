//! How the relay copes with a store that fails, panics or stalls, and a publisher that
//! panics: every path of the relay's settle, claim and release logic, counted exactly.
//! Run against the in-memory store behind a [`FaultyStore`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_core::{
    store::ClaimIds, store::ClaimRequest, store::Failure, store::Lease, store::Settled,
    store::StoreCapabilities, DispatchReport, ErrorKind, ErrorStatus, Message, NewMessage,
    OutboxAdmin, OutboxStore, PublishOutcome, Publisher, Relay, RelayConfig, Result, RetryPolicy,
};
use outbox_testkit::{
    assert_recovered_from_faults, within, Fault, FaultyPublisher, FaultyStore, MemoryStore, Op,
    PublishFault, RecordingPublisher, TestRecorder,
};

const DEADLINE: Duration = Duration::from_secs(20);

fn config() -> RelayConfig {
    RelayConfig::default()
        .with_poll_interval(Duration::from_millis(5))
        .with_max_poll_interval(Duration::from_millis(20))
        .with_retry(
            RetryPolicy::new(3)
                .with_initial_delay(Duration::from_secs(3600))
                .with_max_delay(Duration::from_secs(3600)),
        )
}

fn memory_with(n: usize) -> MemoryStore {
    let store = MemoryStore::new();
    let msgs: Vec<_> = (0..n)
        .map(|i| NewMessage::builder(format!("t{i}")).build().unwrap())
        .collect();
    store.enqueue(&msgs).unwrap();
    store
}

fn relay(store: &FaultyStore, publisher: Arc<dyn Publisher>, config: RelayConfig) -> Relay {
    let store: Arc<dyn OutboxStore> = Arc::new(store.clone());
    Relay::new(store, publisher, config).unwrap()
}

/// Run a loop until it has caught up, then shut it down; the loop's totals.
async fn drain(relay: &Relay) -> DispatchReport {
    let handle = relay.spawn();
    relay.wait_idle(DEADLINE).await.unwrap();
    within("shutdown", handle.shutdown()).await.unwrap()
}

#[tokio::test]
async fn transient_settle_errors_are_retried_until_they_land() {
    let memory = memory_with(3);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    store.inject(Op::Complete, Fault::Error(ErrorStatus::Temporary), 2);
    let publisher = RecordingPublisher::new();
    let report = drain(&relay(&store, Arc::new(publisher.clone()), config())).await;
    assert_eq!(
        store.calls(Op::Complete),
        3,
        "two failures, then the call that landed"
    );
    assert_eq!(
        (report.dispatched, report.store_errors, report.leases_lost),
        (3, 0, 0)
    );
    assert_eq!(memory.stats().await.unwrap().pending, 0);
    assert_eq!(publisher.published_count(), 3, "nothing published twice");
}

#[tokio::test]
async fn permanent_settle_errors_are_not_retried() {
    let memory = memory_with(2);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    store.inject(Op::Complete, Fault::Error(ErrorStatus::Permanent), 1);
    let report = drain(&relay(
        &store,
        Arc::new(RecordingPublisher::new()),
        config(),
    ))
    .await;
    assert_eq!(store.calls(Op::Complete), 1);
    assert_eq!((report.dispatched, report.store_errors), (0, 1));
    let stats = memory.stats().await.unwrap();
    assert_eq!(stats.in_flight, 2, "the leases are left to lapse");
}

#[tokio::test]
async fn settles_give_up_when_the_lease_lapses() {
    let memory = memory_with(1);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    store.inject(
        Op::Complete,
        Fault::Error(ErrorStatus::Temporary),
        usize::MAX,
    );
    let lease = Duration::from_millis(600);
    let config = config()
        .with_lease(lease)
        .with_publish_timeout(Duration::from_millis(100));
    let relay = relay(&store, Arc::new(RecordingPublisher::new()), config);
    let started = Instant::now();
    let report = within(
        "dispatch_ids",
        relay.dispatch_ids(&[first_id(&memory).await]),
    )
    .await
    .unwrap();
    let took = started.elapsed();
    assert_eq!((report.dispatched, report.store_errors), (0, 1));
    assert!(
        store.calls(Op::Complete) > 2,
        "retried several times while the lease was live: {}",
        store.calls(Op::Complete)
    );
    assert!(
        took < lease + Duration::from_secs(5),
        "gave up around the lease: {took:?}"
    );
}

#[tokio::test]
async fn a_settle_retried_after_it_applied_counts_no_lost_lease() {
    let memory = memory_with(2);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    store.inject(Op::Complete, Fault::ErrorAfterApplying, 1);
    let report = drain(&relay(
        &store,
        Arc::new(RecordingPublisher::new()),
        config(),
    ))
    .await;
    assert_eq!(store.calls(Op::Complete), 2);
    assert_eq!(
        (report.dispatched, report.leases_lost, report.store_errors),
        (0, 0, 0),
        "the retry found its own leases spent: not lost to another relay"
    );
    assert_eq!(
        memory.stats().await.unwrap().pending,
        0,
        "the first try applied"
    );
}

#[tokio::test]
async fn lost_leases_are_counted() {
    let memory = memory_with(2);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    // Another claimer takes the messages while the relay publishes: the relay's own
    // complete is fenced out and counted as lost.
    let publisher = Arc::new(Sneaky(memory.clone()));
    let report = drain(&relay(&store, publisher, config())).await;
    assert_eq!(
        (report.dispatched, report.leases_lost),
        (0, 2),
        "{report:?}"
    );
}

/// Lets each message's lease lapse and claims it anew before answering, as another
/// relay would after a lapse, so the relay's lease is stale by the time it settles.
#[derive(Debug)]
struct Sneaky(MemoryStore);

#[async_trait]
impl Publisher for Sneaky {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        let ids: Vec<_> = batch.iter().map(|m| m.id).collect();
        for id in &ids {
            self.0.expire_lease(*id);
        }
        let request = outbox_core::store::ClaimIds::new(&ids, Duration::from_secs(600))?;
        let stolen = self.0.claim_ids(&request).await?;
        assert_eq!(stolen.len(), ids.len(), "the lapsed leases are claimable");
        Ok(vec![PublishOutcome::Published; batch.len()])
    }
}

#[tokio::test]
async fn claim_errors_are_counted_and_the_loop_carries_on() {
    let memory = memory_with(2);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    store.inject(Op::Claim, Fault::Error(ErrorStatus::Temporary), 2);
    let publisher = RecordingPublisher::new();
    let relay = relay(&store, Arc::new(publisher.clone()), config());
    let handle = relay.spawn();
    publisher.wait_for_unique(2, DEADLINE).await.unwrap();
    relay.wait_idle(DEADLINE).await.unwrap();
    let report = within("shutdown", handle.shutdown()).await.unwrap();
    assert_eq!((report.store_errors, report.dispatched), (2, 2));
}

#[tokio::test]
async fn a_panicking_claim_is_caught_counted_and_the_loop_carries_on() {
    let memory = memory_with(2);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    store.inject(Op::Claim, Fault::Panic, 1);
    let publisher = RecordingPublisher::new();
    let relay = relay(&store, Arc::new(publisher.clone()), config());
    let handle = relay.spawn();
    publisher.wait_for_unique(2, DEADLINE).await.unwrap();
    assert!(handle.is_running(), "the loop survived the panic");
    let report = within("shutdown", handle.shutdown()).await.unwrap();
    assert_eq!((report.panics, report.dispatched), (1, 2));
}

#[tokio::test]
async fn a_panicking_settle_is_caught_and_its_leases_lapse() {
    let memory = memory_with(1);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    store.inject(Op::Complete, Fault::Panic, 1);
    let report = drain(&relay(
        &store,
        Arc::new(RecordingPublisher::new()),
        config(),
    ))
    .await;
    assert_eq!((report.panics, report.dispatched), (1, 0));
    assert_eq!(memory.stats().await.unwrap().in_flight, 1);
}

/// A panic in a batch's own settle (of a publish call before its last) is caught and
/// counted by the loop, which carries on; the batch's leases lapse.
#[tokio::test]
async fn a_panic_inside_a_batch_is_caught_and_counted() {
    let memory = memory_with(2);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    store.inject(Op::Complete, Fault::Panic, 1);
    // Two publish calls of one message: the first settles inside the batch.
    let report = drain(&relay(
        &store,
        Arc::new(RecordingPublisher::new()),
        config()
            .with_batch_size(2)
            .with_publish_batch_size(1)
            .with_publish_concurrency(1),
    ))
    .await;
    assert_eq!((report.panics, report.dispatched), (1, 0));
    assert_eq!(memory.stats().await.unwrap().in_flight, 2);
}

/// A publisher that panics on every call.
#[derive(Debug)]
struct Panicking;

#[async_trait]
impl Publisher for Panicking {
    async fn publish(&self, _batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        panic!("publisher bug")
    }
}

#[tokio::test]
async fn a_panicking_publisher_fails_its_messages_retryably() {
    let memory = memory_with(2);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    let report = drain(&relay(&store, Arc::new(Panicking), config())).await;
    assert_eq!(
        (report.panics, report.retried, report.dispatched),
        (1, 2, 0)
    );
    let claimed = memory.stats().await.unwrap();
    assert_eq!(claimed.pending, 2, "scheduled for retry");
    let errors = memory.last_errors();
    assert!(
        errors
            .iter()
            .all(|e| e.contains("publisher panicked: publisher bug")),
        "{errors:?}"
    );
}

/// A relay over `memory` whose second publish wave finds too little lease left. Lease
/// 1 s, publish timeout 400 ms, margin 100 ms, two waves of one message: the config
/// validates ((2-1) × 400 + 400 + 100 <= 1000). A claim that takes 200 ms and a first
/// publish of 390 ms leave the second wave too little lease.
fn short_second_wave(memory: &MemoryStore) -> (FaultyStore, RecordingPublisher, Relay) {
    let store = FaultyStore::new(Arc::new(memory.clone()));
    store.delay_claims(Duration::from_millis(200));
    let publisher = RecordingPublisher::new().with_delay(Duration::from_millis(390));
    let config = config()
        .with_batch_size(2)
        .with_publish_batch_size(1)
        .with_publish_concurrency(1)
        .with_lease(Duration::from_secs(1))
        .with_publish_timeout(Duration::from_millis(400));
    let relay = relay(&store, Arc::new(publisher.clone()), config);
    (store, publisher, relay)
}

/// `n` messages in a store that declares lease renewal.
fn renewing_with(n: usize) -> MemoryStore {
    let memory = MemoryStore::with_capabilities(
        outbox_core::store::StoreCapabilities::default().with_lease_renewal(true),
    );
    let msgs: Vec<_> = (0..n)
        .map(|i| NewMessage::builder(format!("t{i}")).build().unwrap())
        .collect();
    memory.enqueue(&msgs).unwrap();
    memory
}

/// Dispatch every pending message of `memory` by id.
async fn dispatch_pending(relay: &Relay, memory: &MemoryStore) -> DispatchReport {
    let ids = memory.pending_ids();
    within("dispatch_ids", relay.dispatch_ids(&ids))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_chunk_with_too_little_lease_left_is_released_unpublished() {
    let memory = memory_with(2);
    let (_store, publisher, relay) = short_second_wave(&memory);
    let report = dispatch_pending(&relay, &memory).await;
    assert_eq!((report.dispatched, report.released), (1, 1), "{report:?}");
    assert_eq!(publisher.calls(), 1);
    let stats = memory.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.in_flight),
        (1, 0),
        "released: due at once"
    );
}

#[tokio::test]
async fn on_a_renewing_store_a_chunk_with_too_little_lease_renews_instead() {
    // The store renews, so the relay extends the batch's leases and publishes the
    // second wave instead of releasing it.
    let memory = renewing_with(2);
    let (store, publisher, relay) = short_second_wave(&memory);
    let report = dispatch_pending(&relay, &memory).await;
    assert_eq!(
        (report.dispatched, report.released, report.store_errors),
        (2, 0, 0),
        "{report:?}"
    );
    assert_eq!(publisher.calls(), 2);
    let published = publisher.published();
    assert!(published.iter().all(|m| m.attempts == 1));
    // The first wave's settle was sent before the second wave renewed: the renewal
    // asks only for the lease still unsettled, not for one the store has completed.
    assert_eq!(
        store.renewals(),
        vec![vec![published[1].id]],
        "one renewal, of the second wave's lease only"
    );
}

#[tokio::test]
async fn a_failed_renewal_is_counted_and_the_chunk_is_released_unpublished() {
    // The renewal fails: it is counted, and the chunk is released rather than
    // published on a lease that may lapse.
    let memory = renewing_with(2);
    let (store, publisher, relay) = short_second_wave(&memory);
    store.inject(Op::Renew, Fault::Error(ErrorStatus::Temporary), 1);
    let report = dispatch_pending(&relay, &memory).await;
    assert_eq!(
        (report.dispatched, report.released, report.store_errors),
        (1, 1, 1),
        "{report:?}"
    );
    assert_eq!(store.calls(Op::Renew), 1);
    assert_eq!(publisher.calls(), 1);
    assert_eq!(relay.report(), report, "the totals count the renewal once");
}

#[tokio::test]
async fn totals_add_up_across_batches_and_dispatch_calls() {
    let memory = memory_with(7);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    let publisher = RecordingPublisher::new();
    let relay = relay(
        &store,
        Arc::new(publisher.clone()),
        config()
            .with_batch_size(2)
            .with_publish_batch_size(1)
            .with_publish_concurrency(2),
    );
    let explicit = within(
        "dispatch_ids",
        relay.dispatch_ids(&[first_id(&memory).await]),
    )
    .await
    .unwrap();
    assert_eq!((explicit.claimed, explicit.dispatched), (1, 1));
    let looped = drain(&relay).await;
    assert_eq!(
        (looped.claimed, looped.dispatched),
        (7, 7),
        "the loop's totals include the explicit call"
    );
    assert_eq!(relay.report(), looped);
    assert!(store.calls(Op::Claim) >= 4, "batches of two");
}

#[tokio::test]
async fn dispatch_after_shutdown_claims_nothing() {
    let memory = memory_with(1);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    let relay = relay(&store, Arc::new(RecordingPublisher::new()), config());
    within("shutdown", relay.spawn().shutdown()).await.unwrap();
    let id = first_id(&memory).await;
    assert_eq!(
        within("dispatch_ids", relay.dispatch_ids(&[id]))
            .await
            .unwrap(),
        DispatchReport::default()
    );
    assert_eq!(store.calls(Op::ClaimIds), 0);
    assert_eq!(memory.stats().await.unwrap().pending, 1);
}

#[tokio::test]
async fn too_many_ids_are_refused_before_claiming() {
    let memory = memory_with(0);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    let relay = relay(&store, Arc::new(RecordingPublisher::new()), config());
    let ids: Vec<_> = (0..=outbox_core::store::MAX_CLAIM_BATCH)
        .map(|_| outbox_core::MessageId::new())
        .collect();
    let err = within("dispatch_ids", relay.dispatch_ids(&ids))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert_eq!(store.calls(Op::ClaimIds), 0);
}

#[tokio::test]
async fn the_handle_wakes_an_idle_loop() {
    let memory = memory_with(0);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    let publisher = RecordingPublisher::new();
    let config = config()
        .with_poll_interval(Duration::from_secs(3600))
        .with_max_poll_interval(Duration::from_secs(3600));
    let relay = relay(&store, Arc::new(publisher.clone()), config);
    let handle = relay.spawn();
    relay.wait_idle(DEADLINE).await.unwrap();
    let claims = store.calls(Op::Claim);
    memory
        .enqueue(&[NewMessage::builder("t").build().unwrap()])
        .unwrap();
    handle.wake();
    publisher.wait_for_unique(1, DEADLINE).await.unwrap();
    assert!(store.calls(Op::Claim) > claims);
    within("shutdown", handle.shutdown()).await.unwrap();
}

/// A relay loop whose one message is being published, held by a shut gate; polling is
/// an hour away, so every later claim is one the case caused.
struct Held {
    memory: MemoryStore,
    store: FaultyStore,
    publisher: RecordingPublisher,
    gate: outbox_testkit::Gate,
    handle: outbox_core::RelayHandle,
}

async fn one_message_held() -> Held {
    let memory = memory_with(0);
    memory
        .enqueue(&[NewMessage::builder("held").build().unwrap()])
        .unwrap();
    let store = FaultyStore::new(Arc::new(memory.clone()));
    let (publisher, gate) = RecordingPublisher::new().hold_destination("held");
    let config = config()
        .with_poll_interval(Duration::from_secs(3600))
        .with_max_poll_interval(Duration::from_secs(3600));
    let relay = relay(&store, Arc::new(publisher.clone()), config);
    let handle = relay.spawn();
    publisher.wait_for_calls(1, DEADLINE).await.unwrap();
    Held {
        memory,
        store,
        publisher,
        gate,
        handle,
    }
}

#[tokio::test]
async fn a_wake_that_a_claim_covered_causes_no_extra_claim() {
    let Held {
        memory,
        store,
        publisher: _,
        gate,
        handle,
    } = one_message_held().await;
    // A wake while the batch publishes asks for a claim at once (pipelining: what was
    // just committed need not wait for the batch), and that claim covers it. The gate
    // stays shut until it has been made, so the order of events is fixed: claim, wake,
    // claim ahead (finds nothing: the one message is held), batch ends, claim carrying
    // its settle (finds nothing, the loop is idle). Polling is an hour away, so any
    // further claim would be one the wake caused twice.
    handle.wake();
    outbox_testkit::wait_until("the wake's claim ahead", || async {
        store.calls(Op::Claim) >= 2
    })
    .await;
    assert_eq!(store.calls(Op::Claim), 2, "one claim for the wake");
    gate.open();
    outbox_testkit::wait_until("the batch's settle and the claim it rides with", || async {
        store.calls(Op::Claim) >= 3 && memory.stats().await.unwrap().pending == 0
    })
    .await;
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        store.calls(Op::Claim),
        3,
        "the claim after the wake covered it: only the batch's settle claimed again"
    );
    within("shutdown", handle.shutdown()).await.unwrap();
}

#[tokio::test]
async fn a_settle_held_for_the_next_claim_lands_when_the_relay_stops() {
    let Held {
        memory,
        store,
        publisher,
        gate,
        handle,
    } = one_message_held().await;
    // A wake sends a claim ahead while the batch publishes, and that claim is slow: the
    // batch ends during it and leaves its settle to the next claim, which never comes,
    // because the relay is told to stop first. The settle must still land, on its own.
    store.delay_claims(Duration::from_secs(2));
    handle.wake();
    outbox_testkit::wait_until("the slow claim ahead", || async {
        store.calls(Op::Claim) >= 2
    })
    .await;
    gate.open();
    outbox_testkit::wait_until("the batch's publish", || async {
        publisher.published_count() == 1
    })
    .await;
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    let report = within("shutdown", handle.shutdown()).await.unwrap();
    assert_eq!(report.dispatched, 1, "{report:?}");
    let stats = memory.stats().await.unwrap();
    assert_eq!((stats.pending, stats.in_flight), (0, 0), "{stats:?}");
}

#[tokio::test]
async fn an_aborted_loop_reports_so_on_shutdown() {
    let relay = relay(
        &FaultyStore::new(Arc::new(MemoryStore::new())),
        Arc::new(RecordingPublisher::new()),
        config(),
    );
    let handle = relay.spawn();
    relay.wait_idle(DEADLINE).await.unwrap();
    assert!(handle.is_running());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let stopping = relay
        .clone()
        .with_shutdown(shutdown.clone().cancelled_owned());
    shutdown.cancel();
    outbox_testkit::wait_until("the shutdown signal to stop the loop", || async {
        stopping.is_stopping() && !handle.is_running()
    })
    .await;
    within("shutdown", handle.shutdown()).await.unwrap();
}

/// `wait_idle` returns as soon as the loop it waits on ends, instead of waiting out
/// its timeout: here the loop is stuck in a claim and then killed.
#[tokio::test]
async fn wait_idle_reports_a_loop_that_ended_before_it_got_idle() {
    let store = FaultyStore::new(Arc::new(memory_with(1)));
    store.delay_claims(Duration::from_secs(3600));
    let relay = relay(&store, Arc::new(RecordingPublisher::new()), config());
    let handle = relay.spawn();
    outbox_testkit::wait_until("the loop to start its claim", || async {
        store.calls(Op::Claim) >= 1
    })
    .await;
    // `join!` polls `wait_idle` first, so it is waiting before the abort.
    let (idle, ()) = within("wait_idle and abort", async {
        tokio::join!(relay.wait_idle(Duration::from_secs(3600)), handle.abort())
    })
    .await;
    let err = idle.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}

async fn first_id(memory: &MemoryStore) -> outbox_core::MessageId {
    memory.pending_ids()[0]
}

/// Steals each message's lease (as another relay after a lapse would) and then reports
/// a retryable failure, so the relay's `fail` is fenced out.
#[derive(Debug)]
struct StealsThenFails(MemoryStore);

#[async_trait]
impl Publisher for StealsThenFails {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        let ids: Vec<_> = batch.iter().map(|m| m.id).collect();
        for id in &ids {
            self.0.expire_lease(*id);
        }
        let request = outbox_core::store::ClaimIds::new(&ids, Duration::from_secs(600))?;
        let _stolen = self.0.claim_ids(&request).await?;
        Ok(vec![PublishOutcome::Retryable("nope".into()); batch.len()])
    }
}

#[tokio::test]
async fn lost_leases_on_fail_are_counted() {
    let memory = memory_with(3);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    let relay = relay(&store, Arc::new(StealsThenFails(memory.clone())), config());
    let report = within("dispatch_ids", relay.dispatch_ids(&memory.pending_ids()))
        .await
        .unwrap();
    assert_eq!((report.retried, report.leases_lost), (0, 3), "{report:?}");
}

#[tokio::test]
async fn a_failing_fail_is_counted_as_a_store_error() {
    let memory = memory_with(2);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    store.inject(Op::Fail, Fault::Error(ErrorStatus::Permanent), 1);
    let relay = relay(
        &store,
        Arc::new(RecordingPublisher::failing_first(1)),
        config(),
    );
    let report = within("dispatch_ids", relay.dispatch_ids(&memory.pending_ids()))
        .await
        .unwrap();
    assert_eq!((report.retried, report.store_errors), (0, 1), "{report:?}");
}

#[tokio::test]
async fn a_failing_release_is_counted_as_a_store_error() {
    let memory = memory_with(2);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    // As in the lease-rule case above: the second wave has too little lease left.
    store.delay_claims(Duration::from_millis(200));
    store.inject(Op::Release, Fault::Error(ErrorStatus::Permanent), 1);
    let publisher = RecordingPublisher::new().with_delay(Duration::from_millis(390));
    let config = config()
        .with_batch_size(2)
        .with_publish_batch_size(1)
        .with_publish_concurrency(1)
        .with_lease(Duration::from_secs(1))
        .with_publish_timeout(Duration::from_millis(400));
    let relay = relay(&store, Arc::new(publisher), config);
    let report = within("dispatch_ids", relay.dispatch_ids(&memory.pending_ids()))
        .await
        .unwrap();
    assert_eq!(
        (report.dispatched, report.released, report.store_errors),
        (1, 0, 1),
        "{report:?}"
    );
}

#[tokio::test]
async fn an_abandoned_batch_whose_fail_errs_counts_a_store_error() {
    let memory = memory_with(2);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    store.inject(Op::Fail, Fault::Error(ErrorStatus::Permanent), 1);
    let (publisher, _never_opened) = RecordingPublisher::new().hold_destination("t0");
    let config = config()
        .with_batch_size(2)
        .with_publish_batch_size(1)
        .with_publish_concurrency(1)
        .with_shutdown_grace(Duration::from_millis(50));
    let relay = relay(&store, Arc::new(publisher.clone()), config);
    let handle = relay.spawn();
    publisher.wait_for_calls(1, DEADLINE).await.unwrap();
    let report = within("shutdown", handle.shutdown()).await.unwrap();
    assert_eq!(
        (report.retried, report.released, report.store_errors),
        (0, 1, 1),
        "the started publish's fail erred; the other was released: {report:?}"
    );
}

/// A store that notes the (Tokio) instant of every claim.
#[derive(Debug, Clone)]
struct ClaimClock {
    inner: MemoryStore,
    claims: Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
}

impl ClaimClock {
    /// Gaps between successive claims, in whole milliseconds.
    fn gaps(&self) -> Vec<u128> {
        let at = self.claims.lock().unwrap();
        at.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect()
    }
}

#[async_trait]
impl OutboxStore for ClaimClock {
    fn capabilities(&self) -> StoreCapabilities {
        self.inner.capabilities()
    }
    async fn claim(&self, request: ClaimRequest) -> Result<outbox_core::store::Claimed> {
        self.claims
            .lock()
            .unwrap()
            .push(tokio::time::Instant::now());
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
}

/// Whether `gap` is a wait of `base` ms shortened by the relay's jitter (up to a
/// fifth).
fn jittered(gap: u128, base: u128) -> bool {
    (base * 4 / 5..=base).contains(&gap)
}

/// The idle poll doubles from `poll_interval` to `max_poll_interval`, and starts over
/// after a claim that found work and after a wake-up. Tokio's clock is paused, so the
/// gaps between claims are read off virtual time exactly; the sleeps below advance that
/// clock, they do not wait for anything to happen.
#[tokio::test(start_paused = true)]
async fn the_idle_poll_doubles_to_its_cap_and_starts_over() {
    let store = ClaimClock {
        inner: MemoryStore::new(),
        claims: Arc::default(),
    };
    let config = config()
        .with_poll_interval(Duration::from_millis(100))
        .with_max_poll_interval(Duration::from_millis(800));
    let relay = Relay::new(
        Arc::new(store.clone()),
        Arc::new(RecordingPublisher::new()),
        config,
    )
    .unwrap();
    let handle = relay.spawn();
    // Idle from the start: 100, 200, 400, 800, then capped at 800.
    tokio::time::sleep(Duration::from_millis(4000)).await;
    let idle = store.gaps();
    assert!(idle.len() >= 6, "{idle:?}");
    for (gap, base) in idle.iter().zip([100, 200, 400, 800, 800, 800]) {
        assert!(jittered(*gap, base), "expected about {base} ms: {idle:?}");
    }
    // Work found: the next claim follows at once, then the schedule starts over.
    let before = idle.len();
    store
        .inner
        .enqueue(&[NewMessage::builder("t").build().unwrap()])
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let gaps = store.gaps();
    let after_work = &gaps[before..];
    assert!(after_work.len() >= 3, "{gaps:?}");
    assert!(after_work[0] <= 800, "the claim that found work: {gaps:?}");
    assert_eq!(after_work[1], 0, "the claim right after the work: {gaps:?}");
    assert!(jittered(after_work[2], 100), "then 100 ms: {gaps:?}");
    // A wake-up ends the wait at once and starts the schedule over.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let before = store.gaps().len();
    let woken = tokio::time::Instant::now();
    relay.wakeup().wake();
    tokio::time::sleep(Duration::from_millis(350)).await;
    let gaps = store.gaps();
    let at = store.claims.lock().unwrap()[before + 1];
    assert_eq!(at, woken, "claimed at the wake-up: {gaps:?}");
    let after_wake = &gaps[before + 1..];
    assert!(after_wake.len() >= 2, "{gaps:?}");
    assert!(jittered(after_wake[0], 100), "then 100 ms: {gaps:?}");
    assert!(jittered(after_wake[1], 200), "then 200 ms: {gaps:?}");
    within("shutdown", handle.shutdown()).await.unwrap();
}

/// A relay over two messages whose first two publish calls fail with `fault`, retrying
/// after 10 ms: the totals once both were published, the publisher and the recorder.
async fn first_calls_fail(fault: PublishFault) -> (DispatchReport, FaultyPublisher, TestRecorder) {
    let memory = memory_with(2);
    let store = FaultyStore::new(Arc::new(memory.clone()));
    let publisher = FaultyPublisher::new(RecordingPublisher::new());
    publisher.inject(fault, 2);
    let config = config()
        .with_name("faulty")
        .with_publish_timeout(Duration::from_millis(200))
        .with_retry(
            RetryPolicy::new(3)
                .with_initial_delay(Duration::from_millis(10))
                .with_max_delay(Duration::from_millis(10)),
        );
    let recorder = TestRecorder::default();
    let relay = metrics::with_local_recorder(&recorder, || {
        relay(&store, Arc::new(publisher.clone()), config)
    });
    let handle = relay.spawn();
    publisher
        .recording()
        .wait_for_unique(2, DEADLINE)
        .await
        .unwrap();
    let report = within("shutdown", handle.shutdown()).await.unwrap();
    (report, publisher, recorder)
}

/// The polling relay's own checks after one faulty call, and the ones every relay
/// shares.
fn check_retried_after(
    (report, publisher, recorder): &(DispatchReport, FaultyPublisher, TestRecorder),
    reason: &str,
) {
    assert_recovered_from_faults(publisher, recorder, "faulty", 2);
    assert_eq!(
        (report.retried, report.dispatched, report.dead_lettered),
        (4, 2, 0)
    );
    for m in publisher.recording().published() {
        let error = m.last_error.as_deref().unwrap_or_default();
        assert!(error.contains(reason), "{error:?}");
    }
}

#[tokio::test]
async fn a_hung_publish_times_out_and_its_messages_are_retried() {
    let run = first_calls_fail(PublishFault::Hang).await;
    check_retried_after(&run, "publish timed out after 200ms");
    assert_eq!(run.0.panics, 0);
}

#[tokio::test]
async fn a_panicking_publish_is_caught_counted_and_its_messages_retried() {
    let run = first_calls_fail(PublishFault::Panic).await;
    check_retried_after(&run, "publisher panicked: injected publisher panic");
    assert_eq!(run.0.panics, 2);
}

#[tokio::test]
async fn outcomes_of_the_wrong_count_are_refused() {
    let run = first_calls_fail(PublishFault::WrongCount).await;
    check_retried_after(&run, "publisher returned 3 outcomes for 2 messages");
    assert_eq!(run.0.panics, 0);
}
