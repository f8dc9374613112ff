//! Held-lock claims ([`ClaimMode::HeldLock`](crate::ClaimMode::HeldLock)) written once:
//! [`HeldBatches`] keeps a store's open batches, each a transaction on a connection of
//! its own, and runs claim, settle and renew through a backend's [`HeldEngine`], which
//! holds the engine's statements.
//!
//! # The protocol every engine follows
//!
//! 1. A claim begins a transaction (or takes one kept ready) and locks the due rows,
//!    skipping locked ones, writing nothing to them ([`HeldEngine::select`]). A claim
//!    that returns nothing rolls back ([`HeldEngine::restart`]): it may hold a row it
//!    locked and then did not return. It bounds
//!    how long the transaction may sit idle by the lease, so a relay that hangs has its
//!    session ended by the server, which releases the rows.
//! 2. Poison rows are dead-lettered in that transaction
//!    ([`HeldEngine::dead_letter`]).
//! 3. The batch is **registered** ([`HeldEngine::register`]): a row naming its messages,
//!    written on another connection and committed before the claim returns, so before
//!    anything is published.
//! 4. Settles run in the claim's transaction, releases writing nothing; the settle that
//!    leaves no lease of the batch open ends its registry row and commits, beginning
//!    the next transaction ([`HeldEngine::finish`]), kept ready for a claim.
//! 5. A batch that never commits rolls back as a whole: its messages are due again at
//!    once, with no attempt written, and its registry row stays. The engine's
//!    [`sweep`](HeldEngine::sweep) charges each of those messages one attempt unless a
//!    live claim holds it (charged by a later sweep, if still undelivered then), so a
//!    message whose publish kills relays is dead-lettered after its last attempt.
//!    [`HeldBatches`] sweeps before its first claim, then before a claim at most every
//!    sweep interval.
//!
//! A statement error ends its batch (rolled back when the transaction is dropped). When
//! the engine says the session is gone ([`HeldEngine::session_gone`]) the batch's
//! leases are reported lost, as lapsed leases are; other errors are returned.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::time::Instant;

use super::claim::DecodedClaim;
use super::rules::in_id_order;
use crate::error::{Error, Result};
use crate::message::MessageId;
use crate::store::{Claimed, Failure, Lease, LeaseToken, Renewed, Settled};

/// The default number of connections a store's held-lock claims keep open: the
/// batches one relay holds at the default pipeline depth, plus one for a
/// [`dispatch_ids`](crate::Relay::dispatch_ids) call, plus one spare.
pub const DEFAULT_HELD_CONNECTIONS: u32 = 4;

/// The default interval between sweeps of batches that ended without committing.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Which due rows a held claim takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeldWhich {
    /// Any.
    Due,
    /// Only these.
    Ids(Vec<MessageId>),
    /// Any but these (what the settle before it named).
    Excluding(Vec<MessageId>),
}

/// What [`HeldEngine::select`] read: the decoded rows and the batch's name in the
/// registry.
#[derive(Debug)]
pub struct HeldRows {
    /// The rows, decoded with the claim's token; poison rows by id.
    pub decoded: DecodedClaim<MessageId>,
    /// What the engine registers the batch under (a transaction id, the token): passed
    /// back to [`HeldEngine::register`].
    pub batch: String,
}

/// One held claim's request to [`HeldEngine::select`].
#[derive(Debug, Clone, Copy)]
pub struct HeldSelect<'a> {
    /// Which rows.
    pub which: &'a HeldWhich,
    /// At most this many.
    pub limit: usize,
    /// The lease: how long the transaction may sit idle, and the leases' expiry.
    pub lease: Duration,
    /// The claim's token, for the leases.
    pub token: LeaseToken,
}

/// The engine half of held-lock claims: transactions and statements. Every statement
/// returns the driver's errors mapped to [`Error`]; [`session_gone`](Self::session_gone)
/// reads them back.
#[async_trait]
pub trait HeldEngine: Send + Sync + 'static {
    /// An open transaction on a connection of the held pool; dropping it rolls back.
    type Tx: Send + 'static;

    /// Begin a transaction on a held connection.
    async fn begin(&self) -> Result<Self::Tx>;

    /// Lock the rows `select` names, skipping locked ones, and read them, writing
    /// nothing to them; bound the transaction's idle time by the lease.
    async fn select(&self, tx: &mut Self::Tx, select: HeldSelect<'_>) -> Result<HeldRows>;

    /// Dead-letter claimed rows that cannot be delivered, in `tx`; how many were.
    async fn dead_letter(
        &self,
        tx: &mut Self::Tx,
        poison: Vec<(MessageId, String)>,
    ) -> Result<usize>;

    /// Record the open batch `batch` of `ids`, on another connection, committed before
    /// returning.
    async fn register(&self, batch: &str, ids: &[MessageId]) -> Result<()>;

    /// Complete `ids` (sorted, each once) in `tx`; the ids applied.
    async fn complete(&self, tx: &mut Self::Tx, ids: &[MessageId]) -> Result<Vec<MessageId>>;

    /// Record `failures` (one per id, in id order) in `tx`; the ids applied.
    async fn fail(&self, tx: &mut Self::Tx, failures: &[&Failure]) -> Result<Vec<MessageId>>;

    /// End the batch: delete its registry row (unless a settle statement did, when
    /// `by_release` is false and the engine's settles do) and commit; begin the next
    /// transaction on the connection and return it. On an error, roll back as
    /// [`abandon`](Self::abandon) does before returning it.
    async fn finish(&self, tx: Self::Tx, by_release: bool) -> Result<Self::Tx>;

    /// Roll `tx` back and begin the next transaction on its connection (one round trip
    /// where the engine can): after a claim that returned nothing, which may still
    /// have locked rows (PostgreSQL keeps the lock on a row that changed under a
    /// `FOR UPDATE` scan and then failed its re-check). On an error, roll back as
    /// [`abandon`](Self::abandon) does before returning it.
    async fn restart(&self, tx: Self::Tx) -> Result<Self::Tx>;

    /// Roll `tx` back now, ignoring errors (its session may be gone). A transaction
    /// that is only dropped may be rolled back when its connection is next used, and
    /// keep its row locks until then.
    async fn abandon(&self, tx: Self::Tx);

    /// Bound the transaction's idle time by `lease` again; the leases' new expiry.
    async fn renew(&self, tx: &mut Self::Tx, lease: Duration) -> Result<SystemTime>;

    /// Charge one attempt to the undelivered messages of batches that ended without
    /// committing, skipping messages a live claim holds; how many were charged.
    async fn sweep(&self) -> Result<u64>;

    /// Whether `err` means the transaction's session is gone (the connection broke,
    /// the server ended the session): its batch is lost, not failed.
    fn session_gone(&self, err: &Error) -> bool;
}

type Slot<Tx> = Arc<tokio::sync::Mutex<Option<Batch<Tx>>>>;

/// One claimed batch: its transaction and the ids not yet settled.
struct Batch<Tx> {
    tx: Tx,
    open: HashSet<MessageId>,
}

/// What a settle runs for its leases of one batch.
enum Settle<'a> {
    Complete,
    Fail(&'a [Failure]),
    Release,
}

/// The open held batches of one store and the engine they run on.
pub struct HeldBatches<E: HeldEngine> {
    engine: E,
    batches: Mutex<HashMap<LeaseToken, Slot<E::Tx>>>,
    /// Transactions begun and not yet used: the commit that ends a batch, and the
    /// rollback that ends a claim that found nothing, begin the next one in the same
    /// round trip.
    ready: Mutex<Vec<E::Tx>>,
    sweep_interval: Duration,
    /// When the last sweep started (`None` before the first claim).
    last_sweep: Mutex<Option<Instant>>,
}

impl<E: HeldEngine> std::fmt::Debug for HeldBatches<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldBatches")
            .field("open_batches", &self.open_batches())
            .field("sweep_interval", &self.sweep_interval)
            .finish_non_exhaustive()
    }
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<E: HeldEngine> HeldBatches<E> {
    /// Held claims on `engine`, sweeping at most every `sweep_interval`.
    pub fn new(engine: E, sweep_interval: Duration) -> Self {
        HeldBatches {
            engine,
            batches: Mutex::default(),
            ready: Mutex::default(),
            sweep_interval,
            last_sweep: Mutex::new(None),
        }
    }

    /// The engine.
    pub fn engine(&self) -> &E {
        &self.engine
    }

    /// How many batches are open.
    pub fn open_batches(&self) -> usize {
        locked(&self.batches).len()
    }

    /// Claim up to `limit` due messages (`which` of them) for `lease`, holding them
    /// until their batch is settled.
    ///
    /// # Errors
    /// The engine's errors; nothing stays claimed.
    pub async fn claim(&self, which: HeldWhich, limit: usize, lease: Duration) -> Result<Claimed> {
        self.sweep_if_due().await;
        let token = LeaseToken::new();
        let select = HeldSelect {
            which: &which,
            limit,
            lease,
            token,
        };
        let mut ready = locked(&self.ready).pop();
        let (mut tx, rows) = loop {
            let reused = ready.is_some();
            let mut tx = match ready.take() {
                Some(tx) => tx,
                None => self.engine.begin().await?,
            };
            match self.engine.select(&mut tx, select).await {
                Ok(rows) => break (tx, rows),
                // A transaction kept ready may have lost its session meanwhile (a server
                // that ends idle transactions, a restart): claim on a new one.
                Err(err) if reused && self.engine.session_gone(&err) => {
                    self.engine.abandon(tx).await;
                }
                Err(err) => {
                    self.engine.abandon(tx).await;
                    return Err(err);
                }
            }
        };
        let DecodedClaim { claimed, poison } = rows.decoded;
        if claimed.is_empty() && poison.is_empty() {
            // It returned nothing, but may hold locks on rows it skipped: start over
            // and keep the new transaction for the next claim.
            if let Ok(next) = self.engine.restart(tx).await {
                locked(&self.ready).push(next);
            }
            return Ok(Claimed::default());
        }
        // An error from here on rolls the claim back.
        let dead_lettered = if poison.is_empty() {
            0
        } else {
            match self.engine.dead_letter(&mut tx, poison).await {
                Ok(n) => n,
                Err(err) => {
                    self.engine.abandon(tx).await;
                    return Err(err);
                }
            }
        };
        if claimed.is_empty() {
            let next = self.engine.finish(tx, true).await?;
            locked(&self.ready).push(next);
            return Ok(Claimed::default().with_dead_lettered(dead_lettered));
        }
        let open: HashSet<MessageId> = claimed.iter().map(|c| c.message.id).collect();
        let listed: Vec<MessageId> = open.iter().copied().collect();
        if let Err(err) = self.engine.register(&rows.batch, &listed).await {
            self.engine.abandon(tx).await;
            return Err(err);
        }
        locked(&self.batches).insert(
            token,
            Arc::new(tokio::sync::Mutex::new(Some(Batch { tx, open }))),
        );
        Ok(Claimed::new(claimed).with_dead_lettered(dead_lettered))
    }

    /// Complete `leases`, each in its batch's transaction.
    ///
    /// # Errors
    /// The first error a batch returned that does not mean its session is gone.
    pub async fn complete(&self, leases: &[Lease]) -> Result<Settled> {
        self.settle(leases, Settle::Complete).await
    }

    /// Give `leases` back unsettled: nothing is written, and the rows unlock when their
    /// batch ends.
    ///
    /// # Errors
    /// As [`complete`](Self::complete).
    pub async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        self.settle(leases, Settle::Release).await
    }

    /// Record `failures`, each in its batch's transaction.
    ///
    /// # Errors
    /// As [`complete`](Self::complete).
    pub async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        let leases: Vec<Lease> = failures.iter().map(|f| *f.lease()).collect();
        self.settle(&leases, Settle::Fail(failures)).await
    }

    /// Settle `leases` batch by batch; report per lease.
    async fn settle(&self, leases: &[Lease], how: Settle<'_>) -> Result<Settled> {
        if leases.is_empty() {
            return Ok(Settled::default());
        }
        let mut by_batch: HashMap<LeaseToken, Vec<MessageId>> = HashMap::new();
        for lease in leases {
            by_batch.entry(lease.token).or_default().push(lease.id);
        }
        let mut applied: Vec<MessageId> = Vec::with_capacity(leases.len());
        let mut first_error = None;
        for (token, ids) in by_batch {
            match self.settle_batch(token, ids, &how).await {
                Ok(done) => applied.extend(done),
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        if let Some(err) = first_error {
            return Err(err);
        }
        Ok(Settled::reconcile(leases.iter().map(|l| l.id), applied))
    }

    /// The batch `token` holds, if it is open.
    fn slot(&self, token: LeaseToken) -> Option<Slot<E::Tx>> {
        locked(&self.batches).get(&token).cloned()
    }

    /// Settle `ids` of the batch `token`; the ids applied. Ids the batch does not hold
    /// (settled already, or the batch ended) are not applied: reported lost.
    async fn settle_batch(
        &self,
        token: LeaseToken,
        ids: Vec<MessageId>,
        how: &Settle<'_>,
    ) -> Result<Vec<MessageId>> {
        let Some(slot) = self.slot(token) else {
            return Ok(Vec::new());
        };
        let mut guard = slot.lock().await;
        let Some(batch) = guard.as_mut() else {
            return Ok(Vec::new());
        };
        let mut ids: Vec<MessageId> = ids
            .into_iter()
            .filter(|id| batch.open.contains(id))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let result = match how {
            Settle::Release => Ok(ids.clone()),
            Settle::Complete => self.engine.complete(&mut batch.tx, &ids).await,
            Settle::Fail(failures) => {
                let wanted: HashSet<MessageId> = ids.iter().copied().collect();
                let mut listed: Vec<&Failure> = in_id_order(failures, |f| f.lease().id)
                    .into_iter()
                    .filter(|f| wanted.contains(&f.lease().id))
                    .collect();
                listed.dedup_by_key(|f| f.lease().id);
                self.engine.fail(&mut batch.tx, &listed).await
            }
        };
        let applied = match result {
            Ok(applied) => applied,
            Err(err) => {
                // The transaction is aborted (or its session gone): the batch ends here,
                // rolled back, and its messages are due again.
                self.end_batch(token, guard.take()).await;
                return self.ended(err).map(|()| Vec::new());
            }
        };
        for id in &ids {
            batch.open.remove(id);
        }
        if !batch.open.is_empty() {
            return Ok(applied);
        }
        let Some(batch) = guard.take() else {
            return Ok(Vec::new());
        };
        locked(&self.batches).remove(&token);
        let by_release = matches!(how, Settle::Release);
        match self.engine.finish(batch.tx, by_release).await {
            Ok(next) => {
                locked(&self.ready).push(next);
                Ok(applied)
            }
            Err(err) => self.ended(err).map(|()| Vec::new()),
        }
    }

    /// Forget the batch `token` and roll its transaction back.
    async fn end_batch(&self, token: LeaseToken, batch: Option<Batch<E::Tx>>) {
        locked(&self.batches).remove(&token);
        if let Some(batch) = batch {
            self.engine.abandon(batch.tx).await;
        }
    }

    /// A batch ended by an error: when its session is gone its leases are lost, as
    /// lapsed leases are; other errors are returned.
    fn ended(&self, err: Error) -> Result<()> {
        if self.engine.session_gone(&err) {
            tracing::warn!(error = %err.report(), "held batch lost with its session; its messages are due again");
            Ok(())
        } else {
            Err(err)
        }
    }

    /// Bound each batch's idle time by `lease` again: the leases of open batches are
    /// renewed, the others lost.
    ///
    /// # Errors
    /// An engine error that does not mean the session is gone (that batch ends).
    pub async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        let mut by_batch: HashMap<LeaseToken, Vec<MessageId>> = HashMap::new();
        for l in leases {
            by_batch.entry(l.token).or_default().push(l.id);
        }
        let mut renewed: Vec<(MessageId, SystemTime)> = Vec::with_capacity(leases.len());
        for (token, ids) in by_batch {
            let Some(slot) = self.slot(token) else {
                continue;
            };
            let mut guard = slot.lock().await;
            let Some(batch) = guard.as_mut() else {
                continue;
            };
            match self.engine.renew(&mut batch.tx, lease).await {
                Ok(expires) => renewed.extend(
                    ids.into_iter()
                        .filter(|id| batch.open.contains(id))
                        .map(|id| (id, expires)),
                ),
                Err(err) => {
                    self.end_batch(token, guard.take()).await;
                    self.ended(err)?;
                }
            }
        }
        Ok(Renewed::reconcile(leases, renewed))
    }

    /// Sweep before this claim when none ran yet, or the interval has passed since the
    /// last. A failed sweep is logged; the next due one tries again.
    async fn sweep_if_due(&self) {
        {
            let mut last = locked(&self.last_sweep);
            if last.is_some_and(|at| at.elapsed() < self.sweep_interval) {
                return;
            }
            *last = Some(Instant::now());
        }
        if let Err(err) = self.sweep().await {
            tracing::warn!(error = %err.report(), "sweeping ended held batches failed");
        }
    }

    /// Charge the messages of batches that ended without committing; how many
    /// messages were charged.
    ///
    /// # Errors
    /// The engine's.
    pub async fn sweep(&self) -> Result<u64> {
        let charged = self.engine.sweep().await?;
        if charged > 0 {
            tracing::warn!(
                charged,
                "charged an attempt to messages of held batches whose relay ended without settling them"
            );
        }
        Ok(charged)
    }
}
