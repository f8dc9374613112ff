//! Idempotent consumers: applying each incoming message id once even when brokers
//! redeliver and relays publish twice.
//!
//! Two algorithms, for two situations:
//!
//! - **Same-database inbox.** When the consumer's state lives in a database that can
//!   hold a dedup table, record the incoming id in the transaction that applies the
//!   message: the id and the effects commit together. Backends offer it in one call
//!   (for PostgreSQL, `outbox_postgres::PgDedupStore::process`), so the order of the
//!   steps cannot be got wrong.
//! - **Decoupled dedup store** ([`DecoupledConsumer`]): when the state lives where
//!   multi-item transactions or queries over history are unavailable (DynamoDB, a
//!   document store), or entities must not accumulate processed ids. The entity holds
//!   business state plus the outgoing messages of the message being processed; a
//!   separate, strongly consistent [`DedupStore`](crate::DedupStore) remembers the ids
//!   of finished messages; a [`Publisher`](crate::Publisher) sends the outgoing
//!   messages. Outbox state leaves the entity as soon as a message is done, instead of
//!   a processed id staying in it for the whole deduplication window.
//!
//! # The decoupled protocol
//!
//! For an incoming message `m` addressed to entity `e`:
//!
//! 1. **Load `e`** (record and version; a new entity starts empty).
//! 2. **Check the dedup store for `m`.** If it is there, `m` is done: its outgoing
//!    messages were dispatched before the id was recorded (step 4 comes before step 5),
//!    so return [`Handled::Duplicate`], after removing `m`'s outbox state if a crash
//!    left it in `e`.
//!
//!    The check comes *after* the load. Checked before, this race applies a message
//!    twice: copy B checks (not recorded yet); copy A records the id and removes its
//!    outbox state; B loads the entity, finds no outbox state for `m`, runs the handler
//!    again and persists: a customer debited twice. Loaded first, B holds the version
//!    from before A's removal, so either B's check sees A's record or B's persist fails
//!    the optimistic check.
//! 3. **If `e` holds no outbox state for `m`, run the handler** on the state and
//!    persist the new state plus the outgoing messages (ids fixed now) under `m`, with
//!    the optimistic concurrency check against the loaded version. A conflict stores
//!    nothing and returns [`ErrorKind::Conflict`](crate::ErrorKind::Conflict): deliver
//!    `m` again. If `e` already holds outbox state for `m` (a crash after step 3), the
//!    handler does not run; its stored messages are used.
//! 4. **Dispatch** the outgoing messages. A failure keeps the state; the next delivery
//!    of `m` dispatches the same ids again.
//! 5. **Record `m` in the dedup store.** From here on step 2 stops every copy.
//! 6. **Only then remove `m`'s outbox state** from `e` and persist (reloading if other
//!    messages of `e` changed it meanwhile).
//!
//! ## Limitations
//!
//! - **The duplicate window is the dedup store's retention.** A copy of `m` arriving
//!   after its record expired is processed again. Choose a retention longer than any
//!   redelivery your broker and relays can produce.
//! - **The dedup store must be strongly consistent** (read-your-writes for every
//!   client): [`DecoupledConsumer::new`] refuses a store declaring
//!   [`Consistency::Eventual`](crate::Consistency::Eventual). An object store that can
//!   serve a stale read of a key after it was written (S3 once served a read of a key
//!   read before it was written from before that write) or a read replica breaks step 2.
//! - **Outgoing messages are published at least once**: a crash between steps 4 and 5
//!   publishes them again, with the same ids, on the next delivery, and two copies of
//!   one message processed at once can both publish them. Brokers with a dedup
//!   id (NATS `Nats-Msg-Id`) and downstream consumers drop the repeat.
//! - **The handler may run more than once** when its result was never stored: a
//!   conflict or a crash before step 3's persist. Only the stored run counts, so a
//!   handler that only computes (state in, state and messages out) is safe; one that
//!   calls other services repeats those calls. A handler that is not deterministic
//!   simply has its stored run's result used.
//! - **Messages of one entity are serialised by the optimistic check**, not by locks:
//!   concurrent messages of a hot entity conflict and are redelivered. Route by entity
//!   (a partition key) to avoid that.
//! - The outgoing messages of one incoming message live in the entity until it is
//!   done, so they count toward the entity store's item size limit.

mod decoupled;
mod entity;

pub use decoupled::{DecoupledConsumer, Handled, DEFAULT_PUBLISH_TIMEOUT};

/// What a same-database inbox did with a message (for example
/// `outbox_postgres::PgDedupStore::process`). A duplicate is a value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Processed<T> {
    /// First time: the handler ran and its writes committed with the id.
    Applied(T),
    /// The id was already recorded: the handler did not run and nothing was written.
    Duplicate,
}
pub use entity::{EntityRecord, EntityStore, Loaded, OutgoingMessage, Persisted, Version};
