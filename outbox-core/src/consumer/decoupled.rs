//! [`DecoupledConsumer`]: the decoupled dedup-store algorithm.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::entity::{EntityRecord, EntityStore, Loaded, OutgoingMessage, Persisted, Version};
use crate::dedup::{Consistency, DedupStore};
use crate::error::{Error, ErrorKind, ErrorStatus, Result};
use crate::message::{MessageId, NewMessage};
use crate::names::{ConsumerName, EntityKey};
use crate::publisher::{PublishOutcome, Publisher};
use crate::relay::PublishStage;

/// How many times removing the outbox state is retried when other messages of the
/// same entity keep changing it; past that, the next message of the entity that gets
/// to step 6, or the next copy of this one (step 2), removes it.
const CLEANUP_TRIES: usize = 16;

/// What [`DecoupledConsumer::handle`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Handled {
    /// First time: the handler ran, its state was stored and its messages dispatched.
    Applied {
        /// Outgoing messages published.
        dispatched: usize,
    },
    /// The handler had run before but its messages were not known to be dispatched
    /// (a crash, a failed publish, or another copy of the message being processed at
    /// the same time): they were published again with the same ids and the handler did
    /// not run.
    Redispatched {
        /// Outgoing messages published.
        dispatched: usize,
    },
    /// The id is in the dedup store: nothing ran and nothing was published.
    Duplicate,
}

/// The decoupled idempotent-consumer algorithm: an entity store holding business state
/// and pending outgoing messages, a strongly consistent [`DedupStore`] holding the ids
/// of processed messages, and a [`Publisher`] for the outgoing messages. Outbox state
/// leaves the entity as soon as a message is done, so entities stay small however many
/// messages they have seen.
///
/// `S` is the consumer's state type, stored as JSON; a new entity starts at
/// `S::default()`.
///
/// See the [module docs](super) for the protocol, step by step, and its limitations.
pub struct DecoupledConsumer<S> {
    consumer: ConsumerName,
    entities: Arc<dyn EntityStore>,
    dedup: Arc<dyn DedupStore>,
    /// The publisher behind the relays' guards: a timeout, the panic guard and the
    /// outcome count.
    stage: PublishStage,
    state: PhantomData<fn() -> S>,
}

/// The default [`DecoupledConsumer::with_publish_timeout`]: the relay's default.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

impl<S> fmt::Debug for DecoupledConsumer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecoupledConsumer")
            .field("consumer", &self.consumer)
            .field("entities", &self.entities)
            .field("dedup", &self.dedup)
            .field("publisher", &self.stage)
            .finish()
    }
}

impl<S> Clone for DecoupledConsumer<S> {
    fn clone(&self) -> Self {
        DecoupledConsumer {
            consumer: self.consumer.clone(),
            entities: Arc::clone(&self.entities),
            dedup: Arc::clone(&self.dedup),
            stage: self.stage.clone(),
            state: PhantomData,
        }
    }
}

impl<S> DecoupledConsumer<S>
where
    S: Serialize + DeserializeOwned + Default + Send,
{
    /// The algorithm for `consumer` over the three stores.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when `dedup` declares [`Consistency::Eventual`]: the
    /// algorithm deletes a message's outbox state from the entity as soon as the id is
    /// recorded, so a later check that misses the record (a stale replica, a cache, an
    /// object store that serves an older read after a write) would run the handler
    /// again and apply the message twice.
    pub fn new(
        consumer: ConsumerName,
        entities: Arc<dyn EntityStore>,
        dedup: Arc<dyn DedupStore>,
        publisher: Arc<dyn Publisher>,
    ) -> Result<Self> {
        if dedup.consistency() != Consistency::Strong {
            return Err(Error::config(format!(
                "the decoupled consumer needs a strongly consistent dedup store, and {dedup:?} \
                 declares eventual consistency: it removes a message's outbox state from the \
                 entity once the id is recorded, so a check that misses a recent record would \
                 apply the message again. Use a store with read-your-writes from every client \
                 (a primary database, DynamoDB with consistent reads), not a replica, cache or \
                 eventually consistent object store"
            )));
        }
        let stage = PublishStage::new(publisher, consumer.as_str(), DEFAULT_PUBLISH_TIMEOUT);
        Ok(DecoupledConsumer {
            consumer,
            entities,
            dedup,
            stage,
            state: PhantomData,
        })
    }

    /// Give each dispatch's publish call at most `timeout` (default
    /// [`DEFAULT_PUBLISH_TIMEOUT`]). A call that has not answered by then fails its
    /// messages retryably, as a publisher that panics does: the state is kept and the
    /// next delivery dispatches again. The call is the relays' guarded one, so its span
    /// is `outbox.publish` and accepted messages feed `outbox_commit_to_publish_seconds`
    /// under `relay` = the consumer's name.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] for a zero timeout.
    pub fn with_publish_timeout(mut self, timeout: Duration) -> Result<Self> {
        if timeout.is_zero() {
            return Err(Error::config("the publish timeout must be above zero"));
        }
        self.stage = self.stage.with_timeout(timeout);
        Ok(self)
    }

    /// The consumer name ids are recorded under.
    pub fn consumer(&self) -> &ConsumerName {
        &self.consumer
    }

    /// Process incoming message `message` for the entity `entity`, running `handler`
    /// at most once per message id while its dedup record lives.
    ///
    /// `handler` gets the entity's state and returns the new state and the messages to
    /// send; they are stored before anything is published, with their ids, so a
    /// re-dispatch repeats the same ids. It must only compute: anything else it does
    /// (a call to another service) happens again whenever the algorithm runs it again,
    /// which is when its result was never stored (see the module's limitations).
    ///
    /// # Errors
    /// - [`ErrorKind::Conflict`] when the entity changed between load and persist (a
    ///   concurrent copy of this message, or another message of the entity): nothing of
    ///   this run was stored; deliver the message again.
    /// - The handler's error, unchanged: nothing was stored.
    /// - A publish that did not succeed for every message ([`ErrorKind::Publish`],
    ///   retryable unless the publisher called an outcome permanent or returned a
    ///   permanent error; a call past the publish timeout, a panic or a wrong number of
    ///   outcomes is retryable): the state is kept, and the next delivery dispatches the
    ///   stored messages again without running the handler.
    /// - Errors of the stores. Before the state was persisted (steps 1 to 3) nothing
    ///   was stored and the next delivery runs the handler; after it and before the
    ///   record (steps 4 and 5) the next delivery re-dispatches; after the record
    ///   (step 6), the message is done and the next delivery reports
    ///   [`Handled::Duplicate`] and removes the state.
    /// - [`ErrorKind::Contention`] when other messages of the entity kept changing it
    ///   while this one's outbox state was being removed: the message *is* applied and
    ///   dispatched; only the removal is left to a later message or copy.
    pub async fn handle<F, Fut>(
        &self,
        entity: &EntityKey,
        message: MessageId,
        handler: F,
    ) -> Result<Handled>
    where
        F: FnOnce(S) -> Fut + Send,
        Fut: Future<Output = Result<(S, Vec<NewMessage>)>> + Send,
    {
        // 1. Load the entity first: the dedup check must come after it.
        let (mut record, mut version) = split(self.entities.load(entity).await?);
        // 2. A recorded id means the message is done (its messages were dispatched
        //    before the record was written). Finish a removal a crash interrupted.
        if self.dedup.contains(&self.consumer, message).await? {
            if record.outbox.contains_key(&message) {
                self.remove_outbox_state(entity, message, record, version)
                    .await?;
            }
            return Ok(Handled::Duplicate);
        }
        // 3. Run the handler unless its result is already stored, and store the new
        //    state with the outgoing messages under the optimistic check.
        let (outgoing, applied) = match record.outbox.get(&message) {
            Some(stored) => (stored.clone(), false),
            None => {
                let state = decode_state::<S>(&record.state)?;
                let (state, messages) = handler(state).await?;
                let now = SystemTime::now();
                let outgoing = messages
                    .iter()
                    .map(|m| OutgoingMessage::from_new(m, now))
                    .collect::<Result<Vec<_>>>()?;
                record.state = serde_json::to_value(&state).map_err(|e| {
                    Error::invalid_input("the consumer state does not serialize to JSON")
                        .with_source(e)
                })?;
                record.outbox.insert(message, outgoing.clone());
                match self.entities.persist(entity, version, &record).await? {
                    Persisted::Stored(v) => version = Some(v),
                    Persisted::Conflict => return Err(conflict(entity)),
                }
                (outgoing, true)
            }
        };
        // 4. Dispatch.
        self.dispatch(&outgoing).await?;
        // 5. Record the id; from now on step 2 stops every copy.
        let _ = self.dedup.record(&self.consumer, message).await?;
        // 6. Only then remove the outbox state.
        self.remove_outbox_state(entity, message, record, version)
            .await?;
        let dispatched = outgoing.len();
        Ok(if applied {
            Handled::Applied { dispatched }
        } else {
            Handled::Redispatched { dispatched }
        })
    }

    async fn dispatch(&self, outgoing: &[OutgoingMessage]) -> Result<()> {
        if outgoing.is_empty() {
            return Ok(());
        }
        let batch: Vec<_> = outgoing.iter().map(OutgoingMessage::to_message).collect();
        // One outcome per message whatever the publisher did (an error, a wrong count,
        // a timeout or a panic fails every message).
        let outcomes = self.stage.publish(&batch).await.outcomes;
        let mut failed = outcomes
            .iter()
            .zip(&batch)
            .filter(|(o, _)| **o != PublishOutcome::Published);
        match failed.next() {
            None => Ok(()),
            Some((outcome, msg)) => {
                let (reason, status) = match outcome {
                    PublishOutcome::Permanent(r) => (r.as_str(), ErrorStatus::Permanent),
                    PublishOutcome::Retryable(r) => (r.as_str(), ErrorStatus::Temporary),
                    PublishOutcome::Published => unreachable!("filtered out"),
                };
                Err(Error::new(
                    ErrorKind::Publish,
                    format!(
                        "outgoing message {} to {:?} was not published: {reason}",
                        msg.id, msg.destination
                    ),
                )
                .with_status(status))
            }
        }
    }

    /// Remove `message`'s outbox state, and that of any other message the dedup store
    /// already holds (left behind by a crash between steps 5 and 6, or a cleanup that
    /// gave up), reloading when other writers changed the entity meanwhile.
    async fn remove_outbox_state(
        &self,
        entity: &EntityKey,
        message: MessageId,
        mut record: EntityRecord,
        mut version: Option<Version>,
    ) -> Result<()> {
        for _ in 0..CLEANUP_TRIES {
            let mut done = Vec::new();
            for id in record.outbox.keys().copied() {
                if id == message || self.dedup.contains(&self.consumer, id).await? {
                    done.push(id);
                }
            }
            if done.is_empty() {
                return Ok(());
            }
            for id in done {
                record.outbox.remove(&id);
            }
            if self.entities.persist(entity, version, &record).await? != Persisted::Conflict {
                return Ok(());
            }
            (record, version) = split(self.entities.load(entity).await?);
        }
        Err(Error::new(
            ErrorKind::Contention,
            format!(
                "entity {entity} kept changing while the outbox state of message {message} was \
                 being removed; the message is applied and dispatched, and the state is removed \
                 by the next message of the entity or copy of this one"
            ),
        ))
    }
}

fn split(loaded: Option<Loaded>) -> (EntityRecord, Option<Version>) {
    match loaded {
        Some(Loaded { record, version }) => (record, Some(version)),
        None => (EntityRecord::default(), None),
    }
}

fn decode_state<S: DeserializeOwned + Default>(state: &serde_json::Value) -> Result<S> {
    if state.is_null() {
        return Ok(S::default());
    }
    S::deserialize(state).map_err(|e| {
        Error::new(
            ErrorKind::Decode,
            "the stored entity state does not decode as the consumer's state type",
        )
        .with_source(e)
    })
}

fn conflict(entity: &EntityKey) -> Error {
    Error::new(
        ErrorKind::Conflict,
        format!(
            "entity {entity} changed since it was loaded; nothing was stored, deliver the \
             message again"
        ),
    )
}
