//! The storage contract relays run against: [`OutboxStore`].

mod capabilities;
mod claim;
pub(crate) mod default_settle;
mod lease;
mod settle;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

pub use crate::bounds::{MAX_ATTEMPTS, MAX_CLAIM_BATCH, MAX_ERROR_LEN, MAX_LEASE, MIN_LEASE};
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::message::Message;
pub use capabilities::{ClaimMode, KeyOrder, Retention, StoreCapabilities};
pub use claim::{ClaimIds, ClaimRequest, Claimed, ClaimedMessage};
pub use lease::{Lease, LeaseToken, Renewed};
pub use settle::{Disposition, Failure, Settled, SettledAndClaimed, Settlement};

/// The store a relay claims from: claim, claim ids, complete, fail, release.
///
/// This is all a relay needs; what an operator needs (stats, dead letters, purges) is
/// [`OutboxAdmin`](crate::OutboxAdmin), so a new backend can run a relay first.
/// Enqueueing is **not** part of either trait: it must run in the caller's own
/// transaction, whose type is the database driver's (`&mut sqlx::PgConnection`, a
/// tiberius client inside `BEGIN TRAN`, a DynamoDB `TransactWriteItems`), so each
/// backend offers its own `enqueue` taking that transaction.
///
/// # Contract
///
/// Implementations must hold to these; `outbox-testkit`'s conformance suite checks
/// them case by case (the backend guide, `CONTRIBUTING.md`, gives each as SQL):
///
/// - **Atomic enqueue.** A message becomes visible to claims only when the enqueuing
///   transaction commits; a rolled-back transaction leaves nothing. A batch with an
///   invalid message or an id already stored fails whole
///   ([`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput),
///   [`ErrorKind::Conflict`](crate::ErrorKind::Conflict)) and writes nothing.
/// - **Claims are atomic and never wait.** A claim selects due messages, stamps a lease
///   (expiry by the storage's clock and a fresh [`LeaseToken`]) and returns them in one
///   atomic step. Messages held by a live lease or locked by another transaction are
///   skipped, never waited on. Each claim increments the message's `attempts`, never
///   past [`MAX_ATTEMPTS`].
/// - **Due** means: not dispatched, not dead, and its availability time (enqueue time
///   plus delay, retry time, or the expiry of its last lease) has passed.
/// - **Fencing.** [`complete`](Self::complete), [`fail`](Self::fail) and
///   [`release`](Self::release) apply only to messages whose current token matches the
///   lease given; every other lease is reported in [`Settled::lost`] and its message is
///   not changed. A lease that expired but was not claimed again still matches.
/// - **Retries and dead letters.** `fail` with [`Disposition::Retry`] records the error
///   and makes the message due after the delay; [`Disposition::DeadLetter`] records the
///   error and removes the message from claims until it is requeued
///   ([`OutboxAdmin::requeue_dead`](crate::OutboxAdmin::requeue_dead)).
/// - **Release** makes a message due at once and undoes the attempt count of its claim:
///   a graceful shutdown does not consume attempts.
/// - **Per-key order**, when [`StoreCapabilities::ordering`] is [`KeyOrder::PerKey`]:
///   a message with a partition key is claimable only when no message with the same key
///   enqueued before it is pending or in flight; dead letters do not block.
/// - **Claim cost does not grow with history**: claims use an index (or key design)
///   that covers undelivered messages only.
/// - **Settle and claim.** [`settle_and_claim`](Self::settle_and_claim) fences its
///   settlement as the plain settles do, reports lost leases per part, and its claim
///   skips locked rows and never returns a message the settlement named.
/// - **Lease renewal**, when [`StoreCapabilities::lease_renewal`] is declared:
///   [`renew`](Self::renew) with a stale token is rejected and changes nothing; a
///   renewed lease is not claimable by others until its new expiry; a lease that is
///   not renewed lapses at its expiry as usual.
/// - **No row stops a claim.** A claimed row that does not make a valid message (its
///   content does not decode, a timestamp is out of range, it breaks the
///   [`MessageLimits`](crate::MessageLimits) rules because another tool wrote it, its
///   attempts reached [`MAX_ATTEMPTS`]) is dead-lettered by the claim that meets it,
///   with a `last_error` saying why, and the others are returned. Use
///   [`Message::check_stored`] for the rules.
///
/// # Held-lock claims
///
/// A store that declares [`ClaimMode::HeldLock`] in
/// [`StoreCapabilities::claim_mode`] keeps every point above, with these differences,
/// each checked by the same suite (its cases branch where the contract does):
///
/// - **The claim writes nothing to the messages.** It locks them in a transaction the
///   store keeps open on a connection of its own, one per claimed batch, and reports
///   each message's stored `attempts` plus one (the attempt it starts). The leases of
///   one claim share their token: it names the batch.
/// - **Settles run in that transaction.** A settle of some of a batch's leases applies
///   there and is seen by others only when the settle of the batch's last open lease
///   commits the transaction. A failed commit undoes the batch's earlier settles: its
///   messages are due again, and publish again. Release writes nothing: the message
///   is due again when the batch ends. `fail` counts the attempt it records.
/// - **Lapse.** A lease lapses when its session ends: the relay process died, the
///   connection broke, or the session sat idle in its transaction for longer than the
///   lease (the server ends it). A lapsed lease is lost **whether or not** the message
///   was claimed again (unlike the lease mode's "a lease that expired but was not
///   claimed again still matches"), and its settles report it in [`Settled::lost`].
///   Renewal arms the idle bound again, for the whole batch.
/// - **Attempts of ended batches.** A batch that ends without committing wrote no
///   attempt. Its messages still undelivered are charged one attempt each by a sweep
///   after it ended (before a later claim, within the store's sweep interval). A claim
///   that races the batch's end may take its messages before the sweep: they are then
///   charged when that claim ends, if still undelivered. So a message whose publish
///   kills relay after relay still reaches the relay's last attempt, and the relay
///   dead-letters a message claimed past it without publishing it.
/// - **Connections.** Each batch in flight holds a connection until it settles: the
///   store's held connections bound how many batches all relays on it keep in flight.
///
/// # Errors
///
/// Arguments arrive validated ([`ClaimRequest`], [`ClaimIds`], [`Failure`]). A row
/// whose *shape* is wrong (a missing column, an unexpected type) is a schema problem
/// and gives [`ErrorKind::Decode`](crate::ErrorKind::Decode) or
/// [`ErrorKind::Schema`](crate::ErrorKind::Schema). Driver errors are mapped to their
/// kinds with [`Error::is_retryable`] set for transient ones. A lost lease is not an
/// error of the batch methods (see [`Settled`]); the single-message helpers of
/// [`OutboxStoreExt`] turn it into [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost).
#[async_trait]
pub trait OutboxStore: Send + Sync + fmt::Debug {
    /// What this store does.
    fn capabilities(&self) -> StoreCapabilities;

    /// Claim up to [`ClaimRequest::limit`] due messages.
    ///
    /// - Oldest availability first, then enqueue order.
    /// - Returns an empty vector when nothing is due.
    async fn claim(&self, request: ClaimRequest) -> Result<Claimed>;

    /// Claim exactly these messages if they are due, for dispatch right after commit.
    ///
    /// - Ids that are unknown, not due, held by another lease or locked by another
    ///   transaction are skipped; the result holds the ones claimed.
    /// - Per-key order, when enabled, applies as in [`claim`](Self::claim).
    async fn claim_ids(&self, request: &ClaimIds) -> Result<Claimed>;

    /// Mark messages dispatched (deleting them under [`Retention::Delete`]).
    async fn complete(&self, leases: &[Lease]) -> Result<Settled>;

    /// Record failed attempts: schedule retries or dead-letter.
    async fn fail(&self, failures: &[Failure]) -> Result<Settled>;

    /// Give messages back unattempted: due at once, attempt count restored.
    async fn release(&self, leases: &[Lease]) -> Result<Settled>;

    /// Settle what a relay finished with one batch and claim the next, in one round
    /// trip where the store can: what a busy relay calls between batches.
    ///
    /// - The settlement applies first, each part fenced exactly as
    ///   [`complete`](Self::complete), [`fail`](Self::fail) and
    ///   [`release`](Self::release) fence it, lost leases reported per part.
    /// - Then `next` is claimed as by [`claim`](Self::claim), skipping locked rows. The
    ///   claim **never returns a message the settlement named**, even one that is due
    ///   again by then (a lapsed lease that could not be settled, a failure retried at
    ///   once, a release).
    /// - `Err`: the settlement failed and nothing was claimed. As after any settle
    ///   whose answer was lost, the settlement may or may not have applied; retry it
    ///   with the plain methods (a lease reported lost then may be one this call
    ///   settled).
    /// - `Ok` with [`SettledAndClaimed::claimed`] an error: the settlement applied (as
    ///   reported) and only the claim failed.
    ///
    /// The default calls `complete`, `fail` and `release` (skipping empty parts), then
    /// `claim`, and releases at once (attempt given back) any claimed message the
    /// settlement named: correct for every store, at one round trip per part. A store
    /// that can do it in one statement overrides it (PostgreSQL: one data-modifying
    /// statement completes and claims). The conformance suite checks either.
    async fn settle_and_claim(
        &self,
        settlement: Settlement<'_>,
        next: ClaimRequest,
    ) -> Result<SettledAndClaimed> {
        default_settle::settle_then_claim(self, settlement, next).await
    }

    /// Extend `leases` to `lease` from now, by the storage's clock, keeping their
    /// tokens: what a relay calls while a long publish runs, so its leases do not lapse
    /// and the messages publish twice.
    ///
    /// - Fenced like [`complete`](Self::complete): only leases whose token is still
    ///   the message's current one are extended (a lease that lapsed but was not
    ///   claimed again still is); the others are reported in [`Renewed::lost`] and
    ///   their messages are not changed.
    /// - A renewed message is not claimable until its new expiry.
    /// - `lease` is checked with [`validate_lease`](crate::backend::validate_lease).
    ///
    /// # Errors
    /// The default refuses with [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported):
    /// a store that implements renewal declares it in
    /// [`StoreCapabilities::lease_renewal`], and relays renew only then.
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for a lease out of
    /// bounds.
    async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        let _ = (leases, lease);
        Err(Error::new(
            crate::ErrorKind::Unsupported,
            "this store does not renew leases (StoreCapabilities::lease_renewal is false)",
        ))
    }
}

/// `Arc<S>` is a store when `S` is, so a handle already behind an `Arc` can be passed
/// where a store is expected without wrapping it again.
#[async_trait]
impl<S: OutboxStore + ?Sized> OutboxStore for std::sync::Arc<S> {
    fn capabilities(&self) -> StoreCapabilities {
        (**self).capabilities()
    }
    async fn claim(&self, request: ClaimRequest) -> Result<Claimed> {
        (**self).claim(request).await
    }
    async fn claim_ids(&self, request: &ClaimIds) -> Result<Claimed> {
        (**self).claim_ids(request).await
    }
    async fn complete(&self, leases: &[Lease]) -> Result<Settled> {
        (**self).complete(leases).await
    }
    async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        (**self).fail(failures).await
    }
    async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        (**self).release(leases).await
    }
    async fn settle_and_claim(
        &self,
        settlement: Settlement<'_>,
        next: ClaimRequest,
    ) -> Result<SettledAndClaimed> {
        (**self).settle_and_claim(settlement, next).await
    }
    async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        (**self).renew(leases, lease).await
    }
}

/// Single-message conveniences over [`OutboxStore`], with lost leases as errors.
///
/// Implemented for every store; do not implement it yourself.
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
