//! Held-lock claims ([`ClaimMode::HeldLock`](outbox_core::ClaimMode::HeldLock)): the row
//! lock is the lease.
//!
//! # Protocol
//!
//! 1. A claim takes a connection of the held pool, begins a transaction and selects the
//!    due rows `FOR UPDATE SKIP LOCKED` (per-key heads included), writing nothing to
//!    them. The same statement sets the transaction's
//!    `idle_in_transaction_session_timeout` to the lease, so a relay that hangs between
//!    statements for longer than its lease has its session ended by the server, which
//!    releases the rows.
//! 2. Poison rows are dead-lettered in that transaction. If the claimed rows cannot be
//!    read at all, the transaction rolls back.
//! 3. The batch is **registered**: one row of `<table>_held`, keyed by the claim's
//!    transaction id and listing the message ids, inserted on another connection and
//!    committed before the claim returns, so before anything is published.
//! 4. Settles (complete, fail, release) run in the claim's transaction, each one
//!    statement reaching rows by primary key (releases write nothing). Each also deletes
//!    the registry row; the settle that leaves no lease of the batch open commits, and
//!    the connection goes back to the pool.
//! 5. A batch that never commits (the relay died, its session was ended, the commit
//!    failed) rolls back as a whole: its messages are due again at once, with no attempt
//!    written. Its registry row stays, naming a transaction the server reports aborted.
//!    A **sweep** charges each of those messages one attempt and deletes the row; a
//!    message locked by a live claim at that moment is left in the row for a later
//!    sweep. A store sweeps before its first claim and then before a claim at most
//!    every sweep interval. So every batch that ended without an outcome costs its
//!    messages one attempt, as a lapsed lease does, and the relay dead-letters a message
//!    claimed past its last attempt without publishing it.
//!
//! Cost per batch: `BEGIN`, the claim, the registry insert (another connection), a
//! settle statement per publish call and `COMMIT`. Nothing per message beyond what the
//! settle itself writes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use outbox_core::backend::{bounded_error, in_id_order};
use outbox_core::message::MAX_DELAY;
use outbox_core::{
    Claimed, Disposition, Error, Failure, Lease, LeaseToken, MessageId, MessageLimits, Renewed,
    Result, Settled,
};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::from_sqlx;
use crate::held_sql::HeldStatements;
use crate::row::{decode_claimed, get};
use crate::sql::{limit_param, micros};

/// The open batches of one store and the connections holding them.
pub(crate) struct HeldClaims {
    /// The held transactions' connections.
    pool: PgPool,
    sql: HeldStatements,
    batches: Mutex<HashMap<LeaseToken, Arc<tokio::sync::Mutex<Option<Batch>>>>>,
    /// Transactions begun and not yet used: the commit that ends a batch begins the
    /// next transaction in the same round trip, and a claim that finds nothing leaves
    /// its transaction here untouched (it locked nothing, holds no snapshot and no
    /// transaction id).
    ready: Mutex<Vec<Transaction<'static, Postgres>>>,
    sweep_interval: Duration,
    /// When the last sweep started (`None` before the first claim).
    last_sweep: Mutex<Option<Instant>>,
}

/// One claimed batch: its transaction and the ids not yet settled.
struct Batch {
    tx: Transaction<'static, Postgres>,
    open: HashSet<Uuid>,
}

/// Which due rows a claim takes.
pub(crate) enum Which {
    /// Any.
    Due,
    /// Only these.
    Ids(Vec<Uuid>),
    /// Any but these (what the settle before it named).
    Excluding(Vec<Uuid>),
}

/// A claim's select and its parameters.
struct Select<'a> {
    sql: &'a str,
    limit: i64,
    lease_us: i64,
    ids: Option<&'a [Uuid]>,
}

impl Select<'_> {
    async fn run(&self, conn: &mut PgConnection) -> std::result::Result<Vec<PgRow>, sqlx::Error> {
        let mut query = sqlx::query(self.sql).bind(self.limit).bind(self.lease_us);
        if let Some(ids) = self.ids {
            query = query.bind(ids);
        }
        query.fetch_all(conn).await
    }
}

/// What a settle runs for its leases of one batch.
enum Settle<'a> {
    Complete,
    Fail(&'a [Failure]),
    Release,
}

impl HeldClaims {
    pub(crate) fn new(pool: PgPool, sql: HeldStatements, sweep_interval: Duration) -> Self {
        HeldClaims {
            pool,
            sql,
            batches: Mutex::default(),
            ready: Mutex::default(),
            sweep_interval,
            last_sweep: Mutex::new(None),
        }
    }

    /// The held transactions' pool.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The statistics statement that counts held messages as in flight.
    pub(crate) fn stats_sql(&self) -> &str {
        &self.sql.stats
    }

    /// How many batches are open.
    pub(crate) fn open_batches(&self) -> usize {
        self.lock_batches().len()
    }

    fn lock_batches(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<LeaseToken, Arc<tokio::sync::Mutex<Option<Batch>>>>>
    {
        self.batches.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claim up to `limit` due messages (`which` of them), holding them until their
    /// batch is settled.
    pub(crate) async fn claim(
        &self,
        registry: &PgPool,
        limits: &MessageLimits,
        limit: usize,
        lease: Duration,
        which: Which,
    ) -> Result<Claimed> {
        self.sweep_if_due(registry).await;
        let token = LeaseToken::new();
        let lease_us = micros("lease", lease)?;
        let (sql, ids) = match which {
            Which::Due => (&self.sql.claim, None),
            Which::Ids(ids) => (&self.sql.claim_ids, Some(ids)),
            Which::Excluding(ids) => (&self.sql.claim_excluding, Some(ids)),
        };
        let select = Select {
            sql,
            limit: limit_param(limit),
            lease_us,
            ids: ids.as_deref(),
        };
        let mut ready = self.take_ready();
        let (mut tx, rows) = loop {
            let reused = ready.is_some();
            let mut tx = match ready.take() {
                Some(tx) => tx,
                None => self
                    .pool
                    .begin()
                    .await
                    .map_err(|e| from_sqlx("claim (begin)", e))?,
            };
            let result = select.run(&mut tx).await;
            match result {
                Ok(rows) => break (tx, rows),
                // A transaction kept ready may have lost its session meanwhile (a server
                // that ends idle transactions, a restart): claim on a new one.
                Err(err) if reused && sqlx_session_gone(&err) => drop(tx),
                Err(err) => return Err(from_sqlx("claim", err)),
            }
        };
        if rows.is_empty() {
            // It locked nothing and holds no snapshot: keep it for the next claim.
            self.keep_ready(tx);
            return Ok(Claimed::default());
        }
        // An error from here on drops `tx`, which rolls the claim back.
        let decoded = decode_claimed(&rows, token, limits)?;
        let xid: String = get(&rows[0], "held_xid")?;
        let dead_lettered = if decoded.poison.is_empty() {
            0
        } else {
            self.dead_letter(&mut tx, decoded.poison).await?
        };
        if decoded.claimed.is_empty() {
            self.commit_and_begin(tx).await?;
            return Ok(Claimed::default().with_dead_lettered(dead_lettered));
        }
        let open: HashSet<Uuid> = decoded
            .claimed
            .iter()
            .map(|c| c.message.id.as_uuid())
            .collect();
        let listed: Vec<Uuid> = open.iter().copied().collect();
        sqlx::query(&self.sql.register)
            .bind(xid)
            .bind(listed)
            .execute(registry)
            .await
            .map_err(|e| from_sqlx("claim (registering the batch)", e))?;
        self.lock_batches().insert(
            token,
            Arc::new(tokio::sync::Mutex::new(Some(Batch { tx, open }))),
        );
        Ok(Claimed::new(decoded.claimed).with_dead_lettered(dead_lettered))
    }

    fn take_ready(&self) -> Option<Transaction<'static, Postgres>> {
        self.ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
    }

    fn keep_ready(&self, tx: Transaction<'static, Postgres>) {
        self.ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tx);
    }

    async fn dead_letter(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        poison: Vec<(Uuid, String)>,
    ) -> Result<usize> {
        let mut poison = poison;
        poison.sort_by_key(|(id, _)| *id);
        tracing::warn!(
            ?poison,
            "dead-lettering claimed outbox rows that cannot be delivered"
        );
        let (ids, reasons): (Vec<Uuid>, Vec<String>) = poison
            .into_iter()
            .map(|(id, reason)| (id, crate::store::storable(bounded_error(reason))))
            .unzip();
        let done: Vec<Uuid> = sqlx::query_scalar(&self.sql.dead_letter)
            .bind(ids)
            .bind(reasons)
            .fetch_all(&mut **tx)
            .await
            .map_err(|e| from_sqlx("dead-lettering undeliverable rows", e))?;
        Ok(done.len())
    }

    pub(crate) async fn complete(&self, leases: &[Lease]) -> Result<Settled> {
        self.settle(leases, Settle::Complete).await
    }

    pub(crate) async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        self.settle(leases, Settle::Release).await
    }

    pub(crate) async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        let leases: Vec<Lease> = failures.iter().map(|f| *f.lease()).collect();
        self.settle(&leases, Settle::Fail(failures)).await
    }

    /// Settle `leases` batch by batch, in the batches' transactions; report per lease.
    async fn settle(&self, leases: &[Lease], how: Settle<'_>) -> Result<Settled> {
        if leases.is_empty() {
            return Ok(Settled::default());
        }
        let mut by_batch: HashMap<LeaseToken, Vec<Uuid>> = HashMap::new();
        for lease in leases {
            by_batch
                .entry(lease.token)
                .or_default()
                .push(lease.id.as_uuid());
        }
        let mut applied: Vec<MessageId> = Vec::with_capacity(leases.len());
        let mut first_error = None;
        for (token, ids) in by_batch {
            match self.settle_batch(token, ids, &how).await {
                Ok(done) => applied.extend(done.into_iter().map(MessageId::from_uuid)),
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

    /// Settle `ids` of the batch `token`; the ids applied. Ids the batch does not hold
    /// (settled already, or the batch ended) are not applied: reported lost.
    async fn settle_batch(
        &self,
        token: LeaseToken,
        ids: Vec<Uuid>,
        how: &Settle<'_>,
    ) -> Result<Vec<Uuid>> {
        let Some(slot) = self.lock_batches().get(&token).cloned() else {
            return Ok(Vec::new());
        };
        let mut guard = slot.lock().await;
        let Some(batch) = guard.as_mut() else {
            return Ok(Vec::new());
        };
        let mut ids: Vec<Uuid> = ids
            .into_iter()
            .filter(|id| batch.open.contains(id))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let result = match how {
            Settle::Release => Ok(ids.clone()),
            Settle::Complete => sqlx::query_scalar(&self.sql.complete)
                .bind(&ids)
                .fetch_all(&mut *batch.tx)
                .await
                .map_err(|e| from_sqlx("complete", e)),
            Settle::Fail(failures) => self.run_fail(batch, &ids, failures).await,
        };
        let applied = match result {
            Ok(applied) => applied,
            Err(err) => {
                // The transaction is aborted (or its session gone): the batch ends here,
                // rolled back when dropped, and its messages are due again.
                *guard = None;
                self.lock_batches().remove(&token);
                return self.ended(err);
            }
        };
        for id in &ids {
            batch.open.remove(id);
        }
        if !batch.open.is_empty() {
            return Ok(applied);
        }
        let Some(mut batch) = guard.take() else {
            return Ok(Vec::new());
        };
        self.lock_batches().remove(&token);
        if matches!(how, Settle::Release) {
            // No statement ran for this settle: end the registry row before committing.
            if let Err(err) = sqlx::query(&self.sql.unregister)
                .execute(&mut *batch.tx)
                .await
            {
                return self.ended(from_sqlx("release", err));
            }
        }
        match self.commit_and_begin(batch.tx).await {
            Ok(()) => Ok(applied),
            Err(err) => self.ended(err),
        }
    }

    /// Commit `tx` and begin the next transaction on its connection in one round trip,
    /// keeping it ready for a claim.
    async fn commit_and_begin(&self, mut tx: Transaction<'static, Postgres>) -> Result<()> {
        let conn: &mut PgConnection = &mut tx;
        sqlx::Executor::execute(conn, "COMMIT; BEGIN")
            .await
            .map_err(|e| from_sqlx("settle (commit)", e))?;
        self.keep_ready(tx);
        Ok(())
    }

    /// A batch ended by an error: when its session is gone (the server ended it, the
    /// connection broke) its leases are lost, as lapsed leases are; other errors are
    /// returned.
    fn ended(&self, err: Error) -> Result<Vec<Uuid>> {
        if session_gone(&err) {
            tracing::warn!(error = %err.report(), "held batch lost with its session; its messages are due again");
            Ok(Vec::new())
        } else {
            Err(err)
        }
    }

    async fn run_fail(
        &self,
        batch: &mut Batch,
        ids: &[Uuid],
        failures: &[Failure],
    ) -> Result<Vec<Uuid>> {
        let wanted: HashSet<Uuid> = ids.iter().copied().collect();
        let ordered = in_id_order(failures, |f| f.lease().id);
        let mut fail_ids = Vec::with_capacity(ids.len());
        let mut errors = Vec::with_capacity(ids.len());
        let mut dead = Vec::with_capacity(ids.len());
        let mut retry_us = Vec::with_capacity(ids.len());
        for failure in ordered {
            let id = failure.lease().id.as_uuid();
            if !wanted.contains(&id) || fail_ids.last() == Some(&id) {
                continue;
            }
            let (is_dead, after) = match failure.disposition() {
                Disposition::Retry { after } => (false, after.min(MAX_DELAY)),
                Disposition::DeadLetter => (true, Duration::ZERO),
            };
            fail_ids.push(id);
            errors.push(crate::store::storable(failure.error().to_owned()));
            dead.push(is_dead);
            retry_us.push(micros("retry delay", after)?);
        }
        sqlx::query_scalar(&self.sql.fail)
            .bind(fail_ids)
            .bind(errors)
            .bind(dead)
            .bind(retry_us)
            .fetch_all(&mut *batch.tx)
            .await
            .map_err(|e| from_sqlx("fail", e))
    }

    /// Arm each batch's idle timeout again for `lease`: the leases of open batches are
    /// renewed, the others lost.
    pub(crate) async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        let lease_us = micros("lease", lease)?;
        let mut by_batch: HashMap<LeaseToken, Vec<MessageId>> = HashMap::new();
        for l in leases {
            by_batch.entry(l.token).or_default().push(l.id);
        }
        let mut renewed: Vec<(MessageId, SystemTime)> = Vec::with_capacity(leases.len());
        for (token, ids) in by_batch {
            let Some(slot) = self.lock_batches().get(&token).cloned() else {
                continue;
            };
            let mut guard = slot.lock().await;
            let Some(batch) = guard.as_mut() else {
                continue;
            };
            let row: std::result::Result<PgRow, _> = sqlx::query(&self.sql.renew)
                .bind(lease_us)
                .fetch_one(&mut *batch.tx)
                .await;
            let expires: chrono::DateTime<chrono::Utc> = match row {
                Ok(row) => get(&row, "expires_at")?,
                Err(err) => {
                    *guard = None;
                    self.lock_batches().remove(&token);
                    self.ended(from_sqlx("renew", err))?;
                    continue;
                }
            };
            renewed.extend(
                ids.into_iter()
                    .filter(|id| batch.open.contains(&id.as_uuid()))
                    .map(|id| (id, SystemTime::from(expires))),
            );
        }
        Ok(Renewed::reconcile(leases, renewed))
    }

    /// Sweep before this claim when none ran yet, or the interval has passed since the
    /// last. A failed sweep is logged; the next due one tries again.
    async fn sweep_if_due(&self, registry: &PgPool) {
        {
            let mut last = self
                .last_sweep
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < self.sweep_interval) {
                return;
            }
            *last = Some(Instant::now());
        }
        if let Err(err) = self.sweep(registry).await {
            tracing::warn!(error = %err.report(), "sweeping ended held batches failed");
        }
    }

    /// Charge the messages of batches whose transaction ended without committing; how
    /// many messages were charged.
    pub(crate) async fn sweep(&self, registry: &PgPool) -> Result<u64> {
        let mut charged_total = 0u64;
        // One batch per statement; a batch left with locked messages waits for a later
        // sweep, and so does whatever lies past it.
        for _ in 0..MAX_SWEPT_BATCHES {
            let row = sqlx::query(&self.sql.sweep)
                .fetch_one(registry)
                .await
                .map_err(|e| from_sqlx("sweep", e))?;
            let gone: i64 = get(&row, "gone")?;
            let charged: i64 = get(&row, "charged")?;
            let kept: i64 = get(&row, "kept")?;
            charged_total += u64::try_from(charged).unwrap_or(0);
            if charged > 0 {
                tracing::warn!(
                    charged,
                    "charged an attempt to messages of a held batch whose relay ended without settling it"
                );
            }
            if gone == 0 || kept > 0 {
                break;
            }
        }
        Ok(charged_total)
    }
}

/// The most ended batches one sweep charges.
const MAX_SWEPT_BATCHES: usize = 64;

/// Whether `err` means the held transaction's session is gone: the connection broke, or
/// the server ended the session (idle-in-transaction timeout, administrator command).
fn session_gone(err: &Error) -> bool {
    use std::error::Error as _;
    let mut source = err.source();
    while let Some(cause) = source {
        if let Some(sqlx_err) = cause.downcast_ref::<sqlx::Error>() {
            return sqlx_session_gone(sqlx_err);
        }
        source = cause.source();
    }
    false
}

/// [`session_gone`] for the driver's error.
fn sqlx_session_gone(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || code.starts_with("57P") || code == "25P03"
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database(code: &'static str) -> Error {
        #[derive(Debug)]
        struct Db(&'static str);
        impl std::fmt::Display for Db {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "db error {}", self.0)
            }
        }
        impl std::error::Error for Db {}
        impl sqlx::error::DatabaseError for Db {
            fn message(&self) -> &str {
                "db error"
            }
            fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
                Some(self.0.into())
            }
            fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
                self
            }
            fn kind(&self) -> sqlx::error::ErrorKind {
                sqlx::error::ErrorKind::Other
            }
        }
        from_sqlx("settle", sqlx::Error::Database(Box::new(Db(code))))
    }

    #[test]
    fn a_session_ended_by_the_server_or_the_network_is_gone() {
        for code in ["25P03", "57P01", "08006"] {
            assert!(session_gone(&database(code)), "{code}");
        }
        let io = from_sqlx(
            "settle",
            sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
        );
        assert!(session_gone(&io));
        for code in ["40P01", "23505", "25P02"] {
            assert!(!session_gone(&database(code)), "{code}");
        }
    }
}
