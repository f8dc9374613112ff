//! The consumer side on the toy engine: a strongly consistent dedup store, the entity
//! store of the decoupled consumer, and a lock for purgers. A real backend writes each
//! against its engine (`dedup.rs`, `entity.rs`, `lock.rs`); the toy's are the
//! testkit's in-memory ones under the backend's names.

/// The dedup store: remembers processed ids for a retention period.
pub type ToyDedupStore = outbox_testkit::MemoryDedupStore;

/// The decoupled consumer's entity store, with optimistic concurrency.
pub type ToyEntityStore = outbox_testkit::MemoryEntityStore;

/// A distributed lock, for purgers.
pub type ToyDistributedLock = outbox_testkit::MemoryLock;
