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
use crate::bounds::in_id_order;
use crate::error::{Error, Result};
use crate::message::MessageId;
use crate::store::{
    ClaimRequest, Claimed, Failure, Lease, LeaseToken, Renewed, Settled, SettledAndClaimed,
    Settlement,
};

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

    /// Dead-letter claimed rows that cannot be delivered (sorted by id, the kit has
    /// logged them), in `tx`; how many were.
    async fn dead_letter(
        &self,
        tx: &mut Self::Tx,
        poison: Vec<(MessageId, String)>,
    ) -> Result<usize>;

    /// Record the open batch `batch` of `ids`, on another connection, committed before
    /// returning. An engine whose sweep tells live batches by their locks also locks
    /// the record in `tx`, the batch's transaction.
    async fn register(&self, tx: &mut Self::Tx, batch: &str, ids: &[MessageId]) -> Result<()>;

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
            let mut poison = poison;
            poison.sort_by_key(|(id, _)| *id);
            tracing::warn!(
                ?poison,
                "dead-lettering claimed outbox rows that cannot be delivered"
            );
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
        if let Err(err) = self.engine.register(&mut tx, &rows.batch, &listed).await {
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

    /// Settle a batch and claim the next: the settles commit their batches'
    /// transactions, then the claim begins the next, skipping what the settlement named
    /// (a release or a retry at once is due again). The store's
    /// [`settle_and_claim`](crate::OutboxStore::settle_and_claim) in held-lock mode.
    ///
    /// # Errors
    /// The first settle's error; a failed claim is reported in
    /// [`SettledAndClaimed::claimed`].
    pub async fn settle_and_claim(
        &self,
        settlement: Settlement<'_>,
        next: ClaimRequest,
    ) -> Result<SettledAndClaimed> {
        let completed = self.complete(settlement.complete).await?;
        let failed = self.fail(settlement.fail).await?;
        let released = self.release(settlement.release).await?;
        let named = HeldWhich::Excluding(settlement.ids().collect());
        let claimed = self.claim(named, next.limit(), next.lease()).await;
        Ok(SettledAndClaimed {
            completed,
            failed,
            released,
            claimed,
        })
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

#[cfg(test)]
mod tests {
    //! The bookkeeping against a scripted engine: which engine calls each store call
    //! makes, with which transaction. The statements themselves are tested against the
    //! real servers by each backend's suites.

    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::message::Message;
    use crate::message_parts::MessageParts;
    use crate::store::{ClaimedMessage, Disposition};
    use crate::ErrorKind;

    /// A transaction: the connection it runs on.
    #[derive(Debug)]
    struct Tx(usize);

    /// What the next select returns.
    enum Rows {
        Messages(Vec<MessageId>),
        Poison(Vec<MessageId>),
        Fails(Error),
    }

    #[derive(Default)]
    struct Scripted {
        log: Mutex<Vec<String>>,
        selects: Mutex<VecDeque<Rows>>,
        /// Operations that fail once, by name.
        failing: Mutex<HashMap<&'static str, Error>>,
        connections: AtomicUsize,
        sweeps: AtomicUsize,
        /// What each select was asked for.
        asked: Mutex<Vec<HeldWhich>>,
    }

    fn gone() -> Error {
        Error::new(ErrorKind::Unavailable, "the session is gone")
    }

    fn refused() -> Error {
        Error::new(ErrorKind::Storage, "refused")
    }

    fn names(ids: &[MessageId]) -> String {
        let mut ids: Vec<String> = ids
            .iter()
            .map(|id| id.to_string()[..4].to_owned())
            .collect();
        ids.sort();
        ids.join(",")
    }

    impl Scripted {
        fn note(&self, entry: String) {
            locked(&self.log).push(entry);
        }

        fn fails(&self, op: &'static str) -> Result<()> {
            locked(&self.failing).remove(op).map_or(Ok(()), Err)
        }

        fn log(&self) -> Vec<String> {
            std::mem::take(&mut *locked(&self.log))
        }
    }

    fn message(id: MessageId, token: LeaseToken) -> ClaimedMessage {
        let message = Message::from(MessageParts {
            id,
            destination: "d".to_owned(),
            partition_key: None,
            payload: Vec::new(),
            content_type: None,
            headers: crate::Headers::new(),
            created_at: SystemTime::UNIX_EPOCH,
            attempts: 1,
            last_error: None,
        });
        let lease = Lease {
            id,
            token,
            expires_at: SystemTime::UNIX_EPOCH,
        };
        ClaimedMessage { message, lease }
    }

    #[async_trait]
    impl HeldEngine for Arc<Scripted> {
        type Tx = Tx;

        async fn begin(&self) -> Result<Tx> {
            self.fails("begin")?;
            let n = self.connections.fetch_add(1, Ordering::SeqCst) + 1;
            self.note(format!("begin {n}"));
            Ok(Tx(n))
        }

        async fn select(&self, tx: &mut Tx, select: HeldSelect<'_>) -> Result<HeldRows> {
            self.note(format!("select {}", tx.0));
            locked(&self.asked).push(select.which.clone());
            let rows = locked(&self.selects).pop_front();
            let (claimed, poison) = match rows {
                None => (Vec::new(), Vec::new()),
                Some(Rows::Fails(err)) => return Err(err),
                Some(Rows::Messages(ids)) => (
                    ids.into_iter()
                        .map(|id| message(id, select.token))
                        .collect(),
                    Vec::new(),
                ),
                Some(Rows::Poison(ids)) => (
                    Vec::new(),
                    ids.into_iter().map(|id| (id, "bad".to_owned())).collect(),
                ),
            };
            Ok(HeldRows {
                decoded: DecodedClaim { claimed, poison },
                batch: format!("batch {}", tx.0),
            })
        }

        async fn dead_letter(
            &self,
            tx: &mut Tx,
            poison: Vec<(MessageId, String)>,
        ) -> Result<usize> {
            self.fails("dead_letter")?;
            assert!(
                poison.windows(2).all(|w| w[0].0 < w[1].0),
                "poison in id order"
            );
            self.note(format!("dead_letter {} {}", tx.0, poison.len()));
            Ok(poison.len())
        }

        async fn register(&self, _tx: &mut Tx, batch: &str, ids: &[MessageId]) -> Result<()> {
            self.fails("register")?;
            self.note(format!("register {batch} [{}]", names(ids)));
            Ok(())
        }

        async fn complete(&self, tx: &mut Tx, ids: &[MessageId]) -> Result<Vec<MessageId>> {
            self.fails("complete")?;
            self.note(format!("complete {} [{}]", tx.0, names(ids)));
            Ok(ids.to_vec())
        }

        async fn fail(&self, tx: &mut Tx, failures: &[&Failure]) -> Result<Vec<MessageId>> {
            self.fails("fail")?;
            let ids: Vec<MessageId> = failures.iter().map(|f| f.lease().id).collect();
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "one per id, in id order"
            );
            self.note(format!("fail {} [{}]", tx.0, names(&ids)));
            Ok(ids)
        }

        async fn finish(&self, tx: Tx, by_release: bool) -> Result<Tx> {
            if let Err(err) = self.fails("finish") {
                self.abandon(tx).await;
                return Err(err);
            }
            self.note(format!("finish {} by_release={by_release}", tx.0));
            Ok(tx)
        }

        async fn restart(&self, tx: Tx) -> Result<Tx> {
            self.note(format!("restart {}", tx.0));
            Ok(tx)
        }

        async fn abandon(&self, tx: Tx) {
            self.note(format!("abandon {}", tx.0));
        }

        async fn renew(&self, tx: &mut Tx, _lease: Duration) -> Result<SystemTime> {
            self.fails("renew")?;
            self.note(format!("renew {}", tx.0));
            Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(60))
        }

        async fn sweep(&self) -> Result<u64> {
            self.sweeps.fetch_add(1, Ordering::SeqCst);
            self.fails("sweep")?;
            Ok(2)
        }

        fn session_gone(&self, err: &Error) -> bool {
            err.kind() == ErrorKind::Unavailable
        }
    }

    fn held(interval: Duration) -> (HeldBatches<Arc<Scripted>>, Arc<Scripted>) {
        let engine = Arc::new(Scripted::default());
        (HeldBatches::new(Arc::clone(&engine), interval), engine)
    }

    fn ids(n: usize) -> Vec<MessageId> {
        let mut ids: Vec<MessageId> = (0..n).map(|_| MessageId::new()).collect();
        ids.sort();
        ids
    }

    async fn claim(held: &HeldBatches<Arc<Scripted>>) -> Vec<ClaimedMessage> {
        held.claim(HeldWhich::Due, 10, Duration::from_secs(30))
            .await
            .unwrap()
            .into_messages()
    }

    fn leases(claimed: &[ClaimedMessage]) -> Vec<Lease> {
        claimed.iter().map(|c| c.lease).collect()
    }

    #[tokio::test]
    async fn an_empty_claim_restarts_its_transaction_and_keeps_it_ready() {
        let (held, engine) = held(Duration::ZERO);
        assert!(claim(&held).await.is_empty());
        assert!(claim(&held).await.is_empty());
        assert_eq!(
            engine.log(),
            ["begin 1", "select 1", "restart 1", "select 1", "restart 1"]
        );
        assert_eq!(
            engine.sweeps.load(Ordering::SeqCst),
            2,
            "interval zero: every claim"
        );
    }

    #[tokio::test]
    async fn settle_and_claim_settles_then_claims_past_what_it_settled() {
        let (held, engine) = held(Duration::from_secs(3600));
        let listed = ids(3);
        locked(&engine.selects).push_back(Rows::Messages(listed.clone()));
        let first = leases(&claim(&held).await);
        let failure = Failure::new(
            first[1],
            "x",
            Disposition::Retry {
                after: Duration::ZERO,
            },
        );
        let next = ids(2);
        locked(&engine.selects).push_back(Rows::Messages(next.clone()));
        engine.log();
        let settlement = Settlement {
            complete: &first[..1],
            fail: std::slice::from_ref(&failure),
            release: &first[2..],
        };
        let request = ClaimRequest::new(10, Duration::from_secs(30)).unwrap();
        let out = held.settle_and_claim(settlement, request).await.unwrap();
        let applied = (
            out.completed.applied,
            out.failed.applied,
            out.released.applied,
        );
        assert_eq!(applied, (1, 1, 1));
        let claimed = out.claimed.unwrap().into_messages();
        let got: Vec<MessageId> = claimed.iter().map(|c| c.message.id).collect();
        assert_eq!(got, next);
        assert_eq!(
            locked(&engine.asked).last(),
            Some(&HeldWhich::Excluding(listed.clone())),
            "the claim skips every id the settlement named (a release is due again)"
        );
        assert_eq!(
            engine.log(),
            [
                format!("complete 1 [{}]", names(&listed[..1])),
                format!("fail 1 [{}]", names(&listed[1..2])),
                "finish 1 by_release=true".to_owned(),
                "select 1".to_owned(),
                format!("register batch 1 [{}]", names(&next)),
            ]
        );

        // A settle that fails ends the call before any claim.
        let second = leases(&claimed);
        locked(&engine.failing).insert("complete", refused());
        engine.log();
        let settlement = Settlement {
            complete: &second,
            ..Settlement::default()
        };
        let request = ClaimRequest::new(10, Duration::from_secs(30)).unwrap();
        let err = held
            .settle_and_claim(settlement, request)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Storage);
        assert!(
            !engine.log().iter().any(|entry| entry.starts_with("select")),
            "no claim after a failed settle"
        );
    }

    #[tokio::test]
    async fn a_batch_registers_settles_in_its_transaction_and_commits_with_its_last_lease() {
        let (held, engine) = held(Duration::from_secs(3600));
        let listed = ids(3);
        locked(&engine.selects).push_back(Rows::Messages(listed.clone()));
        let got = claim(&held).await;
        assert_eq!(got.len(), 3);
        assert_eq!(held.open_batches(), 1);
        let leases = leases(&got);
        let first = held.complete(&leases[..1]).await.unwrap();
        assert_eq!((first.applied, first.lost.len()), (1, 0));
        let again = held.complete(&leases[..1]).await.unwrap();
        assert_eq!(again.lost, vec![leases[0].id], "settled already: lost");
        assert_eq!(held.open_batches(), 1);
        let failure = Failure::new(
            leases[1],
            "x",
            Disposition::Retry {
                after: Duration::ZERO,
            },
        );
        let failed = held.fail(&[failure.clone(), failure]).await.unwrap();
        assert_eq!(failed.applied, 1);
        let released = held.release(&leases[2..]).await.unwrap();
        assert_eq!(released.applied, 1);
        assert_eq!(held.open_batches(), 0);
        let n = |i: usize| names(&listed[i..=i]);
        assert_eq!(
            engine.log(),
            [
                "begin 1".to_owned(),
                "select 1".to_owned(),
                format!("register batch 1 [{}]", names(&listed)),
                format!("complete 1 [{}]", n(0)),
                format!("fail 1 [{}]", n(1)),
                "finish 1 by_release=true".to_owned(),
            ]
        );
        assert_eq!(
            engine.sweeps.load(Ordering::SeqCst),
            1,
            "only the first claim sweeps"
        );
        // The committed connection's next transaction serves the next claim.
        assert!(claim(&held).await.is_empty());
        assert_eq!(engine.log(), ["select 1", "restart 1"]);
    }

    #[tokio::test]
    async fn a_batch_ended_by_a_complete_commits_without_a_release() {
        let (held, engine) = held(Duration::ZERO);
        locked(&engine.selects).push_back(Rows::Messages(ids(2)));
        let got = claim(&held).await;
        held.complete(&leases(&got))
            .await
            .unwrap()
            .into_result()
            .unwrap();
        assert_eq!(engine.log().last().unwrap(), "finish 1 by_release=false");
        assert!(held.complete(&[]).await.unwrap().lost.is_empty());
    }

    #[tokio::test]
    async fn a_refused_settle_ends_the_batch_rolled_back_and_is_returned() {
        let (held, engine) = held(Duration::ZERO);
        locked(&engine.selects).push_back(Rows::Messages(ids(2)));
        let got = claim(&held).await;
        locked(&engine.failing).insert("complete", refused());
        let err = held.complete(&leases(&got)[..1]).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Storage);
        assert_eq!(held.open_batches(), 0);
        assert_eq!(engine.log().last().unwrap(), "abandon 1");
        let lost = held.complete(&leases(&got)[1..]).await.unwrap();
        assert_eq!(lost.lost.len(), 1, "the batch is gone");
        assert!(engine.log().is_empty(), "nothing ran for it");
    }

    #[tokio::test]
    async fn a_batch_whose_session_is_gone_loses_its_leases() {
        let (held, engine) = held(Duration::ZERO);
        locked(&engine.selects).push_back(Rows::Messages(ids(1)));
        let got = claim(&held).await;
        locked(&engine.failing).insert("fail", gone());
        let failure = Failure::new(got[0].lease, "x", Disposition::DeadLetter);
        let settled = held.fail(&[failure]).await.unwrap();
        assert_eq!(settled.lost, vec![got[0].lease.id]);
        assert_eq!(engine.log().last().unwrap(), "abandon 1");
        // A commit that finds the session gone loses the leases too.
        locked(&engine.selects).push_back(Rows::Messages(ids(1)));
        let got = claim(&held).await;
        locked(&engine.failing).insert("finish", gone());
        let settled = held.release(&leases(&got)).await.unwrap();
        assert_eq!(settled.lost.len(), 1);
        assert_eq!(held.open_batches(), 0);
        locked(&engine.selects).push_back(Rows::Messages(ids(1)));
        let got = claim(&held).await;
        locked(&engine.failing).insert("finish", refused());
        assert!(held.release(&leases(&got)).await.is_err());
    }

    #[tokio::test]
    async fn a_claim_that_fails_after_locking_rolls_back_at_once() {
        let (held, engine) = held(Duration::ZERO);
        locked(&engine.selects).push_back(Rows::Messages(ids(2)));
        locked(&engine.failing).insert("register", refused());
        assert!(held
            .claim(HeldWhich::Due, 10, Duration::from_secs(1))
            .await
            .is_err());
        assert_eq!(engine.log(), ["begin 1", "select 1", "abandon 1"]);
        assert_eq!(held.open_batches(), 0);
        locked(&engine.selects).push_back(Rows::Fails(refused()));
        assert!(held
            .claim(HeldWhich::Due, 10, Duration::from_secs(1))
            .await
            .is_err());
        assert_eq!(engine.log(), ["begin 2", "select 2", "abandon 2"]);
        locked(&engine.selects).push_back(Rows::Poison(ids(1)));
        locked(&engine.failing).insert("dead_letter", refused());
        assert!(held
            .claim(HeldWhich::Due, 10, Duration::from_secs(1))
            .await
            .is_err());
        assert_eq!(engine.log(), ["begin 3", "select 3", "abandon 3"]);
    }

    #[tokio::test]
    async fn poison_alone_is_dead_lettered_and_committed() {
        let (held, engine) = held(Duration::ZERO);
        // Out of order: the kit hands them to the engine sorted.
        let mut poison = ids(2);
        poison.reverse();
        locked(&engine.selects).push_back(Rows::Poison(poison));
        let claimed = held
            .claim(HeldWhich::Due, 10, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!((claimed.messages.len(), claimed.dead_lettered), (0, 2));
        assert_eq!(
            engine.log(),
            [
                "begin 1",
                "select 1",
                "dead_letter 1 2",
                "finish 1 by_release=true"
            ]
        );
        assert!(claim(&held).await.is_empty());
        assert_eq!(
            engine.log(),
            ["select 1", "restart 1"],
            "its connection is ready"
        );
    }

    #[tokio::test]
    async fn a_ready_transaction_whose_session_ended_is_replaced_once() {
        let (held, engine) = held(Duration::ZERO);
        assert!(claim(&held).await.is_empty());
        engine.log();
        locked(&engine.selects).push_back(Rows::Fails(gone()));
        assert!(claim(&held).await.is_empty());
        assert_eq!(
            engine.log(),
            ["select 1", "abandon 1", "begin 2", "select 2", "restart 2"]
        );
        // A new transaction's session ending is an error, not retried.
        let (fresh, engine) = held_pair();
        locked(&engine.selects).push_back(Rows::Fails(gone()));
        assert!(fresh
            .claim(HeldWhich::Due, 1, Duration::from_secs(1))
            .await
            .is_err());
    }

    fn held_pair() -> (HeldBatches<Arc<Scripted>>, Arc<Scripted>) {
        held(Duration::ZERO)
    }

    #[tokio::test]
    async fn renew_extends_open_leases_and_reports_the_others_lost() {
        let (held, engine) = held(Duration::ZERO);
        locked(&engine.selects).push_back(Rows::Messages(ids(2)));
        let got = claim(&held).await;
        let mut leases = leases(&got);
        held.complete(&leases[..1])
            .await
            .unwrap()
            .into_result()
            .unwrap();
        leases.push(Lease {
            id: MessageId::new(),
            token: LeaseToken::new(),
            ..leases[1]
        });
        let renewed = held.renew(&leases, Duration::from_secs(5)).await.unwrap();
        assert_eq!(renewed.leases.len(), 1);
        assert_eq!(
            renewed.leases[0].expires_at,
            SystemTime::UNIX_EPOCH + Duration::from_secs(60)
        );
        assert_eq!(
            renewed.lost.len(),
            2,
            "the settled one and the unknown batch's"
        );
        locked(&engine.failing).insert("renew", refused());
        assert!(held
            .renew(&leases[1..2], Duration::from_secs(5))
            .await
            .is_err());
        assert_eq!(held.open_batches(), 0);
        assert_eq!(engine.log().last().unwrap(), "abandon 1");
        let after = held
            .renew(&leases[1..2], Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(after.lost.len(), 1);
    }

    #[tokio::test]
    async fn sweeps_keep_their_interval_and_a_failed_sweep_does_not_fail_the_claim() {
        let (held, engine) = held(Duration::from_secs(3600));
        locked(&engine.failing).insert("sweep", refused());
        assert!(claim(&held).await.is_empty());
        assert!(claim(&held).await.is_empty());
        assert_eq!(engine.sweeps.load(Ordering::SeqCst), 1);
        assert_eq!(held.sweep().await.unwrap(), 2);
        assert!(format!("{held:?}").contains("open_batches: 0"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_is_due_once_the_whole_interval_has_passed() {
        let (held, engine) = held(Duration::from_secs(10));
        assert!(claim(&held).await.is_empty());
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(claim(&held).await.is_empty());
        assert_eq!(engine.sweeps.load(Ordering::SeqCst), 1);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(claim(&held).await.is_empty());
        assert_eq!(engine.sweeps.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn settles_spanning_batches_run_in_each_batch() {
        let (held, engine) = held(Duration::ZERO);
        locked(&engine.selects).push_back(Rows::Messages(ids(1)));
        locked(&engine.selects).push_back(Rows::Messages(ids(1)));
        let a = claim(&held).await;
        let b = claim(&held).await;
        assert_eq!(held.open_batches(), 2);
        engine.log();
        let both = [a[0].lease, b[0].lease];
        held.complete(&both).await.unwrap().into_result().unwrap();
        let mut log = engine.log();
        log.sort();
        assert_eq!(log.len(), 4, "{log:?}");
        assert!(log.iter().any(|l| l.starts_with("complete 1")));
        assert!(log.iter().any(|l| l.starts_with("complete 2")));
        assert!(held.engine().connections.load(Ordering::SeqCst) == 2);
    }
}
