//! [`MssqlDedupStore`]: an inbox table of processed message ids, usable inside the
//! consumer's own transaction.
//!
//! # Protocol (idempotent consumer, same database)
//!
//! [`MssqlDedupStore::process`] runs these steps in one call;
//! [`MssqlDedupStore::record_in`] is step 2 for a caller that manages the transaction.
//!
//! 1. `BEGIN TRANSACTION` on a connection.
//! 2. [`MssqlDedupStore::record_in`] the message id on it. One batch:
//!    1. refresh the row if its record expired (`UPDATE ... OUTPUT`, a seek on the
//!       primary key);
//!    2. insert it unless present (a refreshed record is): `INSERT ... SELECT ... WHERE NOT EXISTS
//!       (SELECT ... WITH (READCOMMITTEDLOCK))`, inside `BEGIN TRY ... END TRY`. The
//!       check takes no range lock (no `HOLDLOCK`, no `SERIALIZABLE`): it reads the
//!       id's key with a shared lock released at once, and the insert locks only the
//!       new key. Transactions recording different ids never wait for each other,
//!       however close their ids are.
//!    3. A row out means [`Dedup::New`]; none means [`Dedup::Duplicate`].
//! 3. On [`Dedup::New`], apply the handler's writes on the same transaction.
//! 4. Commit: the writes and the id become visible together; a rollback or crash before
//!    it leaves neither, so the redelivered message is processed again.
//!
//! # Concurrent deliveries of one id
//!
//! - The second delivery's check reads the id's key with a lock (`READCOMMITTEDLOCK`,
//!   so also with `READ_COMMITTED_SNAPSHOT` on): while the first transaction holds its
//!   new row, the second waits, then reports [`Dedup::Duplicate`] (or inserts, and
//!   reports [`Dedup::New`], if the first rolled back).
//! - The rare race where both checks run before either insert ends with one insert
//!   failing with error 2627. The `CATCH` block turns it into "no row", that is
//!   [`Dedup::Duplicate`], whenever the caller's transaction is still committable
//!   (`XACT_ABORT OFF`, or no transaction): the statement's error only undid the
//!   statement. Under `SET XACT_ABORT ON` the server dooms the whole transaction on
//!   that error (`XACT_STATE() = -1`; no savepoint or `CATCH` can save it), so the
//!   error is raised again and `record_in` returns a retryable
//!   [`ErrorKind::Contention`]: the caller's transaction is gone, and the redelivery
//!   will report the duplicate.
//!
//! `IGNORE_DUP_KEY` on the primary key would report duplicates without any error, but
//! SQL Server takes key-range locks for inserts into such an index at every isolation
//! level: the serialisation this protocol avoids. It is not used.
//!
//! ## Limitations
//!
//! - [`Consistency::Strong`] holds on the primary replica; a readable secondary can
//!   miss a record committed a moment ago.
//! - Ids are remembered for the configured retention; a redelivery after that is new.
//! - `record_in` holds the new row's lock until the transaction ends: a redelivery of
//!   the same id waits that long (up to the pool's `LOCK_TIMEOUT`, then error 1222,
//!   a retryable [`ErrorKind::Contention`]).
//! - Under `XACT_ABORT ON`, the race above costs the caller's transaction.
//! - Consumer names are compared exactly (binary collation).

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::io::{AsyncRead, AsyncWrite};
use tiberius::Client;

use outbox_core::consumer::Processed;
use outbox_core::{
    Consistency, ConsumerName, Dedup, DedupStore, Error, ErrorKind, MessageId, Result,
};

use crate::config::MssqlDedupConfig;
use crate::error::{from_pool, from_tiberius, has_number};
use crate::exec::{query_all_rows, row_i32, session_execute, session_rows};
use crate::ident::QualifiedName;
use crate::install::install;
use crate::schema::index;
use crate::schema::{inbox_ddl, inbox_layout};
use crate::session::{dedicated, MssqlClient, MssqlPool};
use crate::sql::{
    age_micros, before, bounded_delete, purge_hints, Binder, Param, Stmt, DELETE_BATCH, NOW,
};

/// The error numbers of a duplicate key: a racing insert of the same id.
pub(crate) const DUPLICATE_KEY: [u32; 2] = [2627, 2601];

/// Record `id` for `consumer`: refresh an expired record, else insert unless present
/// (a refreshed record is present, so the insert's check skips it), without a range
/// lock (see the module's protocol). Returns a row (in one of two
/// result sets) when the id is new. A duplicate-key error of a racing insert is
/// swallowed while the transaction stays committable (`XACT_STATE() <> -1`) and raised
/// again otherwise, as is every other error.
pub(crate) fn record(t: &QualifiedName, consumer: &str, id: [u8; 16], retention_us: i64) -> Stmt {
    let mut b = Binder::default();
    let consumer = b.bind(Param::Text(Some(consumer.to_owned())));
    let id = b.bind_id(id);
    let retention = b.bind(Param::I64(retention_us));
    let [unique, unique_index] = DUPLICATE_KEY;
    b.finish(format!(
        "UPDATE {t} SET processed_at = {NOW} OUTPUT 1 AS fresh \
         WHERE consumer = {consumer} AND message_id = {id} AND processed_at < {cutoff}; \
         BEGIN TRY \
         INSERT INTO {t} (consumer, message_id, processed_at) OUTPUT 1 AS fresh \
         SELECT {consumer}, {id}, {NOW} WHERE NOT EXISTS (SELECT 1 FROM {t} WITH (READCOMMITTEDLOCK) \
         WHERE consumer = {consumer} AND message_id = {id}); \
         END TRY \
         BEGIN CATCH \
         IF ERROR_NUMBER() NOT IN ({unique}, {unique_index}) OR XACT_STATE() = -1 THROW; \
         END CATCH;",
        cutoff = before(&retention),
    ))
}

/// Whether `id` is recorded and not expired.
pub(crate) fn contains(t: &QualifiedName, consumer: &str, id: [u8; 16], retention_us: i64) -> Stmt {
    let mut b = Binder::default();
    let consumer = b.bind(Param::Text(Some(consumer.to_owned())));
    let id = b.bind_id(id);
    let retention = b.bind(Param::I64(retention_us));
    b.finish(format!(
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM {t} WHERE consumer = {consumer} \
         AND message_id = {id} AND processed_at >= {cutoff}) THEN 1 ELSE 0 END AS found;",
        cutoff = before(&retention),
    ))
}

/// Delete up to `limit` (at most [`DELETE_BATCH`]) expired records.
pub(crate) fn purge(t: &QualifiedName, retention_us: i64, limit: usize) -> Stmt {
    let mut b = Binder::default();
    let top = b.bind(Param::I64(crate::sql::limit_param(limit.min(DELETE_BATCH))));
    let retention = b.bind(Param::I64(retention_us));
    let predicate = format!("x.processed_at < {}", before(&retention));
    let hints = purge_hints(t, index::PROCESSED_AT);
    b.finish(bounded_delete(t, &top, &hints, &predicate))
}

/// Processed message ids per consumer in a SQL Server table; strongly consistent.
///
/// ```no_run
/// # async fn demo(inbox: outbox_sqlserver::MssqlDedupStore, pool: outbox_sqlserver::MssqlPool, id: outbox_core::MessageId) -> outbox_core::Result<()> {
/// use outbox_core::{ConsumerName, Dedup};
///
/// let billing = ConsumerName::new("billing")?;
/// let mut session = pool.get().await.expect("a pooled session");
/// // Dropped before commit or rollback, the guard has the pool close the session,
/// // which ends the transaction and its locks on the server at once.
/// let mut tx = session.begin().await?;
/// if inbox.record_in(&mut *tx, &billing, id).await? == Dedup::New {
///     // ... apply the message's effects on `tx` ...
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MssqlDedupStore {
    pool: MssqlPool,
    config: MssqlDedupConfig,
    name: QualifiedName,
    retention_us: i64,
}

impl MssqlDedupStore {
    /// A store on `pool` with `config`. Runs no SQL.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when `config` does not
    /// validate.
    pub fn new(pool: MssqlPool, config: MssqlDedupConfig) -> Result<Self> {
        config.validate()?;
        let name = config.qualified_name()?;
        let retention_us = age_micros(config.retention());
        Ok(MssqlDedupStore {
            pool,
            config,
            name,
            retention_us,
        })
    }

    /// The settings.
    pub fn config(&self) -> &MssqlDedupConfig {
        &self.config
    }

    /// The DDL for this store's table, idempotent, for your migration tool.
    pub fn ddl(&self) -> String {
        inbox_ddl(&self.name)
    }

    /// Create the schema and table if missing and record the layout version.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists at
    /// another layout version; mapped driver errors otherwise.
    pub async fn install(&self) -> Result<()> {
        let mut client = dedicated(&self.pool, "schema install").await?;
        install(&mut client, &self.name, &inbox_layout(&self.name))
            .await
            .map(drop)
    }

    /// Record `id` for `consumer` on `client`, normally inside the transaction that
    /// applies the message's effects, so both commit together. Takes no range lock:
    /// concurrent transactions recording other ids do not wait for this one.
    ///
    /// # Errors
    /// - [`ErrorKind::Contention`] (retryable) when a concurrent transaction inserted
    ///   the same id between this call's check and its insert *and* your transaction
    ///   runs with `SET XACT_ABORT ON`: the server has rolled your transaction back
    ///   (end it with `IF @@TRANCOUNT > 0 ROLLBACK`); the redelivery reports
    ///   [`Dedup::Duplicate`]. Under `XACT_ABORT OFF` that race is a
    ///   [`Dedup::Duplicate`] and your transaction stays usable.
    /// - Mapped driver errors otherwise.
    pub async fn record_in<S>(
        &self,
        client: &mut Client<S>,
        consumer: &ConsumerName,
        id: MessageId,
    ) -> Result<Dedup>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let stmt = record(
            &self.name,
            consumer.as_str(),
            *id.as_uuid().as_bytes(),
            self.retention_us,
        );
        let rows = match query_all_rows(client, stmt).await {
            Ok(rows) => rows,
            // Raised again by the CATCH block only when the transaction is doomed.
            Err(e) if has_number(&e, &DUPLICATE_KEY) => {
                return Err(Error::new(
                    ErrorKind::Contention,
                    "record message id failed: a concurrent transaction recorded the same \
                     id, and under XACT_ABORT ON the server rolled this transaction back",
                )
                .with_source(e))
            }
            Err(e) => return Err(from_tiberius("record message id", e)),
        };
        Ok(if rows.is_empty() {
            Dedup::Duplicate
        } else {
            Dedup::New
        })
    }

    /// Process message `id` for `consumer` once, in its own transaction: begin, record
    /// the id, run `handler` on the transaction's connection, commit. A duplicate runs
    /// nothing and returns [`Processed::Duplicate`]; a handler error rolls everything
    /// back, the id included.
    ///
    /// ```no_run
    /// # async fn demo(inbox: outbox_sqlserver::MssqlDedupStore, id: outbox_core::MessageId)
    /// # -> outbox_core::Result<()> {
    /// use outbox_core::consumer::Processed;
    /// use outbox_core::{ConsumerName, Error, ErrorKind};
    ///
    /// let billing = ConsumerName::new("billing")?;
    /// let outcome = inbox
    ///     .process(&billing, id, |client| {
    ///         Box::pin(async move {
    ///             client
    ///                 .execute("UPDATE accounts SET balance = balance - 10 WHERE id = 1", &[])
    ///                 .await
    ///                 .map_err(|e| Error::new(ErrorKind::Storage, "debit").with_source(e))?;
    ///             Ok(())
    ///         })
    ///     })
    ///     .await?;
    /// if outcome == Processed::Duplicate { /* acknowledge and move on */ }
    /// # Ok(()) }
    /// ```
    ///
    /// The transaction is a [`MssqlTransaction`](crate::MssqlTransaction): if this
    /// future is dropped before it commits or rolls back, the pool closes the session,
    /// and the server rolls the transaction back at once.
    ///
    /// # Errors
    /// The handler's error, or mapped driver errors of begin and record: nothing was
    /// committed. An error of the commit itself leaves the outcome unknown.
    pub async fn process<T, F>(
        &self,
        consumer: &ConsumerName,
        id: MessageId,
        handler: F,
    ) -> Result<Processed<T>>
    where
        T: Send,
        F: for<'c> FnOnce(&'c mut MssqlClient) -> BoxFuture<'c, Result<T>> + Send,
    {
        let what = "the consumer transaction";
        let mut session = self.pool.get().await.map_err(|e| from_pool(what, e))?;
        let mut tx = session.begin().await?;
        let outcome = async {
            if self.record_in(&mut *tx, consumer, id).await? == Dedup::Duplicate {
                return Ok(None);
            }
            handler(&mut tx).await.map(Some)
        }
        .await;
        match outcome {
            Ok(Some(value)) => {
                tx.commit().await?;
                Ok(Processed::Applied(value))
            }
            Ok(None) => {
                rollback_logged(tx).await;
                Ok(Processed::Duplicate)
            }
            Err(err) => {
                rollback_logged(tx).await;
                Err(err)
            }
        }
    }
}

/// Roll `tx` back on a path that already has its answer; a failed rollback is logged
/// (the session is then closed by the pool, which ends the transaction anyway).
async fn rollback_logged(tx: crate::MssqlTransaction<'_>) {
    if let Err(err) = tx.rollback().await {
        tracing::debug!(error = %err.report(), "rollback failed; the session will be closed");
    }
}

#[async_trait]
impl DedupStore for MssqlDedupStore {
    fn consistency(&self) -> Consistency {
        Consistency::Strong
    }

    async fn contains(&self, consumer: &ConsumerName, id: MessageId) -> Result<bool> {
        let what = "look up message id";
        let mut client = self.pool.get().await.map_err(|e| from_pool(what, e))?;
        let stmt = contains(
            &self.name,
            consumer.as_str(),
            *id.as_uuid().as_bytes(),
            self.retention_us,
        );
        let rows = session_rows(&mut client, what, stmt, None).await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::new(outbox_core::ErrorKind::Decode, "lookup returned no row"))?;
        Ok(row_i32(row, "found")? == 1)
    }

    async fn record(&self, consumer: &ConsumerName, id: MessageId) -> Result<Dedup> {
        let what = "record message id";
        let mut client = self.pool.get().await.map_err(|e| from_pool(what, e))?;
        self.record_in(&mut *client, consumer, id).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        let what = "purge message ids";
        if limit == 0 {
            return Ok(0);
        }
        let mut client = self.pool.get().await.map_err(|e| from_pool(what, e))?;
        let limit = limit as u64;
        let mut purged = 0;
        while purged < limit {
            let step = usize::try_from(limit - purged)
                .unwrap_or(DELETE_BATCH)
                .min(DELETE_BATCH);
            let done = session_execute(
                &mut client,
                what,
                purge(&self.name, self.retention_us, step),
            )
            .await?;
            purged += done;
            if done < step as u64 {
                break;
            }
        }
        Ok(purged)
    }
}
