//! The storage contract relays run against: [`OutboxStore`].

use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::message::{Message, MessageId};

/// Longest lease a claim may ask for.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);
/// Most messages one claim may ask for.
pub const MAX_CLAIM_BATCH: usize = 10_000;

/// An opaque fencing token, fresh for every claim.
///
/// Complete, fail and release match on message id **and** token, so a relay whose lease
/// expired and whose message was claimed again cannot touch the new owner's claim.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseToken(Uuid);

impl LeaseToken {
    /// A fresh random token.
    pub fn new() -> Self {
        LeaseToken(Uuid::new_v4())
    }
    /// Wrap a token read from storage.
    pub fn from_uuid(uuid: Uuid) -> Self {
        LeaseToken(uuid)
    }
    /// The underlying UUID, for storage.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl Default for LeaseToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({})", self.0)
    }
}

/// A claim's hold on one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The message held.
    pub id: MessageId,
    /// The fencing token that must accompany complete, fail and release.
    pub token: LeaseToken,
    /// When the lease lapses by the storage's clock; after it, the message is claimable
    /// again.
    pub expires_at: SystemTime,
}

/// A message returned by a claim, with the lease that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedMessage {
    /// The message.
    pub message: Message,
    /// The lease to settle it with.
    pub lease: Lease,
}

/// What to claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimRequest {
    /// At most this many messages (1 to [`MAX_CLAIM_BATCH`]).
    pub limit: usize,
    /// How long the lease lasts (more than zero, at most [`MAX_LEASE`]).
    pub lease: Duration,
}

impl ClaimRequest {
    /// Claim up to `limit` messages, each leased for `lease`.
    pub fn new(limit: usize, lease: Duration) -> Self {
        ClaimRequest { limit, lease }
    }

    /// Check the bounds; stores call this before touching storage.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when out of bounds.
    pub fn validate(&self) -> Result<()> {
        if self.limit == 0 || self.limit > MAX_CLAIM_BATCH {
            return Err(Error::invalid_input(format!(
                "claim limit {} is outside 1..={MAX_CLAIM_BATCH}",
                self.limit
            )));
        }
        validate_lease(self.lease)
    }
}

/// Check a lease duration is within `(0, MAX_LEASE]`.
///
/// # Errors
/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when out of bounds.
pub fn validate_lease(lease: Duration) -> Result<()> {
    if lease.is_zero() || lease > MAX_LEASE {
        return Err(Error::invalid_input(format!(
            "lease of {lease:?} is outside (0, {MAX_LEASE:?}]"
        )));
    }
    Ok(())
}

/// What a failed attempt leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Make the message claimable again after this delay.
    Retry {
        /// Delay from now, by the storage's clock.
        after: Duration,
    },
    /// Give up: keep the message as a dead letter, listable and requeueable.
    DeadLetter,
}

/// A failed attempt to report through [`OutboxStore::fail`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The lease the attempt held.
    pub lease: Lease,
    /// The error to record as the message's `last_error`.
    pub error: String,
    /// Retry or dead-letter.
    pub disposition: Disposition,
}

/// The result of settling (completing, failing, releasing) a batch of leases.
///
/// Settling is fenced per message: leases that are still held are applied, leases that
/// are not are listed in `lost` and their messages are left untouched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use = "lost leases mean another claimer owns those messages"]
pub struct Settled {
    /// How many leases were applied.
    pub applied: usize,
    /// Messages whose leases were no longer held: nothing was changed for them.
    pub lost: Vec<MessageId>,
}

impl Settled {
    /// Work out which of `requested` were not among `applied`.
    pub fn reconcile(
        requested: impl IntoIterator<Item = MessageId>,
        applied: impl IntoIterator<Item = MessageId>,
    ) -> Self {
        let applied: std::collections::HashSet<MessageId> = applied.into_iter().collect();
        let lost: Vec<MessageId> = requested
            .into_iter()
            .filter(|id| !applied.contains(id))
            .collect();
        Settled {
            applied: applied.len(),
            lost,
        }
    }

    /// `Ok(applied)` when every lease was applied, otherwise
    /// [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost) naming the lost messages.
    pub fn into_result(self) -> Result<usize> {
        if self.lost.is_empty() {
            Ok(self.applied)
        } else {
            Err(Error::lease_lost(self.lost))
        }
    }
}

/// Whether claims keep per-key order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyOrder {
    /// Any due message may be claimed; messages sharing a key may publish out of order.
    #[default]
    Unordered,
    /// A message is claimable only when no earlier message with the same partition key
    /// is pending or in flight. Dead-lettered messages do not block their key.
    PerKey,
}

/// What happens to a message once completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retention {
    /// Delete the row in the completing statement.
    #[default]
    Delete,
    /// Keep dispatched rows (for audit or replay) until [`OutboxStore::purge_dispatched`]
    /// removes those older than the window.
    Keep {
        /// How long dispatched rows are kept.
        window: Duration,
    },
}

/// What a store does, so relays and the conformance suite know what to expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StoreCapabilities {
    /// The ordering this store's claims enforce.
    pub ordering: KeyOrder,
    /// What completing does.
    pub retention: Retention,
}

impl StoreCapabilities {
    /// Capabilities with this ordering and retention.
    pub fn new(ordering: KeyOrder, retention: Retention) -> Self {
        StoreCapabilities {
            ordering,
            retention,
        }
    }
}

/// Counts for monitoring, exact at the moment they were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Messages waiting to be claimed, due now or scheduled later (including retries).
    pub pending: u64,
    /// Messages held by a live lease.
    pub in_flight: u64,
    /// Dead-lettered messages.
    pub dead: u64,
    /// Dispatched messages still kept under [`Retention::Keep`].
    pub dispatched: u64,
    /// Age of the oldest undelivered (pending or in-flight) message, by `created_at`.
    /// Messages enqueued with a delay or waiting out a retry backoff count too, so a
    /// long delay raises this figure without anything being stuck.
    pub oldest_pending_age: Option<Duration>,
}

impl OutboxStats {
    /// Stats from their parts (for backends).
    pub fn new(
        pending: u64,
        in_flight: u64,
        dead: u64,
        dispatched: u64,
        oldest_pending_age: Option<Duration>,
    ) -> Self {
        OutboxStats {
            pending,
            in_flight,
            dead,
            dispatched,
            oldest_pending_age,
        }
    }
}

/// The store a relay claims from.
///
/// Enqueueing is **not** part of this trait: it must run in the caller's own
/// transaction, whose type is the database driver's (`&mut sqlx::PgConnection`, a
/// tiberius client inside `BEGIN TRAN`, a DynamoDB `TransactWriteItems`), so each
/// backend offers its own `enqueue` taking that transaction.
///
/// # Contract
///
/// Implementations must hold to these; `outbox-testkit`'s conformance suite checks
/// them case by case:
///
/// - **Atomic enqueue.** A message becomes visible to claims only when the enqueuing
///   transaction commits; a rolled-back transaction leaves nothing. A batch with an
///   invalid message or an id already stored fails whole
///   ([`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput),
///   [`ErrorKind::Conflict`](crate::ErrorKind::Conflict)) and writes nothing.
/// - **Claims are atomic and never wait.** A claim selects due messages, stamps a lease
///   (expiry by the storage's clock and a fresh [`LeaseToken`]) and returns them in one
///   atomic step. Messages held by a live lease or locked by another transaction are
///   skipped, never waited on. Each claim increments the message's `attempts`.
/// - **Due** means: not dispatched, not dead, and its availability time (enqueue time
///   plus delay, retry time, or the expiry of its last lease) has passed.
/// - **Fencing.** [`complete`](Self::complete), [`fail`](Self::fail) and
///   [`release`](Self::release) apply only to messages whose current token matches the
///   lease given; every other lease is reported in [`Settled::lost`] and its message is
///   not changed. A lease that expired but was not claimed again still matches.
/// - **Retries and dead letters.** `fail` with [`Disposition::Retry`] records the error
///   and makes the message due after the delay; [`Disposition::DeadLetter`] records the
///   error and removes the message from claims until [`requeue_dead`](Self::requeue_dead).
/// - **Release** makes a message due at once and undoes the attempt count of its claim:
///   a graceful shutdown does not consume attempts.
/// - **Per-key order**, when [`StoreCapabilities::ordering`] is [`KeyOrder::PerKey`]:
///   a message with a partition key is claimable only when no message with the same key
///   enqueued before it is pending or in flight; dead letters do not block.
/// - **Bounded purges.** [`purge_dispatched`](Self::purge_dispatched) deletes at most
///   `limit` dispatched messages and never touches pending, in-flight or dead ones.
/// - **Claim cost does not grow with history**: claims use an index (or key design)
///   that covers undelivered messages only.
///
/// # Errors
///
/// Invalid arguments give [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput)
/// before storage is touched. A claimed row whose *content* does not decode (headers
/// that are not a map of strings, say) must not wedge relays: the claim dead-letters it
/// with a `last_error` saying why and returns the others. A row whose *shape* is wrong
/// (a missing column, an unexpected type) is a schema problem and gives
/// [`ErrorKind::Decode`](crate::ErrorKind::Decode) or
/// [`ErrorKind::Schema`](crate::ErrorKind::Schema). Driver errors are mapped to their
/// kinds with [`Error::is_retryable`] set for transient ones. A `limit` of 0 asks for
/// nothing: listings return empty and purges delete nothing. A lost lease is not an
/// error of the batch methods (see [`Settled`]); the single-message helpers of
/// [`OutboxStoreExt`] turn it into [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost).
#[async_trait]
pub trait OutboxStore: Send + Sync + fmt::Debug {
    /// What this store does.
    fn capabilities(&self) -> StoreCapabilities;

    /// Claim up to `request.limit` due messages.
    ///
    /// - Oldest availability first, then enqueue order.
    /// - Returns an empty vector when nothing is due.
    async fn claim(&self, request: ClaimRequest) -> Result<Vec<ClaimedMessage>>;

    /// Claim exactly these messages if they are due, for dispatch right after commit.
    ///
    /// - Ids that are unknown, not due, held by another lease or locked by another
    ///   transaction are skipped; the result holds the ones claimed.
    /// - Per-key order, when enabled, applies as in [`claim`](Self::claim).
    async fn claim_ids(&self, ids: &[MessageId], lease: Duration) -> Result<Vec<ClaimedMessage>>;

    /// Mark messages dispatched (deleting them under [`Retention::Delete`]).
    async fn complete(&self, leases: &[Lease]) -> Result<Settled>;

    /// Record failed attempts: schedule retries or dead-letter.
    async fn fail(&self, failures: &[Failure]) -> Result<Settled>;

    /// Give messages back unattempted: due at once, attempt count restored.
    async fn release(&self, leases: &[Lease]) -> Result<Settled>;

    /// Dead letters in id order, starting after `after`, at most `limit`.
    async fn dead_letters(&self, after: Option<MessageId>, limit: usize) -> Result<Vec<Message>>;

    /// Make dead letters due again with their attempt count reset; returns how many were
    /// requeued (ids that are not dead letters are ignored).
    async fn requeue_dead(&self, ids: &[MessageId]) -> Result<u64>;

    /// Delete at most `limit` dispatched messages completed more than `older_than` ago;
    /// returns how many were deleted. Always 0 under [`Retention::Delete`].
    async fn purge_dispatched(&self, older_than: Duration, limit: usize) -> Result<u64>;

    /// Exact counts.
    async fn stats(&self) -> Result<OutboxStats>;
}

/// Single-message conveniences over [`OutboxStore`], with lost leases as errors.
#[async_trait]
pub trait OutboxStoreExt: OutboxStore {
    /// Complete one message.
    ///
    /// # Errors
    /// [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost) when the lease is no
    /// longer held; nothing changed.
    async fn complete_one(&self, lease: &Lease) -> Result<()> {
        self.complete(std::slice::from_ref(lease))
            .await?
            .into_result()
            .map(drop)
    }

    /// Fail one message.
    ///
    /// # Errors
    /// [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost) when the lease is no
    /// longer held; nothing changed.
    async fn fail_one(&self, failure: Failure) -> Result<()> {
        self.fail(std::slice::from_ref(&failure))
            .await?
            .into_result()
            .map(drop)
    }

    /// Release one message.
    ///
    /// # Errors
    /// [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost) when the lease is no
    /// longer held; nothing changed.
    async fn release_one(&self, lease: &Lease) -> Result<()> {
        self.release(std::slice::from_ref(lease))
            .await?
            .into_result()
            .map(drop)
    }
}

impl<S: OutboxStore + ?Sized> OutboxStoreExt for S {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn claim_request_bounds() {
        let ok = ClaimRequest::new(10, Duration::from_secs(30));
        assert!(ok.validate().is_ok());
        for bad in [
            ClaimRequest::new(0, Duration::from_secs(1)),
            ClaimRequest::new(MAX_CLAIM_BATCH + 1, Duration::from_secs(1)),
            ClaimRequest::new(1, Duration::ZERO),
            ClaimRequest::new(1, MAX_LEASE + Duration::from_secs(1)),
        ] {
            assert_eq!(bad.validate().unwrap_err().kind(), ErrorKind::InvalidInput);
        }
    }

    #[test]
    fn reconcile_lists_lost() {
        let (a, b, c) = (MessageId::new(), MessageId::new(), MessageId::new());
        let s = Settled::reconcile([a, b, c], [b]);
        assert_eq!(s.applied, 1);
        assert_eq!(s.lost, vec![a, c]);
        let err = s.into_result().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LeaseLost);
        assert_eq!(err.ids(), &[a, c]);
        assert_eq!(Settled::reconcile([a], [a]).into_result().unwrap(), 1);
    }
}
