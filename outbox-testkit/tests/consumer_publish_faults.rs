//! The decoupled consumer's dispatch goes through the relays' publish stage: a hung
//! publish is bounded by its timeout and a panicking publisher is caught, each failing
//! the dispatch retryably with the state kept, so the next delivery dispatches the same
//! messages without running the handler again. In memory.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::consumer::{DecoupledConsumer, Handled};
use outbox_core::{ConsumerName, EntityKey, ErrorKind, MessageId};
use outbox_testkit::suite::{CountingHandler, Tally};
use outbox_testkit::{
    within, FaultyPublisher, MemoryDedupStore, MemoryEntityStore, PublishFault, RecordingPublisher,
};

/// A consumer over memory stores whose first publish call fails with `fault`; the
/// first delivery's error, then the second delivery's result, the handler and the
/// publisher.
async fn first_dispatch_fails(
    fault: PublishFault,
) -> (
    outbox_core::Error,
    Handled,
    CountingHandler,
    FaultyPublisher,
) {
    let publisher = FaultyPublisher::new(RecordingPublisher::new());
    publisher.inject(fault, 1);
    let consumer = DecoupledConsumer::<Tally>::new(
        ConsumerName::new("faulty-consumer").unwrap(),
        Arc::new(MemoryEntityStore::new()),
        Arc::new(MemoryDedupStore::new(Duration::from_secs(3600))),
        Arc::new(publisher.clone()),
    )
    .unwrap()
    .with_publish_timeout(Duration::from_millis(200))
    .unwrap();
    let entity = EntityKey::new("account-1").unwrap();
    let id = MessageId::new();
    let handler = CountingHandler::default();
    let failed = within(
        "the first delivery",
        consumer.handle(&entity, id, handler.step()),
    )
    .await
    .unwrap_err();
    let again = within(
        "the second delivery",
        consumer.handle(&entity, id, handler.step()),
    )
    .await
    .unwrap();
    (failed, again, handler, publisher)
}

fn check(
    run: &(
        outbox_core::Error,
        Handled,
        CountingHandler,
        FaultyPublisher,
    ),
    reason: &str,
) {
    let (failed, again, handler, publisher) = run;
    assert_eq!(failed.kind(), ErrorKind::Publish);
    assert!(failed.is_retryable(), "{}", failed.report());
    assert!(
        failed.report().to_string().contains(reason),
        "{}",
        failed.report()
    );
    assert_eq!(*again, Handled::Redispatched { dispatched: 1 });
    assert_eq!(handler.runs(), 1, "the handler ran once");
    let published: Vec<MessageId> = publisher
        .recording()
        .published()
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(published, handler.produced(), "the stored message, once");
}

#[tokio::test]
async fn a_hung_publish_is_bounded_and_dispatched_again() {
    let run = first_dispatch_fails(PublishFault::Hang).await;
    check(&run, "publish timed out after 200ms");
}

#[tokio::test]
async fn a_panicking_publisher_is_caught_and_dispatched_again() {
    let run = first_dispatch_fails(PublishFault::Panic).await;
    check(&run, "publisher panicked: injected publisher panic");
}

#[tokio::test]
async fn a_wrong_outcome_count_is_refused_and_dispatched_again() {
    let run = first_dispatch_fails(PublishFault::WrongCount).await;
    check(&run, "publisher returned 2 outcomes for 1 messages");
}

#[test]
fn a_zero_publish_timeout_is_refused() {
    let consumer = DecoupledConsumer::<Tally>::new(
        ConsumerName::new("c").unwrap(),
        Arc::new(MemoryEntityStore::new()),
        Arc::new(MemoryDedupStore::new(Duration::from_secs(60))),
        Arc::new(RecordingPublisher::new()),
    )
    .unwrap();
    let err = consumer.with_publish_timeout(Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
}
