//! Relay-engine behaviours that do not depend on the store: how publisher misbehaviour
//! and timeouts are handled, idle waiting and wake-ups. Run against the in-memory store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{
    DeadLetterFilter, DeadLetterPage, Error, ErrorKind, ErrorStatus, Message, NewMessage,
    OutboxAdmin, PublishOutcome, Publisher, Relay, RelayConfig, Result, RetryPolicy,
};
use outbox_testkit::{MemoryStore, RecordingPublisher};

const DEADLINE: Duration = Duration::from_secs(20);

fn config() -> RelayConfig {
    RelayConfig::default()
        .with_poll_interval(Duration::from_millis(10))
        .with_max_poll_interval(Duration::from_millis(50))
        .with_retry(
            RetryPolicy::new(3)
                .with_initial_delay(Duration::from_secs(3600))
                .with_max_delay(Duration::from_secs(3600)),
        )
}

fn store_with(n: usize) -> MemoryStore {
    let store = MemoryStore::new();
    let msgs: Vec<_> = (0..n)
        .map(|i| {
            NewMessage::builder("t")
                .payload(vec![u8::try_from(i).unwrap()])
                .build()
                .unwrap()
        })
        .collect();
    store.enqueue(&msgs).unwrap();
    store
}

/// A publisher that answers every call the same way.
#[derive(Debug)]
enum Misbehaving {
    WrongCount,
    Fails(ErrorStatus),
    Hangs,
}

#[async_trait]
impl Publisher for Misbehaving {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        match self {
            Misbehaving::WrongCount => Ok(vec![PublishOutcome::Published; batch.len() - 1]),
            Misbehaving::Fails(status) => {
                Err(Error::new(ErrorKind::Publish, "broker said no").with_status(*status))
            }
            Misbehaving::Hangs => std::future::pending().await,
        }
    }
}

async fn run_once(
    store: &MemoryStore,
    publisher: Misbehaving,
    config: RelayConfig,
) -> outbox_core::DispatchReport {
    let relay = Relay::new(Arc::new(store.clone()), Arc::new(publisher), config).unwrap();
    let handle = relay.spawn();
    relay.wait_idle(DEADLINE).await.unwrap();
    handle.shutdown().await.unwrap()
}

#[tokio::test]
async fn wrong_outcome_count_retries_the_whole_batch() {
    let store = store_with(3);
    let report = run_once(&store, Misbehaving::WrongCount, config()).await;
    assert_eq!((report.dispatched, report.retried), (0, 3));
    assert_eq!(store.stats().await.unwrap().pending, 3);
}

#[tokio::test]
async fn retryable_batch_error_retries_and_permanent_dead_letters() {
    let store = store_with(2);
    let report = run_once(&store, Misbehaving::Fails(ErrorStatus::Temporary), config()).await;
    assert_eq!((report.retried, report.dead_lettered), (2, 0));

    let store = store_with(2);
    let report = run_once(&store, Misbehaving::Fails(ErrorStatus::Permanent), config()).await;
    assert_eq!((report.retried, report.dead_lettered), (0, 2));
    let page = DeadLetterPage::new(DeadLetterFilter::default(), 10).unwrap();
    let dead = store.dead_letters(&page).await.unwrap();
    assert!(dead[0]
        .message
        .last_error
        .as_deref()
        .unwrap()
        .contains("broker said no"));
}

#[tokio::test]
async fn publish_timeout_counts_as_a_retryable_failure() {
    let store = store_with(2);
    let config = config().with_publish_timeout(Duration::from_millis(50));
    let report = run_once(&store, Misbehaving::Hangs, config).await;
    assert_eq!(report.retried, 2);
    assert_eq!(
        store.stats().await.unwrap().pending,
        2,
        "scheduled for retry, not lost"
    );
}

#[tokio::test]
async fn wakeup_ends_a_long_idle_wait() {
    let store = MemoryStore::new();
    let publisher = RecordingPublisher::new();
    // The relay would otherwise sleep for an hour between polls.
    let config = RelayConfig::default()
        .with_poll_interval(Duration::from_secs(3600))
        .with_max_poll_interval(Duration::from_secs(3600));
    let relay = Relay::new(Arc::new(store.clone()), Arc::new(publisher.clone()), config).unwrap();
    let handle = relay.spawn();
    relay.wait_idle(DEADLINE).await.unwrap();
    store
        .enqueue(&[NewMessage::builder("t").build().unwrap()])
        .unwrap();
    relay.wakeup().wake();
    publisher.wait_for_unique(1, DEADLINE).await.unwrap();
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn wait_idle_times_out_when_the_loop_is_not_running() {
    let relay = Relay::new(
        Arc::new(MemoryStore::new()),
        Arc::new(RecordingPublisher::new()),
        RelayConfig::default(),
    )
    .unwrap();
    let err = relay
        .wait_idle(Duration::from_millis(50))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
}

#[tokio::test]
async fn invalid_config_is_rejected() {
    let err = Relay::new(
        Arc::new(MemoryStore::new()),
        Arc::new(RecordingPublisher::new()),
        RelayConfig::default().with_batch_size(0),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
}

#[tokio::test]
async fn explicit_dispatch_of_unknown_or_empty_ids_does_nothing() {
    let store = store_with(1);
    let relay = Relay::new(
        Arc::new(store.clone()),
        Arc::new(RecordingPublisher::new()),
        config(),
    )
    .unwrap();
    assert_eq!(relay.dispatch_ids(&[]).await.unwrap().claimed, 0);
    assert_eq!(
        relay
            .dispatch_ids(&[outbox_core::MessageId::new()])
            .await
            .unwrap()
            .claimed,
        0
    );
    assert_eq!(store.stats().await.unwrap().pending, 1);
}

#[tokio::test]
async fn one_loop_per_relay_and_a_new_loop_after_an_abort() {
    let store = store_with(0);
    let publisher = RecordingPublisher::new();
    let relay = Relay::new(
        Arc::new(store.clone()),
        Arc::new(publisher.clone()),
        config(),
    )
    .unwrap();
    let first = relay.spawn();
    relay.wait_idle(DEADLINE).await.unwrap();
    let second = tokio::time::timeout(DEADLINE, relay.run())
        .await
        .expect("a second loop on the same relay returns at once");
    assert_eq!(second.claimed, 0);

    first.abort().await;
    let again = relay.spawn();
    store
        .enqueue(&[NewMessage::builder("t").build().unwrap()])
        .unwrap();
    relay.wakeup().wake();
    publisher.wait_for_unique(1, DEADLINE).await.unwrap();
    again.shutdown().await.unwrap();
}

/// The accessors report the relay's own settings and whether it was told to stop.
#[tokio::test]
async fn config_and_stopping_are_reported() {
    let config = config().with_name("accessors").with_batch_size(7);
    let relay = Relay::new(
        Arc::new(MemoryStore::new()),
        Arc::new(RecordingPublisher::new()),
        config.clone(),
    )
    .unwrap();
    assert_eq!(relay.config(), &config);
    assert!(!relay.is_stopping());
    let handle = relay.spawn();
    relay.wait_idle(DEADLINE).await.unwrap();
    assert!(!relay.is_stopping(), "running is not stopping");
    handle.shutdown().await.unwrap();
    assert!(relay.is_stopping());
}

/// A store holding `poison` messages that break the claiming handle's limits (payloads
/// of 100 bytes against a limit of 10), enqueued before `good` ones of 1 byte; returns
/// the claiming handle, which shares the rows.
fn store_with_poison(poison: usize, good: usize) -> MemoryStore {
    let store = MemoryStore::new();
    let sizes = std::iter::repeat_n(100, poison).chain(std::iter::repeat_n(1, good));
    let msgs: Vec<_> = sizes
        .map(|size| {
            NewMessage::builder("t")
                .payload(vec![0; size])
                .build()
                .unwrap()
        })
        .collect();
    store.enqueue(&msgs).unwrap();
    let tight = outbox_core::MessageLimits::default().with_max_payload_bytes(10);
    store.with_limits(tight)
}

/// Rows a claim dead-letters (they break the limits) count as the relay's dead letters,
/// in the loop and in `dispatch_ids`, as the store's stats show them.
#[tokio::test]
async fn rows_a_claim_dead_letters_are_counted() {
    let store = store_with_poison(3, 2);
    let report = run_once(
        &store,
        Misbehaving::WrongCount,
        config().with_batch_size(10),
    )
    .await;
    assert_eq!(
        (report.claimed, report.dead_lettered, report.retried),
        (2, 3, 2)
    );
    assert_eq!(store.stats().await.unwrap().dead, 3);

    let store = store_with_poison(2, 1);
    let ids = store.pending_ids();
    let relay = Relay::new(
        Arc::new(store.clone()),
        Arc::new(RecordingPublisher::new()),
        config(),
    )
    .unwrap();
    let report = relay.dispatch_ids(&ids).await.unwrap();
    assert_eq!((report.dispatched, report.dead_lettered), (1, 2));
    assert_eq!(relay.report().dead_lettered, 2);
}

/// A claim that dead-letters every row it took does not count as finding nothing: the
/// loop claims again at once (here, with an hour between polls, the messages behind the
/// poison are published without any wake-up).
#[tokio::test]
async fn a_claim_of_nothing_but_poison_is_followed_by_another_claim() {
    let store = store_with_poison(3, 2);
    let publisher = RecordingPublisher::new();
    let config = RelayConfig::default()
        .with_batch_size(3)
        .with_publish_batch_size(3)
        .with_publish_concurrency(1)
        .with_poll_interval(Duration::from_secs(3600))
        .with_max_poll_interval(Duration::from_secs(3600));
    let relay = Relay::new(Arc::new(store.clone()), Arc::new(publisher), config).unwrap();
    let handle = relay.spawn();
    let started = std::time::Instant::now();
    while relay.report().dispatched < 2 {
        assert!(
            started.elapsed() < DEADLINE,
            "the messages behind the poison were not published: {:?}",
            relay.report()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = handle.shutdown().await.unwrap();
    assert_eq!((report.dispatched, report.dead_lettered), (2, 3));
}
