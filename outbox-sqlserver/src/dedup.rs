//! [`MssqlDedupStore`]: an inbox table of processed message ids, usable inside the
//! consumer's own transaction.
//!
//! # Protocol (idempotent consumer, same database)
//!
//! [`MssqlDedupStore::process`] runs these steps in one call;
//! [`MssqlDedupStore::record_in`] is step 2 for a caller that manages the transaction.
//!
//! 1. `BEGIN TRANSACTION` on a connection.
//! 2. [`MssqlDedupStore::record_in`] the message id on it. One batch: refresh the row
//!    if its record expired (`UPDATE ... OUTPUT`), otherwise insert it unless present
//!    (`INSERT ... WHERE NOT EXISTS (SELECT ... WITH (UPDLOCK, HOLDLOCK))`). A row out
//!    means [`Dedup::New`]. For an id not yet stored, `HOLDLOCK` takes a key-range
//!    lock on the *gap* the id falls into (up to the next stored key), not on the id
//!    alone; see Limitations.
//! 3. On [`Dedup::New`], apply the handler's writes on the same transaction.
//! 4. Commit: the writes and the id become visible together; a rollback or crash before
//!    it leaves neither, so the redelivered message is processed again.
//!
//! Concurrent deliveries of one id are serialised by those locks: the second waits for
//! the first transaction and then reports a duplicate (or `New` if the first rolled
//! back). The locking reads (`UPDLOCK`, and an `UPDATE`'s own scan) ignore
//! `READ_COMMITTED_SNAPSHOT`, so this holds with the option on or off.
//!
//! ## Limitations
//!
//! - [`Consistency::Strong`] holds on the primary replica; a readable secondary can
//!   miss a record committed a moment ago.
//! - Ids are remembered for the configured retention; a redelivery after that is new.
//! - `record_in` holds its locks until the transaction ends; keep consumer transactions
//!   short. Message ids are UUIDv7, so a consumer's new ids usually fall into the same
//!   gap, after its newest stored id: two consumer transactions recording *different*
//!   new ids for the same consumer name wait for each other there (the range lock of
//!   the first blocks the second until it commits). Record the id late in the
//!   transaction, or use one consumer transaction at a time per consumer name. (Not
//!   measured against a server.)
//! - Consumer names are compared exactly (binary collation).

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::io::{AsyncRead, AsyncWrite};
use tiberius::Client;

use outbox_core::consumer::Processed;
use outbox_core::{Consistency, ConsumerName, Dedup, DedupStore, Error, MessageId, Result};

use crate::config::MssqlDedupConfig;
use crate::error::{from_pool, from_tiberius};
use crate::exec::{execute, query_all_rows, query_rows, row_i32};
use crate::ident::QualifiedName;
use crate::schema::{inbox_ddl, inbox_objects, install};
use crate::session::{dedicated, MssqlClient, MssqlPool};
use crate::sql::{age_micros, before, Binder, Param, Stmt, DELETE_BATCH, NOW, PURGE_HINTS};

/// Record `id` for `consumer`: refresh an expired record, else insert unless present.
/// Returns a row (in one of two result sets) when the id is new.
pub(crate) fn record(t: &QualifiedName, consumer: &str, id: [u8; 16], retention_us: i64) -> Stmt {
    let mut b = Binder::default();
    let consumer = b.bind(Param::Text(Some(consumer.to_owned())));
    let id = b.bind_id(id);
    let retention = b.bind(Param::I64(retention_us));
    b.finish(format!(
        "UPDATE {t} SET processed_at = {NOW} OUTPUT 1 AS fresh \
         WHERE consumer = {consumer} AND message_id = {id} AND processed_at < {cutoff}; \
         IF @@ROWCOUNT = 0 \
         INSERT INTO {t} (consumer, message_id, processed_at) OUTPUT 1 AS fresh \
         SELECT {consumer}, {id}, {NOW} WHERE NOT EXISTS (SELECT 1 FROM {t} WITH (UPDLOCK, HOLDLOCK) \
         WHERE consumer = {consumer} AND message_id = {id});",
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
    b.finish(format!(
        "DELETE TOP ({top}) FROM {t} {PURGE_HINTS} WHERE processed_at < {cutoff};",
        cutoff = before(&retention),
    ))
}

/// Processed message ids per consumer in a SQL Server table; strongly consistent.
///
/// ```no_run
/// # async fn demo(inbox: outbox_sqlserver::MssqlDedupStore, client: &mut outbox_sqlserver::MssqlClient, id: outbox_core::MessageId) -> outbox_core::Result<()> {
/// use outbox_core::{ConsumerName, Dedup};
///
/// let billing = ConsumerName::new("billing")?;
/// client.simple_query("BEGIN TRANSACTION").await.expect("begin");
/// if inbox.record_in(client, &billing, id).await? == Dedup::New {
///     // ... apply the message's effects on `client` ...
/// }
/// client.simple_query("COMMIT TRANSACTION").await.expect("commit");
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
        install(&mut client, &self.name, &inbox_objects(&self.name)).await
    }

    /// Record `id` for `consumer` on `client`, normally inside the transaction that
    /// applies the message's effects, so both commit together.
    ///
    /// # Errors
    /// Mapped driver errors.
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
        let rows = query_all_rows(client, stmt)
            .await
            .map_err(|e| from_tiberius("record message id", e))?;
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
        let rows = query_rows(&mut client, stmt)
            .await
            .map_err(|e| from_tiberius(what, e))?;
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
            let done = execute(&mut client, purge(&self.name, self.retention_us, step))
                .await
                .map_err(|e| from_tiberius(what, e))?;
            purged += done;
            if done < step as u64 {
                break;
            }
        }
        Ok(purged)
    }
}
