//! Stores and a publisher that crash the decoupled algorithm at a named step, or hold
//! one copy of a message after its first store call: the tools of the consumer suite.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use outbox_core::consumer::{EntityRecord, EntityStore, Loaded, Persisted, Version};
use outbox_core::{
    Consistency, ConsumerName, Dedup, DedupStore, EntityKey, Message, MessageId, PublishOutcome,
    Publisher, Result,
};
use tokio::sync::watch;

/// Where [`Crash`] stops the algorithm: the call at that step never returns and
/// changes nothing, so dropping the future (aborting its task) is a crash there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Step {
    /// The publish of the outgoing messages (after the state was persisted).
    Dispatch,
    /// The dedup record (after the messages were published).
    Record,
    /// The persist that removes the outbox state (after the id was recorded).
    Cleanup,
}

/// Wraps the three parts of a [`DecoupledConsumer`](outbox_core::consumer::DecoupledConsumer)
/// so that its run stops for good at one [`Step`]: use [`entities`](Self::entities),
/// [`dedup`](Self::dedup) and [`publisher`](Self::publisher) to build the consumer,
/// wait for [`crashed`](Self::crashed), then abort the task.
///
/// One wrapper serves one run (its flags are not per message). [`Step::Dispatch`]
/// needs a handler that sends at least one message: with none, nothing is published.
#[derive(Debug, Clone)]
pub struct Crash {
    inner: Arc<CrashInner>,
}

#[derive(Debug)]
struct CrashInner {
    at: Step,
    entities: Arc<dyn EntityStore>,
    dedup: Arc<dyn DedupStore>,
    publisher: Arc<dyn Publisher>,
    recorded: AtomicBool,
    crashed: watch::Sender<bool>,
}

impl Crash {
    /// Crash at `at`, passing every other call through to the given parts.
    pub fn at(
        at: Step,
        entities: Arc<dyn EntityStore>,
        dedup: Arc<dyn DedupStore>,
        publisher: Arc<dyn Publisher>,
    ) -> Self {
        Crash {
            inner: Arc::new(CrashInner {
                at,
                entities,
                dedup,
                publisher,
                recorded: AtomicBool::new(false),
                crashed: watch::Sender::new(false),
            }),
        }
    }

    /// The entity store to give the consumer.
    pub fn entities(&self) -> Arc<dyn EntityStore> {
        Arc::new(self.clone())
    }

    /// The dedup store to give the consumer.
    pub fn dedup(&self) -> Arc<dyn DedupStore> {
        Arc::new(self.clone())
    }

    /// The publisher to give the consumer.
    pub fn publisher(&self) -> Arc<dyn Publisher> {
        Arc::new(self.clone())
    }

    /// Resolves once the run reached the step and stopped there.
    pub async fn crashed(&self) {
        let mut crashed = self.inner.crashed.subscribe();
        let _ = crashed.wait_for(|c| *c).await;
    }

    async fn stop(&self) -> ! {
        self.inner.crashed.send_replace(true);
        std::future::pending().await
    }
}

#[async_trait]
impl EntityStore for Crash {
    async fn load(&self, key: &EntityKey) -> Result<Option<Loaded>> {
        self.inner.entities.load(key).await
    }

    async fn persist(
        &self,
        key: &EntityKey,
        expected: Option<Version>,
        record: &EntityRecord,
    ) -> Result<Persisted> {
        if self.inner.at == Step::Cleanup && self.inner.recorded.load(Ordering::SeqCst) {
            self.stop().await
        }
        self.inner.entities.persist(key, expected, record).await
    }
}

#[async_trait]
impl DedupStore for Crash {
    fn consistency(&self) -> Consistency {
        self.inner.dedup.consistency()
    }

    async fn contains(&self, consumer: &ConsumerName, id: MessageId) -> Result<bool> {
        self.inner.dedup.contains(consumer, id).await
    }

    async fn record(&self, consumer: &ConsumerName, id: MessageId) -> Result<Dedup> {
        if self.inner.at == Step::Record {
            self.stop().await
        }
        let recorded = self.inner.dedup.record(consumer, id).await?;
        self.inner.recorded.store(true, Ordering::SeqCst);
        Ok(recorded)
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        self.inner.dedup.purge_expired(limit).await
    }
}

#[async_trait]
impl Publisher for Crash {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        if self.inner.at == Step::Dispatch {
            self.stop().await
        }
        self.inner.publisher.publish(batch).await
    }
}

/// Wraps an entity store and a dedup store so that the first call made through either
/// completes and then waits until [`resume`](Self::resume): it holds one copy of a
/// message right after its first store call, the window of the race the decoupled
/// algorithm's ordering closes. One wrapper serves one copy.
#[derive(Clone)]
pub struct PauseAfterFirstCall {
    inner: Arc<PauseInner>,
}

struct PauseInner {
    entities: Arc<dyn EntityStore>,
    dedup: Arc<dyn DedupStore>,
    first_done: AtomicBool,
    paused: watch::Sender<bool>,
    resumed: watch::Sender<bool>,
}

impl fmt::Debug for PauseAfterFirstCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PauseAfterFirstCall")
            .field("entities", &self.inner.entities)
            .field("dedup", &self.inner.dedup)
            .finish_non_exhaustive()
    }
}

impl PauseAfterFirstCall {
    /// Wrap the two stores.
    pub fn new(entities: Arc<dyn EntityStore>, dedup: Arc<dyn DedupStore>) -> Self {
        PauseAfterFirstCall {
            inner: Arc::new(PauseInner {
                entities,
                dedup,
                first_done: AtomicBool::new(false),
                paused: watch::Sender::new(false),
                resumed: watch::Sender::new(false),
            }),
        }
    }

    /// The entity store to give the held copy.
    pub fn entities(&self) -> Arc<dyn EntityStore> {
        Arc::new(self.clone())
    }

    /// The dedup store to give the held copy.
    pub fn dedup(&self) -> Arc<dyn DedupStore> {
        Arc::new(self.clone())
    }

    /// Resolves once the first call completed and the copy is held.
    pub async fn paused(&self) {
        let mut paused = self.inner.paused.subscribe();
        let _ = paused.wait_for(|p| *p).await;
    }

    /// Let the held copy go on.
    pub fn resume(&self) {
        self.inner.resumed.send_replace(true);
    }

    async fn after_call(&self) {
        if !self.inner.first_done.swap(true, Ordering::SeqCst) {
            self.inner.paused.send_replace(true);
            let mut resumed = self.inner.resumed.subscribe();
            let _ = resumed.wait_for(|r| *r).await;
        }
    }
}

#[async_trait]
impl EntityStore for PauseAfterFirstCall {
    async fn load(&self, key: &EntityKey) -> Result<Option<Loaded>> {
        let loaded = self.inner.entities.load(key).await;
        self.after_call().await;
        loaded
    }

    async fn persist(
        &self,
        key: &EntityKey,
        expected: Option<Version>,
        record: &EntityRecord,
    ) -> Result<Persisted> {
        let persisted = self.inner.entities.persist(key, expected, record).await;
        self.after_call().await;
        persisted
    }
}

#[async_trait]
impl DedupStore for PauseAfterFirstCall {
    fn consistency(&self) -> Consistency {
        self.inner.dedup.consistency()
    }

    async fn contains(&self, consumer: &ConsumerName, id: MessageId) -> Result<bool> {
        let found = self.inner.dedup.contains(consumer, id).await;
        self.after_call().await;
        found
    }

    async fn record(&self, consumer: &ConsumerName, id: MessageId) -> Result<Dedup> {
        let recorded = self.inner.dedup.record(consumer, id).await;
        self.after_call().await;
        recorded
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        self.inner.dedup.purge_expired(limit).await
    }
}

/// A dedup store that declares [`Consistency::Eventual`] and otherwise passes through:
/// the decoupled consumer must refuse it.
#[derive(Debug, Clone)]
pub struct EventuallyConsistent(pub Arc<dyn DedupStore>);

#[async_trait]
impl DedupStore for EventuallyConsistent {
    fn consistency(&self) -> Consistency {
        Consistency::Eventual
    }

    async fn contains(&self, consumer: &ConsumerName, id: MessageId) -> Result<bool> {
        self.0.contains(consumer, id).await
    }

    async fn record(&self, consumer: &ConsumerName, id: MessageId) -> Result<Dedup> {
        self.0.record(consumer, id).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        self.0.purge_expired(limit).await
    }
}
