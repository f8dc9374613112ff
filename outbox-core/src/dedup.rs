//! Consumer-side deduplication: [`DedupStore`].

use std::fmt;

use async_trait::async_trait;

use crate::error::Result;
use crate::message::MessageId;
use crate::names::ConsumerName;

/// The read guarantee a dedup store gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    /// A read after a successful write always sees it (read-your-writes), from any
    /// client. Required by the decoupled algorithm, which deletes outbox state from the
    /// entity as soon as the id is recorded.
    Strong,
    /// Reads may miss recent writes for a while (eventually consistent replicas,
    /// caches). Fine for narrowing duplicates, not for proving absence.
    Eventual,
}

/// Whether a message id was seen before. A duplicate is a value, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Dedup {
    /// First time: the id is now recorded.
    New,
    /// The id was already recorded within the retention window.
    Duplicate,
}

/// Remembers which message ids a consumer processed, for a retention period.
///
/// Backends whose dedup table lives in the consumer's own database also offer a
/// transactional variant taking the driver's transaction, so recording the id commits
/// with the handler's writes; this trait is for stores outside that transaction.
///
/// # Contract
///
/// - `record` is an atomic conditional insert: of any number of concurrent calls with
///   the same `(consumer, id)`, exactly one returns [`Dedup::New`].
/// - An id recorded by `record` is reported by `contains` and by later `record` calls
///   for at least the store's retention period; when [`Consistency::Strong`] is
///   declared, from the moment `record` returns.
/// - `consumer` scopes ids: the same message id processed by two consumers is two
///   records. Names arrive validated ([`ConsumerName`]).
/// - An id recorded longer ago than the retention period is not reported: `contains`
///   says `false` and `record` says [`Dedup::New`] (re-recording it), whether or not it
///   was purged yet.
/// - `purge_expired` deletes at most `limit` records older than the retention period
///   and no others.
#[async_trait]
pub trait DedupStore: Send + Sync + fmt::Debug {
    /// The read guarantee this store gives.
    fn consistency(&self) -> Consistency;

    /// Whether `id` was recorded for `consumer`.
    async fn contains(&self, consumer: &ConsumerName, id: MessageId) -> Result<bool>;

    /// Record `id` for `consumer`, reporting whether it was already there.
    async fn record(&self, consumer: &ConsumerName, id: MessageId) -> Result<Dedup>;

    /// Delete up to `limit` expired records; returns how many.
    async fn purge_expired(&self, limit: usize) -> Result<u64>;
}
