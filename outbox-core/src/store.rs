//! The storage contract relays run against: [`OutboxStore`].

use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use uuid::Uuid;

use crate::backend::{bounded_error, in_id_order, validate_lease};
use crate::error::{Error, Result};
use crate::message::{Message, MessageId};

/// Longest lease a claim may ask for.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);
/// Shortest lease a claim may ask for: below the millisecond, storage clocks (and the
/// column types that keep the lease) cannot tell a lease from none.
pub const MIN_LEASE: Duration = Duration::from_millis(1);
/// Most messages one claim may ask for.
pub const MAX_CLAIM_BATCH: usize = 10_000;
/// Longest error text a [`Failure`] carries, in bytes; longer text is cut on a
/// character boundary when the failure is made.
pub const MAX_ERROR_LEN: usize = 4096;
/// The most attempts a message can be counted: a claim never counts past it, and a
/// message that reaches it is dead-lettered by the claim instead of being published.
pub const MAX_ATTEMPTS: u32 = i32::MAX as u32;

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

/// What one claim took: the messages to publish, and the rows it dead-lettered instead.
///
/// A claim that meets a row which cannot make a valid message dead-letters it on the
/// spot (see [`OutboxStore`]'s contract, "No row stops a claim"); those rows are listed
/// in [`dead_lettered`](Self::dead_lettered) so a relay counts them with its own dead
/// letters. Derefs to the claimed messages, so `claimed.len()`, `claimed.iter()` and
/// `for c in &claimed` read the messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use = "claimed messages must be published and settled"]
pub struct Claimed {
    /// The messages claimed, each with its lease: oldest availability first, then
    /// enqueue order.
    pub messages: Vec<ClaimedMessage>,
    /// How many rows the claim dead-lettered instead of returning, each with a
    /// `last_error` saying why (counting only dead-lettering that was written; a row's
    /// id may be what does not decode, so the store logs what it can of them).
    pub dead_lettered: usize,
}

impl Claimed {
    /// A claim of these messages that dead-lettered nothing.
    pub fn new(messages: Vec<ClaimedMessage>) -> Self {
        Claimed {
            messages,
            dead_lettered: 0,
        }
    }

    /// The same claim, having dead-lettered `count` rows.
    pub fn with_dead_lettered(mut self, count: usize) -> Self {
        self.dead_lettered = count;
        self
    }

    /// The claimed messages, without the dead-letter count.
    pub fn into_messages(self) -> Vec<ClaimedMessage> {
        self.messages
    }
}

impl std::ops::Deref for Claimed {
    type Target = [ClaimedMessage];

    fn deref(&self) -> &[ClaimedMessage] {
        &self.messages
    }
}

impl From<Vec<ClaimedMessage>> for Claimed {
    fn from(messages: Vec<ClaimedMessage>) -> Self {
        Claimed::new(messages)
    }
}

impl IntoIterator for Claimed {
    type Item = ClaimedMessage;
    type IntoIter = std::vec::IntoIter<ClaimedMessage>;

    fn into_iter(self) -> Self::IntoIter {
        self.messages.into_iter()
    }
}

impl<'a> IntoIterator for &'a Claimed {
    type Item = &'a ClaimedMessage;
    type IntoIter = std::slice::Iter<'a, ClaimedMessage>;

    fn into_iter(self) -> Self::IntoIter {
        self.messages.iter()
    }
}

/// A validated claim of due messages: at most [`limit`](Self::limit) of them, each
/// leased for [`lease`](Self::lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimRequest {
    limit: usize,
    lease: Duration,
}

impl ClaimRequest {
    /// Claim up to `limit` (1 to [`MAX_CLAIM_BATCH`]) messages, each leased for `lease`
    /// ([`MIN_LEASE`] to [`MAX_LEASE`]).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when out of bounds.
    pub fn new(limit: usize, lease: Duration) -> Result<Self> {
        if limit == 0 || limit > MAX_CLAIM_BATCH {
            return Err(Error::invalid_input(format!(
                "claim limit {limit} is outside 1..={MAX_CLAIM_BATCH}"
            )));
        }
        validate_lease(lease)?;
        Ok(ClaimRequest { limit, lease })
    }

    /// The most messages to claim.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// How long each lease lasts.
    pub fn lease(&self) -> Duration {
        self.lease
    }
}

/// A validated claim of specific messages, for dispatch right after commit: the ids in
/// ascending order without repeats (0 to [`MAX_CLAIM_BATCH`] of them), and the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimIds {
    ids: Vec<MessageId>,
    lease: Duration,
}

impl ClaimIds {
    /// Claim these ids, each leased for `lease` ([`MIN_LEASE`] to [`MAX_LEASE`]).
    /// Repeated ids count once.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for more than
    /// [`MAX_CLAIM_BATCH`] distinct ids or a lease out of bounds.
    pub fn new(ids: &[MessageId], lease: Duration) -> Result<Self> {
        validate_lease(lease)?;
        let ids = in_id_order(ids, |id| *id).into_iter().copied();
        let mut ids: Vec<MessageId> = ids.collect();
        ids.dedup();
        if ids.len() > MAX_CLAIM_BATCH {
            return Err(Error::invalid_input(format!(
                "{} ids exceed the claim limit of {MAX_CLAIM_BATCH}",
                ids.len()
            )));
        }
        Ok(ClaimIds { ids, lease })
    }

    /// The ids, ascending, without repeats.
    pub fn ids(&self) -> &[MessageId] {
        &self.ids
    }

    /// How long each lease lasts.
    pub fn lease(&self) -> Duration {
        self.lease
    }
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
///
/// The error text is bounded once, here, to [`MAX_ERROR_LEN`] bytes, so every backend
/// stores the same text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    lease: Lease,
    error: String,
    disposition: Disposition,
}

impl Failure {
    /// A failed attempt under `lease`, recording `error` (cut to [`MAX_ERROR_LEN`]
    /// bytes on a character boundary) and leading to `disposition`.
    pub fn new(lease: Lease, error: impl Into<String>, disposition: Disposition) -> Self {
        Failure {
            lease,
            error: bounded_error(error.into()),
            disposition,
        }
    }

    /// The lease the attempt held.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The error to record as the message's `last_error`.
    pub fn error(&self) -> &str {
        &self.error
    }

    /// Retry or dead-letter.
    pub fn disposition(&self) -> Disposition {
        self.disposition
    }
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
    /// Keep dispatched rows (for audit or replay) until [`OutboxAdmin::purge_dispatched`](crate::OutboxAdmin::purge_dispatched)
    /// removes those older than the window.
    Keep {
        /// How long dispatched rows are kept.
        window: Duration,
    },
}

/// How a store holds the messages it claimed while a relay publishes them.
///
/// Chosen per store (for example `PgOutboxConfig::with_claim_mode`), declared in
/// [`StoreCapabilities::claim_mode`]; the relay works the same in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClaimMode {
    /// The claim writes a lease into each message (expiry, token, attempt) and commits
    /// at once; the relay publishes with no transaction open. A crashed relay's
    /// messages come due when the lease expires. Works on every store.
    #[default]
    Lease,
    /// The claim locks the messages in a transaction on a connection the store keeps
    /// for the batch, writing nothing to them; the settle runs in that transaction and
    /// commits it. The row lock is the lease: a crashed relay's messages are claimable
    /// as soon as the server ends its session, and a session idle in the transaction
    /// for longer than the lease is ended by the server. What differs from
    /// [`Lease`](Self::Lease) is listed on [`OutboxStore`] ("Held-lock claims").
    HeldLock,
}

/// What a store does, so relays and the conformance suite know what to expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StoreCapabilities {
    /// The ordering this store's claims enforce.
    pub ordering: KeyOrder,
    /// What completing does.
    pub retention: Retention,
    /// Whether [`OutboxStore::renew`] extends leases. `false` (the default) for a store
    /// that keeps the default method, which refuses: relays then never renew and a
    /// claimed batch must be published within one lease, as
    /// [`RelayConfig::validate`](crate::RelayConfig::validate) checks.
    pub lease_renewal: bool,
    /// How claims hold messages ([`ClaimMode::Lease`] unless declared).
    pub claim_mode: ClaimMode,
    /// The most claimed batches the store can hold at once, over all its relays, when
    /// it is bounded (held-lock claims keep a connection per batch); `None` when not.
    /// [`Relay::new`](crate::Relay::new) refuses a relay that alone could need more.
    pub batches_in_flight: Option<usize>,
}

impl StoreCapabilities {
    /// Capabilities with this ordering and retention, without lease renewal.
    pub fn new(ordering: KeyOrder, retention: Retention) -> Self {
        StoreCapabilities {
            ordering,
            retention,
            lease_renewal: false,
            claim_mode: ClaimMode::Lease,
            batches_in_flight: None,
        }
    }

    /// The same, declaring how claims hold messages.
    #[must_use]
    pub fn with_claim_mode(mut self, mode: ClaimMode) -> Self {
        self.claim_mode = mode;
        self
    }

    /// The same, declaring the most claimed batches the store can hold at once.
    #[must_use]
    pub fn with_batches_in_flight(mut self, bound: Option<usize>) -> Self {
        self.batches_in_flight = bound;
        self
    }

    /// The same, declaring whether [`OutboxStore::renew`] is implemented.
    #[must_use]
    pub fn with_lease_renewal(mut self, renews: bool) -> Self {
        self.lease_renewal = renews;
        self
    }

    /// Whether `other` asks for the same ordering and retention: what a store made for
    /// `other` must match (the optional capabilities, such as
    /// [`lease_renewal`](Self::lease_renewal), are the store's to declare).
    pub fn same_semantics(&self, other: &StoreCapabilities) -> bool {
        self.ordering == other.ordering && self.retention == other.retention
    }
}

/// The leases to settle in one [`OutboxStore::settle_and_claim`] call: what a relay
/// finished with batch N, settled as by [`complete`](OutboxStore::complete),
/// [`fail`](OutboxStore::fail) and [`release`](OutboxStore::release).
#[derive(Debug, Clone, Copy, Default)]
pub struct Settlement<'a> {
    /// Leases to complete.
    pub complete: &'a [Lease],
    /// Failed attempts to record.
    pub fail: &'a [Failure],
    /// Leases to give back unattempted.
    pub release: &'a [Lease],
}

impl Settlement<'_> {
    /// Whether there is nothing to settle.
    pub fn is_empty(&self) -> bool {
        self.complete.is_empty() && self.fail.is_empty() && self.release.is_empty()
    }

    /// Every message this settlement names.
    pub fn ids(&self) -> impl Iterator<Item = MessageId> + '_ {
        self.complete
            .iter()
            .map(|l| l.id)
            .chain(self.fail.iter().map(|f| f.lease().id))
            .chain(self.release.iter().map(|l| l.id))
    }
}

/// What [`OutboxStore::settle_and_claim`] did: each part of the settlement, fenced as
/// by its own method, and the claim that followed.
#[derive(Debug)]
#[must_use = "lost leases mean another claimer owns those messages; claimed messages must be published"]
pub struct SettledAndClaimed {
    /// The completes.
    pub completed: Settled,
    /// The failures.
    pub failed: Settled,
    /// The releases.
    pub released: Settled,
    /// The claim, made after the settles applied. An error here means the settles did
    /// apply (as the fields above say) and only the claim failed.
    pub claimed: Result<Claimed>,
}

/// What [`OutboxStore::renew`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use = "lost leases mean another claimer owns those messages"]
pub struct Renewed {
    /// The leases extended, with their new expiry (same ids and tokens).
    pub leases: Vec<Lease>,
    /// Messages whose leases were no longer held: nothing was changed for them.
    pub lost: Vec<MessageId>,
}

impl Renewed {
    /// What a renewal of `leases` did, from the ids it extended (`renewed`) with their
    /// new expiry: those leases with that expiry, the others lost, in `leases`' order.
    pub fn reconcile(
        leases: &[Lease],
        renewed: impl IntoIterator<Item = (MessageId, SystemTime)>,
    ) -> Self {
        let expiry: std::collections::HashMap<MessageId, SystemTime> =
            renewed.into_iter().collect();
        let mut out = Renewed::default();
        for l in leases {
            match expiry.get(&l.id) {
                Some(at) => out.leases.push(Lease {
                    expires_at: *at,
                    ..*l
                }),
                None => out.lost.push(l.id),
            }
        }
        out
    }
}

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
        settle_then_claim(self, settlement, next).await
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
    /// - `lease` is checked with [`validate_lease`].
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

/// [`OutboxStore::settle_and_claim`]'s default, for a store that overrides it only in
/// some modes: `complete`, `fail` and `release` (skipping empty parts), then `claim`,
/// releasing at once (attempt given back) any claimed message the settlement named.
///
/// # Errors
/// The first settle's error; a failed claim, or a failed release of the named messages
/// it claimed, is reported in [`SettledAndClaimed::claimed`].
pub async fn settle_then_claim<S: OutboxStore + ?Sized>(
    store: &S,
    settlement: Settlement<'_>,
    next: ClaimRequest,
) -> Result<SettledAndClaimed> {
    let completed = settle_part(
        settlement.complete.len(),
        store.complete(settlement.complete),
    );
    let completed = completed.await?;
    let failed = settle_part(settlement.fail.len(), store.fail(settlement.fail)).await?;
    let released = settle_part(settlement.release.len(), store.release(settlement.release));
    let released = released.await?;
    let claimed = match store.claim(next).await {
        Ok(claimed) => exclude_settled(store, claimed, &settlement).await,
        Err(err) => Err(err),
    };
    Ok(SettledAndClaimed {
        completed,
        failed,
        released,
        claimed,
    })
}

/// `claimed` without the messages `settlement` named, which are released at once
/// (attempt given back).
///
/// # Errors
/// The release's error; the claimed leases then lapse as after a crash.
async fn exclude_settled<S: OutboxStore + ?Sized>(
    store: &S,
    claimed: Claimed,
    settlement: &Settlement<'_>,
) -> Result<Claimed> {
    let named: std::collections::HashSet<MessageId> = settlement.ids().collect();
    if !claimed.iter().any(|c| named.contains(&c.message.id)) {
        return Ok(claimed);
    }
    let Claimed {
        messages,
        dead_lettered,
    } = claimed;
    let (again, kept): (Vec<ClaimedMessage>, Vec<ClaimedMessage>) = messages
        .into_iter()
        .partition(|c| named.contains(&c.message.id));
    let leases: Vec<Lease> = again.iter().map(|c| c.lease).collect();
    let _ = store.release(&leases).await?;
    Ok(Claimed::new(kept).with_dead_lettered(dead_lettered))
}

/// One part of a settlement: nothing to do for an empty part.
async fn settle_part(
    count: usize,
    call: impl std::future::Future<Output = Result<Settled>>,
) -> Result<Settled> {
    if count == 0 {
        Ok(Settled::default())
    } else {
        call.await
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn claim_request_bounds() {
        let ok = ClaimRequest::new(10, Duration::from_secs(30)).unwrap();
        assert_eq!((ok.limit(), ok.lease()), (10, Duration::from_secs(30)));
        ClaimRequest::new(1, MIN_LEASE).unwrap();
        ClaimRequest::new(MAX_CLAIM_BATCH, MAX_LEASE).unwrap();
        for (limit, lease) in [
            (0, Duration::from_secs(1)),
            (MAX_CLAIM_BATCH + 1, Duration::from_secs(1)),
            (1, Duration::ZERO),
            (1, MIN_LEASE - Duration::from_nanos(1)),
            (1, MAX_LEASE + Duration::from_nanos(1)),
        ] {
            let err = ClaimRequest::new(limit, lease).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{limit} {lease:?}");
        }
    }

    #[test]
    fn claim_ids_are_sorted_deduplicated_and_bounded() {
        let (a, b) = (MessageId::new(), MessageId::new());
        let claim = ClaimIds::new(&[b, a, b, a], Duration::from_secs(1)).unwrap();
        assert_eq!(claim.ids(), &[a, b]);
        assert!(ClaimIds::new(&[], Duration::from_secs(1))
            .unwrap()
            .ids()
            .is_empty());
        let many: Vec<MessageId> = (0..=MAX_CLAIM_BATCH).map(|_| MessageId::new()).collect();
        assert_eq!(
            ClaimIds::new(&many, Duration::from_secs(1))
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidInput
        );
        ClaimIds::new(&many[..MAX_CLAIM_BATCH], Duration::from_secs(1)).unwrap();
        let repeated = vec![a; MAX_CLAIM_BATCH + 5];
        assert_eq!(ClaimIds::new(&repeated, MIN_LEASE).unwrap().ids(), &[a]);
        assert!(ClaimIds::new(&[a], Duration::ZERO).is_err());
    }

    #[test]
    fn failure_error_text_is_bounded_once() {
        let lease = Lease {
            id: MessageId::new(),
            token: LeaseToken::new(),
            expires_at: SystemTime::now(),
        };
        let long = "é".repeat(MAX_ERROR_LEN);
        let f = Failure::new(lease, long, Disposition::DeadLetter);
        assert!(f.error().len() <= MAX_ERROR_LEN && f.error().len() > MAX_ERROR_LEN - 2);
        assert!(f.error().chars().all(|c| c == 'é'));
        let exact = "x".repeat(MAX_ERROR_LEN);
        assert_eq!(
            Failure::new(lease, exact.clone(), Disposition::DeadLetter).error(),
            exact
        );
        assert_eq!(
            Failure::new(lease, "short", Disposition::DeadLetter).error(),
            "short"
        );
        assert_eq!(f.lease(), &lease);
        assert_eq!(f.disposition(), Disposition::DeadLetter);
    }

    #[test]
    fn id_order_sorts_whatever_the_input_order() {
        let ids: Vec<MessageId> = (0..50).map(|_| MessageId::new()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        let reversed: Vec<MessageId> = sorted.iter().rev().copied().collect();
        for input in [&ids, &reversed, &sorted] {
            let bound: Vec<MessageId> = in_id_order(input, |id| *id).into_iter().copied().collect();
            assert_eq!(bound, sorted);
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

    #[test]
    fn renewed_reconcile_keeps_order_and_new_expiry() {
        let old = SystemTime::UNIX_EPOCH;
        let later = old + Duration::from_secs(60);
        let leases: Vec<Lease> = (0..3)
            .map(|_| Lease {
                id: MessageId::new(),
                token: LeaseToken::new(),
                expires_at: old,
            })
            .collect();
        let r = Renewed::reconcile(&leases, [(leases[2].id, later), (leases[0].id, later)]);
        let held: Vec<_> = r
            .leases
            .iter()
            .map(|l| (l.id, l.token, l.expires_at))
            .collect();
        let expect = |l: &Lease| (l.id, l.token, later);
        assert_eq!(held, [expect(&leases[0]), expect(&leases[2])]);
        assert_eq!(r.lost, [leases[1].id]);
    }
}
