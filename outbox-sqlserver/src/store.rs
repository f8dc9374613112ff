//! [`MssqlOutbox`]: enqueue in the caller's transaction, and the [`OutboxStore`]
//! relays claim from.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::io::{AsyncRead, AsyncWrite};
use tiberius::{Client, Row};
use uuid::Uuid;

use outbox_core::backend::{check_enqueue, in_id_order};
use outbox_core::backend::{finish_claim, release_claim, CommittedClaim, DecodedClaim};
use outbox_core::message::MAX_DELAY;
use outbox_core::{
    store::ClaimIds, store::ClaimRequest, store::Claimed, store::Disposition, store::Failure,
    store::Lease, store::LeaseToken, store::Settled, store::StoreCapabilities, Error, MessageId,
    NewMessage, OutboxStore, Result, Retention,
};

use crate::claim;
use crate::config::MssqlOutboxConfig;
use crate::error::{from_pool, from_tiberius};
use crate::exec::{execute, query_rows, row_id, session_rows};
use crate::ident::QualifiedName;
use crate::row::decode_claimed;
use crate::schema;
use crate::session::{dedicated, MssqlManager, MssqlPool};
use crate::sql::{
    self, chunk_rows, micros, FailRow, NewRow, Settle, Stmt, CLAIM_BATCH, ESCALATING_BATCH,
};

/// A SQL Server outbox: enqueue with [`enqueue`](Self::enqueue) inside your
/// transaction, hand the store to a [`Relay`](outbox_core::Relay) to publish, and to
/// operators as an [`OutboxAdmin`](outbox_core::OutboxAdmin).
///
/// Cheap to clone (a pool handle and shared settings).
///
/// # The claim protocol on SQL Server
///
/// 1. One statement, in autocommit at READ COMMITTED, takes up to `n` due rows oldest
///    first (`ORDER BY available_at, seq`) and stamps them: `available_at =
///    SYSUTCDATETIME() + lease`, a fresh `lease_token`, `attempts + 1` (saturating at
///    [`MAX_ATTEMPTS`](outbox_core::store::MAX_ATTEMPTS)); `OUTPUT INSERTED.<columns>,
///    DELETED.available_at` returns them. Rows are locked `WITH (UPDLOCK, READPAST,
///    ROWLOCK)`: update locks so two claimers never take one row, `READPAST` so rows
///    another transaction holds are skipped instead of waited on, row granularity so
///    nothing else is locked. Every read is pinned to its index (`INDEX(..),
///    FORCESEEK`), so no plan can scan the table and lock what it passes. The locks end
///    with the statement; the lease lives on in the row. Never `SERIALIZABLE` or
///    `HOLDLOCK`: key-range locks would block unrelated enqueues. A claim of more than
///    2,000 rows is sent as several statements sharing one token. The statement's
///    shapes (one pass unordered; per key, heads picked without update locks, then only
///    the heads locked; ids as one `OPENJSON` array) are described in the crate docs,
///    "Claims, settles and `READ_COMMITTED_SNAPSHOT`".
/// 2. Rows that do not make a deliverable message are dead-lettered at once, fenced by
///    the claim's token; the others are returned. If rows cannot be read at all (a
///    column of another type), the claim releases every row it took (attempt undone)
///    before returning the error.
/// 3. The relay publishes outside any transaction.
/// 4. Complete, fail and release join the bound `(id, token)` rows (sorted by id, so
///    concurrent batches lock shared rows in one order) to the table on the primary
///    key, fenced by token and "undelivered" (written `COALESCE(dispatched_at,
///    dead_at) IS NULL` so no filtered index applies), and `OUTPUT` the ids applied;
///    the rest are reported lost.
/// 5. A crashed relay's rows become due when `available_at` (the lease expiry) passes.
///
/// With [`KeyOrder::PerKey`](outbox_core::KeyOrder::PerKey) a keyed row is claimable
/// only when its `seq` is the lowest among the undelivered rows of its key (one probe
/// of the `<table>_key` filtered index); dead letters do not block their key.
///
/// # `READ_COMMITTED_SNAPSHOT` on or off
///
/// The claim behaves the same under both, because none of its reads is a row-versioned
/// read:
///
/// - The rows a claim takes are read with `UPDLOCK`, a locking read whatever
///   `READ_COMMITTED_SNAPSHOT` says, so `READPAST` applies and no row version is used to
///   pick rows: two claimers can never both take a row. (Queues built on the same hints,
///   such as Hangfire's and NServiceBus's SQL transports, run on Azure SQL Database,
///   where the option is on by default.)
/// - A per-key claim's first pass and its head probe read with `READCOMMITTEDLOCK`: the
///   probe sees (and waits for) an uncommitted earlier row of a candidate's key once its
///   `<table>_key` entry exists, so a later row of that key does not go out first, with
///   the option on as with it off. The wait is bounded by the pool's `LOCK_TIMEOUT`
///   (error 1222, retryable). Two transactions enqueueing one key concurrently are the
///   exception: a row's `seq` is assigned before its `<table>_key` entry is written, so
///   a later row can commit while the earlier one is not yet in that index (see the
///   limitations).
/// - Settles and admin statements find rows by primary key or take update locks, so
///   they read current data in both modes; `stats` reads with `READCOMMITTEDLOCK,
///   READPAST, ROWLOCK`.
/// - Enqueue checks for stored ids inside the caller's transaction: with the option on,
///   an id that another open transaction inserts is not seen by the check and the
///   insert then waits on that transaction's key lock; if it commits, the insert fails
///   with error 2627, returned as [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict).
///
/// ## Limitations
///
/// - **Not run against a live server by this repository's CI** (CI does not run a SQL
///   Server): every statement passes the offline legality check, and the conformance
///   and plan suites run when `OUTBOX_TEST_MSSQL_URL` is set (the crate README's
///   workflow and script). See the crate docs.
/// - Per-key order holds for producers that commit a key's messages one transaction at
///   a time; two open transactions enqueueing the same key may see the later one's
///   message published first.
/// - Enqueue order is `seq` order (the identity follows the insert's `ORDER BY`); two
///   transactions enqueueing one key concurrently may commit in the other order.
/// - A per-key claim waits for a transaction that holds an uncommitted row of a
///   candidate's key earlier than a committed one (two transactions enqueueing one key,
///   the later committing first), up to the pool's `LOCK_TIMEOUT`; the whole claim
///   waits, not only that key.
/// - Per-key claims read past every due row of a key whose head is in flight or
///   backing off (without locking them beyond the read).
/// - Two claimers may pick the same heads in the first pass; the second then skips
///   them and returns fewer rows than are due. The relay claims again.
/// - A batch larger than one statement can carry (see [`enqueue`](Self::enqueue) and
///   the settles) is sent as several statements; settles run each in autocommit, so an
///   error part-way leaves the earlier chunks applied (their leases then report lost on
///   a retry, which is what happened).
/// - The table may not have triggers: `OUTPUT` without `INTO` is refused on tables with
///   enabled triggers.
#[derive(Clone)]
pub struct MssqlOutbox {
    pool: MssqlPool,
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: MssqlOutboxConfig,
    name: QualifiedName,
    /// Whether the last install found the table's `LOCK_ESCALATION` other than
    /// `DISABLE` (false until an install says so: the DDL creates it disabled).
    escalates: AtomicBool,
    /// Whether `stats` counts dead and dispatched rows because the login may not read
    /// index sizes.
    stats_by_scan: AtomicBool,
}

/// Rows per claim, purge or change statement on a table that `escalates` or not.
fn statement_rows(escalates: bool) -> usize {
    if escalates {
        ESCALATING_BATCH
    } else {
        CLAIM_BATCH
    }
}

impl fmt::Debug for MssqlOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.inner.config;
        config.debug_store(f, "MssqlOutbox").finish_non_exhaustive()
    }
}

impl MssqlOutbox {
    /// An outbox claiming with `pool` (see
    /// [`MssqlConnection::pool`](crate::MssqlConnection::pool)). Runs no SQL; call
    /// [`install`](Self::install) or apply [`ddl`](Self::ddl) first.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when `config` does not
    /// validate.
    pub fn new(pool: MssqlPool, config: MssqlOutboxConfig) -> Result<Self> {
        config.validate()?;
        let name = config.qualified_name()?;
        Ok(MssqlOutbox {
            pool,
            inner: Arc::new(Inner {
                config,
                name,
                escalates: AtomicBool::new(false),
                stats_by_scan: AtomicBool::new(false),
            }),
        })
    }

    /// The pool this outbox claims with.
    pub fn pool(&self) -> &MssqlPool {
        &self.pool
    }

    /// The settings.
    pub fn config(&self) -> &MssqlOutboxConfig {
        &self.inner.config
    }

    /// The table, validated; displays as `[schema].[table]`, the name
    /// [`Schema::name`](outbox_core::schema::Schema::name) gives this outbox.
    pub fn qualified_name(&self) -> &QualifiedName {
        &self.inner.name
    }

    /// The idempotent DDL for this outbox's table (schema, version table, table,
    /// clustered and filtered indexes, version record), as one T-SQL batch for your
    /// migration tool (the default names' DDL is checked in as `sql/outbox.sql`).
    pub fn ddl(&self) -> String {
        schema::outbox_ddl(&self.inner.name)
    }

    /// Create the schema, table and indexes if missing, and record the layout version,
    /// on a dedicated connection. Safe to call from every process at start-up: no lock
    /// is waited on for more than five seconds, and the table settings it applies to an
    /// existing table (`OPTIMIZE_FOR_SEQUENTIAL_KEY`) are skipped with a warning when
    /// their schema lock is not granted in that time, so a live table's enqueues never
    /// queue behind an install for long. `LOCK_ESCALATION = DISABLE` is set when the
    /// table is created, never again (a DBA's later choice stands); the install reads
    /// it back, and where the table escalates this store sends claim, purge and change
    /// statements of at most 900 rows, below SQL Server's 5,000-lock threshold, and
    /// logs a warning.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists at
    /// another layout version; mapped driver errors otherwise.
    pub async fn install(&self) -> Result<()> {
        let mut client = dedicated(&self.pool, "schema install").await?;
        let name = &self.inner.name;
        let installed =
            crate::install::install(&mut client, name, &schema::outbox_layout(name)).await?;
        let disabled = installed.lock_escalation.as_deref() == Some("DISABLE");
        if !disabled {
            tracing::warn!(
                table = %name,
                lock_escalation = ?installed.lock_escalation,
                "the outbox table's LOCK_ESCALATION is not DISABLE: claims, purges and \
                 changes run in statements of at most 900 rows so that none escalates to a \
                 table lock; ALTER TABLE ... SET (LOCK_ESCALATION = DISABLE) restores 2,000"
            );
        }
        self.inner.escalates.store(!disabled, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `stats` counts dead and dispatched rows (index sizes were refused).
    pub(crate) fn stats_by_scan(&self) -> bool {
        self.inner.stats_by_scan.load(Ordering::Relaxed)
    }

    /// From now on, `stats` counts dead and dispatched rows.
    pub(crate) fn count_stats_by_scan(&self) {
        self.inner.stats_by_scan.store(true, Ordering::Relaxed);
    }

    /// Rows per claim, purge or change statement: [`CLAIM_BATCH`], or
    /// [`ESCALATING_BATCH`] where the last install found the table escalating.
    pub(crate) fn statement_rows(&self) -> usize {
        statement_rows(self.inner.escalates.load(Ordering::Relaxed))
    }

    /// Enqueue `messages` on `client`, inside the transaction you began on it
    /// ([`MssqlSession::begin`](crate::MssqlSession::begin)). Never commits or rolls
    /// back.
    ///
    /// - Every message is checked against the config's
    ///   [`MessageLimits`](outbox_core::MessageLimits) first; one bad message, or an id
    ///   given twice, rejects the batch before anything is sent.
    /// - A batch is one `INSERT ... SELECT ... FROM (VALUES ...) ORDER BY` per chunk of
    ///   up to 285 messages (7 bound parameters each, under SQL Server's 2,100), in
    ///   slice order, so `seq` follows the slice. Each statement inserts its chunk only
    ///   if none of its ids is stored (`WHERE NOT EXISTS`), so the statement itself does
    ///   not fail on a duplicate and your transaction stays usable even under `SET
    ///   XACT_ABORT ON`. If a chunk finds stored ids, the chunks already inserted are
    ///   deleted again (they are uncommitted, so no claim could take them) and the call
    ///   fails with [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) naming the
    ///   stored ids: the batch wrote nothing.
    /// - Without an open transaction (autocommit) each statement commits on its own: a
    ///   batch of several chunks is then not atomic, and nothing is taken back.
    /// - Times come from `SYSUTCDATETIME()` of each statement (not of your
    ///   transaction's start): `created_at` is when the statement ran and the message
    ///   is due `delay` after it.
    ///
    /// ```no_run
    /// # async fn demo(outbox: outbox_sqlserver::MssqlOutbox) -> outbox_core::Result<()> {
    /// use outbox_core::NewMessage;
    ///
    /// let mut session = outbox.pool().get().await.expect("a pooled session");
    /// // A transaction the pool can see: dropped unfinished, its session is closed.
    /// let mut tx = session.begin().await?;
    /// // ... business writes on `tx` ...
    /// let msg = NewMessage::builder("orders.created").payload(b"{}".to_vec()).build()?;
    /// outbox.enqueue(&mut *tx, &[msg]).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// - [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) for a message
    ///   over the limits; [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) for
    ///   an id given twice. Nothing was sent.
    /// - [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) naming ids already
    ///   stored; nothing was written and the transaction is usable. An id another open
    ///   transaction is inserting makes the statement wait for it; if it commits, the
    ///   insert fails with error 2627 (also `Conflict`, without ids).
    /// - Mapped driver errors otherwise (2627 included). Under `XACT_ABORT OFF` a
    ///   statement-level error leaves your transaction open, and this call deletes the
    ///   chunks it had inserted before returning. Under `XACT_ABORT ON`, and for errors
    ///   that end a transaction whatever the setting (deadlock victim 1205, a lost
    ///   connection), **the server has already rolled back your whole transaction**,
    ///   your own writes included. Either way, end it with `IF @@TRANCOUNT > 0 ROLLBACK
    ///   TRANSACTION` (a bare `ROLLBACK` fails with error 3903 when it is gone).
    pub async fn enqueue<S>(&self, client: &mut Client<S>, messages: &[NewMessage]) -> Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        check_enqueue(messages, self.inner.config.limits())?;
        if messages.is_empty() {
            return Ok(());
        }
        let rows = messages
            .iter()
            .map(|m| {
                Ok(NewRow {
                    id: *m.id().as_uuid().as_bytes(),
                    destination: m.destination().to_owned(),
                    partition_key: m.partition_key().map(str::to_owned),
                    payload: m.payload().to_vec(),
                    content_type: m.content_type().map(str::to_owned),
                    headers: m.headers().to_json().to_string(),
                    delay_us: micros("delay", m.delay())?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let name = &self.inner.name;
        let mut inserted: Vec<[u8; 16]> = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(chunk_rows(sql::ENQUEUE_PARAMS, 0)) {
            let out = match query_rows(client, sql::enqueue(name, chunk)).await {
                Ok(out) => out,
                Err(e) => {
                    // A statement-level error (2627 from a racing insert of the same
                    // id, a truncation, ...) leaves the transaction open under
                    // `XACT_ABORT OFF`: take back the earlier chunks there too, so a
                    // caller that commits anyway has not half a batch.
                    let err = from_tiberius("enqueue", e);
                    if !inserted.is_empty() {
                        if let Err(undo) = self.take_back(client, &inserted).await {
                            tracing::debug!(error = %undo.report(), "could not take back a partly enqueued batch");
                        }
                    }
                    return Err(err);
                }
            };
            if out.len() == chunk.len() {
                for row in &out {
                    inserted.push(row_id(row, "id")?);
                }
                continue;
            }
            // Some ids are stored already: take back what this call inserted, so the
            // batch writes nothing, and name the stored ids.
            self.take_back(client, &inserted).await?;
            let ids: Vec<[u8; 16]> = rows.iter().map(|r| r.id).collect();
            let mut stored = Vec::new();
            for ids in ids.chunks(chunk_rows(1, 0)) {
                for row in query_rows(client, sql::stored_ids(name, ids))
                    .await
                    .map_err(|e| from_tiberius("enqueue", e))?
                {
                    stored.push(MessageId::from_uuid(Uuid::from_bytes(row_id(&row, "id")?)));
                }
            }
            return Err(Error::already_stored(stored));
        }
        Ok(())
    }

    /// Delete the rows this enqueue call inserted, in the caller's transaction (only
    /// while it is open and committable: see [`sql::delete_ids`]).
    async fn take_back<S>(&self, client: &mut Client<S>, inserted: &[[u8; 16]]) -> Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        for ids in inserted.chunks(chunk_rows(1, 0)) {
            execute(client, sql::delete_ids(&self.inner.name, ids))
                .await
                .map_err(|e| from_tiberius("taking back a partly enqueued batch", e))?;
        }
        Ok(())
    }

    /// Enqueue one message; see [`enqueue`](Self::enqueue).
    ///
    /// # Errors
    /// As [`enqueue`](Self::enqueue).
    pub async fn enqueue_one<S>(&self, client: &mut Client<S>, message: &NewMessage) -> Result<()>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        self.enqueue(client, std::slice::from_ref(message)).await
    }

    /// A pooled connection, for the statements of this crate.
    pub(crate) async fn client(
        &self,
        what: &str,
    ) -> Result<bb8::PooledConnection<'_, MssqlManager>> {
        self.pool.get().await.map_err(|e| from_pool(what, e))
    }

    /// Run one statement on a pooled connection and return its rows, bounded by the
    /// session's statement time-out.
    pub(crate) async fn rows(&self, what: &str, stmt: Stmt) -> Result<Vec<Row>> {
        self.rows_within(what, stmt, None).await
    }

    /// [`rows`](Self::rows), bounded by `limit` too when it is shorter.
    async fn rows_within(
        &self,
        what: &str,
        stmt: Stmt,
        limit: Option<Duration>,
    ) -> Result<Vec<Row>> {
        let mut session = self.client(what).await?;
        session_rows(&mut session, what, stmt, limit).await
    }

    /// Claim up to `limit` due rows (only `ids` when given), in statements of at most
    /// [`CLAIM_BATCH`] rows sharing one token, so no statement holds enough row locks
    /// to escalate to a table lock; then decode them all.
    async fn claim_with(
        &self,
        limit: usize,
        lease: Duration,
        ids: Option<&[[u8; 16]]>,
    ) -> Result<Claimed> {
        let token = LeaseToken::new();
        let lease_us = micros("lease", lease)?;
        let mut rows = Vec::new();
        let ask = |stmt_limit: usize, chunk: Option<&[[u8; 16]]>| {
            claim::claim(
                &self.inner.name,
                self.inner.config.ordering(),
                stmt_limit,
                lease_us,
                *token.as_uuid().as_bytes(),
                chunk,
            )
        };
        let mut stmts: Vec<(usize, Stmt)> = Vec::new();
        let batch = self.statement_rows();
        match ids {
            Some(ids) => {
                // One JSON parameter per statement, whatever the number of ids.
                for chunk in ids.chunks(batch) {
                    stmts.push((chunk.len(), ask(chunk.len(), Some(chunk))));
                }
            }
            None => {
                let step = limit.min(batch);
                stmts.push((step, ask(step, None)));
            }
        }
        let mut remaining = limit;
        while let Some((asked, stmt)) = stmts.pop() {
            // A claim that returns after its lease ran out hands the relay rows others
            // may already have claimed: its statements are bounded by the lease too.
            let got = match self.rows_within("claim", stmt, Some(lease)).await {
                Ok(got) => got,
                Err(err) => {
                    // Earlier statements of this claim committed: give their rows back.
                    if !rows.is_empty() {
                        release_claim(self, token, &rows, &err).await;
                    }
                    return Err(err);
                }
            };
            let full = got.len() == asked;
            remaining = remaining.saturating_sub(got.len());
            rows.extend(got);
            if ids.is_none() && full && remaining > 0 {
                let step = remaining.min(batch);
                stmts.push((step, ask(step, None)));
            }
        }
        finish_claim(self, token, rows).await
    }

    /// Run settle statements chunk by chunk and report which of `requested` applied.
    async fn settle_all(
        &self,
        what: &str,
        stmts: Vec<Stmt>,
        requested: impl Iterator<Item = MessageId>,
    ) -> Result<Settled> {
        let mut applied = Vec::new();
        let mut session = self.client(what).await?;
        for stmt in stmts {
            for row in session_rows(&mut session, what, stmt, None).await? {
                applied.push(MessageId::from_uuid(Uuid::from_bytes(row_id(&row, "id")?)));
            }
        }
        Ok(Settled::reconcile(requested, applied))
    }

    async fn settle_leases(&self, what: &str, how: Settle, leases: &[Lease]) -> Result<Settled> {
        if leases.is_empty() {
            return Ok(Settled::default());
        }
        let pairs: Vec<([u8; 16], [u8; 16])> = in_id_order(leases, |l| l.id)
            .into_iter()
            .map(|l| (*l.id.as_uuid().as_bytes(), *l.token.as_uuid().as_bytes()))
            .collect();
        let stmts = pairs
            .chunks(chunk_rows(sql::LEASE_PARAMS, 0))
            .map(|chunk| sql::settle(&self.inner.name, how, chunk))
            .collect();
        self.settle_all(what, stmts, leases.iter().map(|l| l.id))
            .await
    }
}

#[async_trait]
impl OutboxStore for MssqlOutbox {
    fn capabilities(&self) -> StoreCapabilities {
        let config = &self.inner.config;
        StoreCapabilities::new(config.ordering(), config.retention())
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Claimed> {
        self.claim_with(request.limit(), request.lease(), None)
            .await
    }

    async fn claim_ids(&self, request: &ClaimIds) -> Result<Claimed> {
        let ids: Vec<[u8; 16]> = request
            .ids()
            .iter()
            .map(|id| *id.as_uuid().as_bytes())
            .collect();
        if ids.is_empty() {
            return Ok(Claimed::default());
        }
        self.claim_with(ids.len(), request.lease(), Some(&ids))
            .await
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Settled> {
        let how = match self.inner.config.retention() {
            Retention::Delete => Settle::Delete,
            Retention::Keep { .. } => Settle::Dispatch,
        };
        self.settle_leases("complete", how, leases).await
    }

    async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        if failures.is_empty() {
            return Ok(Settled::default());
        }
        let rows = in_id_order(failures, |f| f.lease().id)
            .into_iter()
            .map(|f| {
                let (dead, after) = match f.disposition() {
                    // Beyond MAX_DELAY (ten years) a retry time could leave DATEADD's int.
                    Disposition::Retry { after } => (false, after.min(MAX_DELAY)),
                    Disposition::DeadLetter => (true, Duration::ZERO),
                };
                Ok(FailRow {
                    id: *f.lease().id.as_uuid().as_bytes(),
                    token: *f.lease().token.as_uuid().as_bytes(),
                    error: f.error().to_owned(),
                    dead,
                    retry_us: micros("retry delay", after)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let stmts = rows
            .chunks(chunk_rows(sql::FAIL_PARAMS, 0))
            .map(|chunk| sql::fail(&self.inner.name, chunk))
            .collect();
        self.settle_all("fail", stmts, failures.iter().map(|f| f.lease().id))
            .await
    }

    async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        self.settle_leases("release", Settle::Release, leases).await
    }
}

/// The fenced writes after a claim, chunked to the parameter limit.
impl CommittedClaim for MssqlOutbox {
    type Row = Row;
    type Id = [u8; 16];

    fn decode(&self, token: LeaseToken, rows: &[Row]) -> Result<DecodedClaim<[u8; 16]>> {
        decode_claimed(rows, token, self.inner.config.limits())
    }

    fn row_id(row: &Row) -> Result<[u8; 16]> {
        row_id(row, "id")
    }

    async fn dead_letter_rows(
        &self,
        token: LeaseToken,
        rows: Vec<([u8; 16], String)>,
    ) -> Result<usize> {
        let token = *token.as_uuid().as_bytes();
        let mut written = 0;
        for chunk in rows.chunks(chunk_rows(2, 1)) {
            let stmt = sql::dead_letter_claimed(&self.inner.name, token, chunk);
            match self.rows("dead-lettering undeliverable rows", stmt).await {
                Ok(_) => written += chunk.len(),
                // Earlier chunks committed: report them, log the rest.
                Err(err) if written > 0 => {
                    tracing::error!(error = %err.report(), "could not dead-letter claimed rows");
                }
                Err(err) => return Err(err),
            }
        }
        Ok(written)
    }

    async fn release_rows(&self, token: LeaseToken, ids: Vec<[u8; 16]>) -> Result<()> {
        let token = *token.as_uuid().as_bytes();
        let mut failed = None;
        for chunk in ids.chunks(chunk_rows(1, 1)) {
            let stmt = sql::release_claim(&self.inner.name, token, chunk);
            if let Err(err) = self.rows("releasing an undecodable claim", stmt).await {
                failed = Some(err);
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_shrink_where_the_table_escalates() {
        assert_eq!(statement_rows(false), CLAIM_BATCH);
        assert_eq!(statement_rows(true), ESCALATING_BATCH);
        const { assert!(ESCALATING_BATCH < CLAIM_BATCH) };
    }
}
