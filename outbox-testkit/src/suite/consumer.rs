//! The idempotent-consumer suite (guarantees 9 and 10): the decoupled algorithm over a
//! backend's [`EntityStore`] and [`DedupStore`], raced, crashed at each step, and held
//! in the window of the race its ordering closes.

use crate::harness::declared::SEALED;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::consumer::{DecoupledConsumer, EntityStore, Handled, Loaded, Persisted, Version};
use outbox_core::{
    ConsumerName, DedupStore, EntityKey, ErrorKind, MessageId, NewMessage, Publisher, Result,
};
use serde::{Deserialize, Serialize};

use crate::doubles::publishers::RecordingPublisher;
use crate::faults::consumer::{Crash, EventuallyConsistent, PauseAfterFirstCall, Step};
use crate::harness::consumer::ConsumerHarness;
use crate::wait::{wait_until, within};

/// Retention for cases that never wait for expiry.
const LONG: Duration = Duration::from_secs(3600);
/// Retention for the expiry case.
const SHORT: Duration = Duration::from_millis(300);

/// The state the suite's handler keeps per entity.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// How many times a message's effect was stored for this entity.
    pub applied: u32,
}

/// The suite's handler: adds one to [`Tally::applied`] and sends one message, counting
/// its runs and remembering the ids of the messages it produced. Clones share counts.
#[derive(Debug, Clone, Default)]
pub struct CountingHandler {
    runs: Arc<AtomicU32>,
    produced: Arc<Mutex<Vec<MessageId>>>,
}

impl CountingHandler {
    /// A handler function for one [`DecoupledConsumer::handle`] call.
    pub fn step(
        &self,
    ) -> impl FnOnce(Tally) -> futures::future::Ready<Result<(Tally, Vec<NewMessage>)>> + Send {
        let this = self.clone();
        move |mut tally: Tally| {
            this.runs.fetch_add(1, Ordering::SeqCst);
            tally.applied += 1;
            let out = NewMessage::builder("consumer.applied")
                .payload(tally.applied.to_be_bytes().to_vec())
                .build();
            if let Ok(out) = &out {
                this.produced
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(out.id());
            }
            futures::future::ready(out.map(|m| (tally, vec![m])))
        }
    }

    /// How many times the handler ran.
    pub fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }

    /// The ids of every message it produced, in order.
    pub fn produced(&self) -> Vec<MessageId> {
        self.produced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// One way of processing a copy of an incoming message: the decoupled algorithm, or a
/// variant whose flaw the suite must be able to see.
#[async_trait]
pub trait ProcessCopy: Send + Sync + 'static {
    /// Process `id` for `entity` with the given parts and handler.
    #[allow(clippy::too_many_arguments)]
    async fn process(
        &self,
        entities: Arc<dyn EntityStore>,
        dedup: Arc<dyn DedupStore>,
        publisher: Arc<dyn Publisher>,
        entity: EntityKey,
        id: MessageId,
        handler: CountingHandler,
    ) -> Result<Handled>;
}

/// [`ProcessCopy`] by [`DecoupledConsumer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Decoupled;

#[async_trait]
impl ProcessCopy for Decoupled {
    async fn process(
        &self,
        entities: Arc<dyn EntityStore>,
        dedup: Arc<dyn DedupStore>,
        publisher: Arc<dyn Publisher>,
        entity: EntityKey,
        id: MessageId,
        handler: CountingHandler,
    ) -> Result<Handled> {
        let consumer =
            DecoupledConsumer::<Tally>::new(consumer_name(), entities, dedup, publisher)?;
        consumer.handle(&entity, id, handler.step()).await
    }
}

fn consumer_name() -> ConsumerName {
    ConsumerName::new("suite-consumer").expect("a valid name")
}

fn entity_key() -> EntityKey {
    EntityKey::new(format!("entity-{}", MessageId::new())).expect("a valid key")
}

struct Parts {
    entities: Arc<dyn EntityStore>,
    dedup: Arc<dyn DedupStore>,
    publisher: RecordingPublisher,
}

impl Parts {
    async fn new<H: ConsumerHarness>(harness: &H, retention: Duration) -> Parts {
        Parts {
            entities: harness.entities().await.expect("entity store"),
            dedup: harness.dedup(retention).await.expect("dedup store"),
            publisher: RecordingPublisher::new(),
        }
    }

    fn consumer(&self) -> DecoupledConsumer<Tally> {
        DecoupledConsumer::new(
            consumer_name(),
            Arc::clone(&self.entities),
            Arc::clone(&self.dedup),
            Arc::new(self.publisher.clone()),
        )
        .expect("a strongly consistent dedup store")
    }

    async fn tally(&self, entity: &EntityKey) -> (Tally, usize) {
        let loaded = self.entities.load(entity).await.expect("load");
        let Some(Loaded { record, .. }) = loaded else {
            return (Tally::default(), 0);
        };
        let tally = serde_json::from_value(record.state).expect("the suite's state");
        (tally, record.outbox.len())
    }
}

/// Deliver until the algorithm stops asking for redelivery (conflicts and contention).
async fn deliver(
    consumer: &DecoupledConsumer<Tally>,
    entity: &EntityKey,
    id: MessageId,
    handler: &CountingHandler,
) -> Handled {
    for _ in 0..200 {
        match consumer.handle(entity, id, handler.step()).await {
            Ok(handled) => return handled,
            Err(e) if matches!(e.kind(), ErrorKind::Conflict | ErrorKind::Contention) => {
                tokio::task::yield_now().await;
            }
            Err(e) => panic!("handle failed: {}", e.report()),
        }
    }
    panic!("still conflicting after 200 deliveries");
}

/// Copies of one message delivered concurrently, for real and many times over, apply
/// the handler's effect once; each entity ends with no outbox state and one outgoing
/// message published per incoming message.
pub async fn consumer_concurrent_copies_apply_once<H: ConsumerHarness>(harness: &H) {
    const ROUNDS: usize = 25;
    const COPIES: usize = 4;
    let parts = Parts::new(harness, LONG).await;
    let consumer = parts.consumer();
    let handler = CountingHandler::default();
    for _ in 0..ROUNDS {
        let entity = entity_key();
        let id = MessageId::new();
        let copies = (0..COPIES).map(|_| {
            let (consumer, entity, handler) = (consumer.clone(), entity.clone(), handler.clone());
            tokio::spawn(async move { deliver(&consumer, &entity, id, &handler).await })
        });
        let handled = within("concurrent copies", futures::future::join_all(copies)).await;
        let applied = handled
            .into_iter()
            .map(|h| h.expect("copy task"))
            .filter(|h| matches!(h, Handled::Applied { .. }))
            .count();
        assert_eq!(applied, 1, "exactly one copy applies the message");
        let (tally, pending) = parts.tally(&entity).await;
        assert_eq!(tally.applied, 1, "the effect is stored once");
        assert_eq!(pending, 0, "no outbox state left");
    }
    assert_eq!(parts.publisher.unique_count(), ROUNDS);
    for id in parts.publisher.published().iter().map(|m| m.id) {
        assert!(handler.produced().contains(&id));
    }
}

/// Hold copy B of a message right after its first store call, run copy A to the end,
/// then let B go on (and redeliver it if it asks to be): how many times the message's
/// effect ended up stored. The decoupled algorithm must give 1; checking the dedup
/// store before loading the entity gives 2 (the article's double debit).
pub async fn article_race<H: ConsumerHarness, B: ProcessCopy>(harness: &H, copy_b: B) -> u32 {
    let parts = Parts::new(harness, LONG).await;
    let consumer = parts.consumer();
    let (entity, id) = (entity_key(), MessageId::new());
    // The entity exists before either copy (an earlier message created it).
    let _ = deliver(
        &consumer,
        &entity,
        MessageId::new(),
        &CountingHandler::default(),
    )
    .await;
    let pause = PauseAfterFirstCall::new(Arc::clone(&parts.entities), Arc::clone(&parts.dedup));
    let b = tokio::spawn({
        let (entities, dedup) = (pause.entities(), pause.dedup());
        let publisher: Arc<dyn Publisher> = Arc::new(parts.publisher.clone());
        let entity = entity.clone();
        async move {
            copy_b
                .process(
                    entities,
                    dedup,
                    publisher,
                    entity,
                    id,
                    CountingHandler::default(),
                )
                .await
        }
    });
    within("copy B's first store call", pause.paused()).await;
    let a = deliver(&consumer, &entity, id, &CountingHandler::default()).await;
    assert!(
        matches!(a, Handled::Applied { .. }),
        "copy A applies: {a:?}"
    );
    pause.resume();
    match within("copy B", b).await.expect("copy B's task") {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::Conflict => {
            let again = deliver(&consumer, &entity, id, &CountingHandler::default()).await;
            assert_eq!(again, Handled::Duplicate, "B redelivered");
        }
        Err(e) => panic!("copy B failed: {}", e.report()),
    }
    let (tally, _) = parts.tally(&entity).await;
    // One for the message that created the entity.
    tally.applied - 1
}

/// The article's race, forced: a copy held between loading the entity and checking the
/// dedup store while another copy finishes sees the other's record, so the message is
/// applied once.
pub async fn consumer_check_after_load_closes_the_article_race<H: ConsumerHarness>(harness: &H) {
    assert_eq!(article_race(harness, Decoupled).await, 1);
}

/// Process `id` for `entity` until the run reaches `step`, and kill it there.
async fn crash_at(
    parts: &Parts,
    step: Step,
    entity: &EntityKey,
    id: MessageId,
    handler: &CountingHandler,
) {
    let crash = Crash::at(
        step,
        Arc::clone(&parts.entities),
        Arc::clone(&parts.dedup),
        Arc::new(parts.publisher.clone()),
    );
    let crashing = DecoupledConsumer::<Tally>::new(
        consumer_name(),
        crash.entities(),
        crash.dedup(),
        crash.publisher(),
    )
    .expect("consumer");
    let task = tokio::spawn({
        let (entity, handler) = (entity.clone(), handler.clone());
        async move { crashing.handle(&entity, id, handler.step()).await }
    });
    within("the crash", crash.crashed()).await;
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
}

async fn crash_then_redeliver<H: ConsumerHarness>(
    harness: &H,
    step: Step,
) -> (Parts, EntityKey, CountingHandler, Handled) {
    let parts = Parts::new(harness, LONG).await;
    let (entity, id) = (entity_key(), MessageId::new());
    let handler = CountingHandler::default();
    crash_at(&parts, step, &entity, id, &handler).await;
    let consumer = parts.consumer();
    let handled = deliver(&consumer, &entity, id, &handler).await;
    // However it recovered, the message is now recorded: a later copy is a duplicate.
    assert!(parts
        .dedup
        .contains(&consumer_name(), id)
        .await
        .expect("contains"));
    let published = parts.publisher.published_count();
    assert_eq!(
        deliver(&consumer, &entity, id, &handler).await,
        Handled::Duplicate
    );
    assert_eq!(
        parts.publisher.published_count(),
        published,
        "a duplicate publishes nothing"
    );
    (parts, entity, handler, handled)
}

/// A crash after the state was persisted but before dispatch: the redelivery
/// dispatches the same outgoing ids without running the handler again.
pub async fn consumer_crash_before_dispatch_redispatches_the_same_ids<H: ConsumerHarness>(
    harness: &H,
) {
    let (parts, entity, handler, handled) = crash_then_redeliver(harness, Step::Dispatch).await;
    assert_eq!(handled, Handled::Redispatched { dispatched: 1 });
    assert_eq!(handler.runs(), 1, "the handler ran once");
    let published: Vec<_> = parts.publisher.published().iter().map(|m| m.id).collect();
    assert_eq!(published, handler.produced(), "the ids fixed when it ran");
    assert_eq!(parts.tally(&entity).await, (Tally { applied: 1 }, 0));
}

/// A crash after dispatch but before the dedup record: the redelivery dispatches the
/// same ids again (at least once), without running the handler again.
pub async fn consumer_crash_before_the_record_redispatches_the_same_ids<H: ConsumerHarness>(
    harness: &H,
) {
    let (parts, entity, handler, handled) = crash_then_redeliver(harness, Step::Record).await;
    assert_eq!(handled, Handled::Redispatched { dispatched: 1 });
    assert_eq!(handler.runs(), 1);
    let produced = handler.produced();
    assert_eq!(
        parts.publisher.times_seen(produced[0]),
        2,
        "published again, same id"
    );
    assert_eq!(parts.publisher.unique_count(), 1);
    assert_eq!(parts.tally(&entity).await, (Tally { applied: 1 }, 0));
}

/// A crash after the dedup record but before the outbox state was removed: the
/// redelivery is a duplicate, runs nothing, publishes nothing, and removes the state.
pub async fn consumer_crash_before_cleanup_ends_with_the_state_removed<H: ConsumerHarness>(
    harness: &H,
) {
    let (parts, entity, handler, handled) = crash_then_redeliver(harness, Step::Cleanup).await;
    assert_eq!(handled, Handled::Duplicate);
    assert_eq!(handler.runs(), 1);
    assert_eq!(
        parts.publisher.published_count(),
        1,
        "nothing published again"
    );
    assert_eq!(
        parts.tally(&entity).await,
        (Tally { applied: 1 }, 0),
        "state removed"
    );
}

/// A duplicate arriving long after the outbox state was removed is detected while its
/// dedup record lives, and processed again once the record expired: the duplicate
/// window is the dedup store's retention.
pub async fn consumer_duplicates_are_detected_until_the_record_expires<H: ConsumerHarness>(
    harness: &H,
) {
    crate::macros::groups::require(harness.features(SEALED).short_retention, "short_retention");
    let parts = Parts::new(harness, SHORT).await;
    let consumer = parts.consumer();
    let (entity, id) = (entity_key(), MessageId::new());
    let handler = CountingHandler::default();
    assert!(matches!(
        deliver(&consumer, &entity, id, &handler).await,
        Handled::Applied { .. }
    ));
    assert_eq!(
        parts.tally(&entity).await.1,
        0,
        "outbox state removed at once"
    );
    assert_eq!(
        deliver(&consumer, &entity, id, &handler).await,
        Handled::Duplicate
    );
    let name = consumer_name();
    wait_until("the dedup record to expire", || async {
        !parts.dedup.contains(&name, id).await.expect("contains")
    })
    .await;
    assert!(
        matches!(
            deliver(&consumer, &entity, id, &handler).await,
            Handled::Applied { .. }
        ),
        "after its record expired, a copy is new again"
    );
    assert_eq!(parts.tally(&entity).await, (Tally { applied: 2 }, 0));
}

/// An entity store that answers the `at`-th persist with a conflict without writing,
/// as if another message of the entity had written first.
#[derive(Debug)]
struct ConflictAt {
    inner: Arc<dyn EntityStore>,
    at: usize,
    persists: AtomicU32,
}

#[async_trait]
impl EntityStore for ConflictAt {
    async fn load(&self, key: &EntityKey) -> Result<Option<Loaded>> {
        self.inner.load(key).await
    }

    async fn persist(
        &self,
        key: &EntityKey,
        expected: Option<Version>,
        record: &outbox_core::consumer::EntityRecord,
    ) -> Result<Persisted> {
        let n = self.persists.fetch_add(1, Ordering::SeqCst) as usize + 1;
        if n == self.at {
            return Ok(Persisted::Conflict);
        }
        self.inner.persist(key, expected, record).await
    }
}

/// When another writer changes the entity while a message's outbox state is being
/// removed (step 6), the removal reloads and tries again: the message is applied and
/// the entity ends with no outbox state. A finished message's entry that a crash left
/// behind is removed by the next message of the entity.
pub async fn consumer_cleanup_survives_conflicts_and_removes_leftovers<H: ConsumerHarness>(
    harness: &H,
) {
    let parts = Parts::new(harness, LONG).await;
    let racy: Arc<dyn EntityStore> = Arc::new(ConflictAt {
        inner: Arc::clone(&parts.entities),
        at: 2,
        persists: AtomicU32::new(0),
    });
    let consumer = DecoupledConsumer::<Tally>::new(
        consumer_name(),
        racy,
        Arc::clone(&parts.dedup),
        Arc::new(parts.publisher.clone()),
    )
    .expect("consumer");
    let (entity, handler) = (entity_key(), CountingHandler::default());
    let handled = consumer
        .handle(&entity, MessageId::new(), handler.step())
        .await
        .expect("a conflict in the cleanup is retried, not returned");
    assert_eq!(handled, Handled::Applied { dispatched: 1 });
    assert_eq!(parts.tally(&entity).await, (Tally { applied: 1 }, 0));

    // A leftover: message `old` finished (recorded) but its state stayed in the entity.
    crash_at(&parts, Step::Cleanup, &entity, MessageId::new(), &handler).await;
    assert_eq!(parts.tally(&entity).await.1, 1, "the crash left the state");
    let next = deliver(&parts.consumer(), &entity, MessageId::new(), &handler).await;
    assert_eq!(next, Handled::Applied { dispatched: 1 });
    assert_eq!(
        parts.tally(&entity).await,
        (Tally { applied: 3 }, 0),
        "the next message removed the leftover too"
    );
}

/// A dedup store that declares eventual consistency is refused at construction.
pub async fn consumer_an_eventually_consistent_store_is_refused<H: ConsumerHarness>(harness: &H) {
    let parts = Parts::new(harness, LONG).await;
    let eventual: Arc<dyn DedupStore> = Arc::new(EventuallyConsistent(Arc::clone(&parts.dedup)));
    let err = DecoupledConsumer::<Tally>::new(
        consumer_name(),
        Arc::clone(&parts.entities),
        eventual,
        Arc::new(parts.publisher.clone()),
    )
    .expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(err.message().contains("strongly consistent"), "{err}");
}

/// The entity store's optimistic check: creating twice conflicts, of concurrent
/// persists at one version exactly one is stored, versions are new, loads see them.
pub async fn consumer_entity_store_checks_versions<H: ConsumerHarness>(harness: &H) {
    use outbox_core::consumer::EntityRecord;
    let entities = harness.entities().await.expect("entity store");
    let entity = entity_key();
    assert!(entities.load(&entity).await.unwrap().is_none());
    let record = |n: u32| EntityRecord {
        state: serde_json::json!({ "applied": n }),
        ..EntityRecord::default()
    };
    let Persisted::Stored(v1) = entities.persist(&entity, None, &record(1)).await.unwrap() else {
        panic!("the first create is stored");
    };
    assert_eq!(
        entities.persist(&entity, None, &record(9)).await.unwrap(),
        Persisted::Conflict
    );
    let racers = (0..8u32).map(|n| {
        let (entities, entity) = (Arc::clone(&entities), entity.clone());
        tokio::spawn(async move { entities.persist(&entity, Some(v1), &record(n + 10)).await })
    });
    let results = within("concurrent persists", futures::future::join_all(racers)).await;
    let stored: Vec<Version> = results
        .into_iter()
        .filter_map(|r| match r.expect("task").expect("persist") {
            Persisted::Stored(v) => Some(v),
            Persisted::Conflict => None,
        })
        .collect();
    assert_eq!(stored.len(), 1, "exactly one concurrent persist wins");
    assert_ne!(stored[0], v1);
    let loaded = entities.load(&entity).await.unwrap().expect("stored");
    assert_eq!(loaded.version, stored[0]);
    assert_ne!(loaded.record.state, record(1).state);
    assert_eq!(
        entities
            .persist(&entity, Some(v1), &record(2))
            .await
            .unwrap(),
        Persisted::Conflict,
        "a stale version is refused"
    );
    let other = entity_key();
    assert!(
        entities.load(&other).await.unwrap().is_none(),
        "keys are separate"
    );
}
