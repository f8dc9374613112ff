//! The idempotent-consumer suite against [`MemoryEntityStore`] and
//! [`MemoryDedupStore`], and the proof that the suite sees the race the decoupled
//! algorithm's ordering closes.
//!
//! Run: `cargo test -p outbox-testkit --test consumer_conformance`
//!
//! [`MemoryEntityStore`]: outbox_testkit::MemoryEntityStore
//! [`MemoryDedupStore`]: outbox_testkit::MemoryDedupStore

use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::consumer::{
    EntityRecord, EntityStore, Handled, Loaded, OutgoingMessage, Persisted,
};
use outbox_core::{ConsumerName, DedupStore, EntityKey, MessageId, Publisher, Result};
use outbox_testkit::suite::{article_race, CountingHandler, ProcessCopy, Tally};
use outbox_testkit::MemoryConsumerHarness;

async fn harness() -> Option<MemoryConsumerHarness> {
    Some(MemoryConsumerHarness)
}

outbox_testkit::consumer_suite!(harness);

/// The decoupled algorithm with steps 1 and 2 swapped: the dedup store is checked
/// before the entity is loaded. Otherwise the same steps.
struct CheckBeforeLoad;

#[async_trait]
impl ProcessCopy for CheckBeforeLoad {
    async fn process(
        &self,
        entities: Arc<dyn EntityStore>,
        dedup: Arc<dyn DedupStore>,
        publisher: Arc<dyn Publisher>,
        entity: EntityKey,
        id: MessageId,
        handler: CountingHandler,
    ) -> Result<Handled> {
        let consumer = ConsumerName::new("suite-consumer")?;
        if dedup.contains(&consumer, id).await? {
            return Ok(Handled::Duplicate);
        }
        let Loaded {
            mut record,
            version,
        } = entities
            .load(&entity)
            .await?
            .expect("the race's entity exists");
        let outgoing = match record.outbox.get(&id) {
            Some(stored) => stored.clone(),
            None => {
                let tally: Tally = serde_json::from_value(record.state.clone()).unwrap();
                let (tally, messages) = handler.step()(tally).await?;
                let now = std::time::SystemTime::now();
                let outgoing: Vec<_> = messages
                    .iter()
                    .map(|m| OutgoingMessage::from_new(m, now).unwrap())
                    .collect();
                record = EntityRecord {
                    state: serde_json::to_value(tally).unwrap(),
                    outbox: [(id, outgoing.clone())].into(),
                };
                if entities.persist(&entity, Some(version), &record).await? == Persisted::Conflict {
                    return Err(outbox_core::Error::new(
                        outbox_core::ErrorKind::Conflict,
                        "conflict",
                    ));
                }
                outgoing
            }
        };
        let batch: Vec<_> = outgoing.iter().map(OutgoingMessage::to_message).collect();
        publisher.publish(&batch).await?;
        let _ = dedup.record(&consumer, id).await?;
        Ok(Handled::Applied {
            dispatched: batch.len(),
        })
    }
}

/// The suite can see the article's race: checking the dedup store before loading the
/// entity applies the message twice in the interleaving the suite forces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_catches_a_check_before_load() {
    assert_eq!(
        article_race(&MemoryConsumerHarness, CheckBeforeLoad).await,
        2
    );
}
