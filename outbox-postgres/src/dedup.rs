//! [`PgDedupStore`]: an inbox table of processed message ids, usable inside the
//! consumer's own transaction.
//!
//! # Protocol (idempotent consumer, same database)
//!
//! [`PgDedupStore::process`] runs these steps in one call; [`PgDedupStore::record_in`]
//! is the step 2 building block for a caller that manages the transaction itself.
//!
//! 1. Begin a transaction.
//! 2. [`PgDedupStore::record_in`] the message id on that transaction. A
//!    [`Dedup::Duplicate`](outbox_core::Dedup::Duplicate) means the message was already processed: commit (or roll
//!    back) and acknowledge it.
//! 3. On [`Dedup::New`](outbox_core::Dedup::New), apply the handler's writes on the same transaction.
//! 4. Commit: the writes and the id become visible together. A crash or rollback before
//!    the commit leaves neither, so the redelivered message is processed again.
//!
//! Concurrent deliveries of one id are serialised by the primary key: the second
//! `record_in` waits for the first transaction and then reports a duplicate (or `New`
//! if the first rolled back).
//!
//! ## Limitations
//!
//! - [`Consistency::Strong`](outbox_core::Consistency::Strong) holds when the pool reaches the primary: a hot standby
//!   (read replica) can miss a record committed a moment ago, which the decoupled
//!   algorithm cannot tolerate.
//! - Ids are remembered for the configured retention period; a redelivery after
//!   [`purge_expired`](outbox_core::DedupStore::purge_expired) removed the id (or after the period
//!   ended) is treated as new.
//! - `record_in` holds a row lock on the id until the transaction ends; keep consumer
//!   transactions short.
//! - Consumer names arrive validated ([`ConsumerName`](outbox_core::ConsumerName)) and are stored as given in a
//!   `text` column, compared exactly (the column takes the database's default collation,
//!   which is always deterministic). On a database whose encoding is not UTF-8, a name
//!   with characters that encoding lacks fails with the driver's error.

use std::sync::Arc;

use async_trait::async_trait;
use outbox_sqlx::{InboxStatements, Query, SqlxInbox};
use sqlx::postgres::PgQueryResult;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use outbox_core::{ConsumerName, Error, MessageId, Result};

use crate::config::PgDedupConfig;
use crate::error::from_sqlx;
use crate::ident::QualifiedName;
use crate::schema::{inbox_ddl, inbox_objects, install};

/// Processed message ids per consumer in a PostgreSQL table; strongly consistent.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool, id: outbox_core::MessageId) -> outbox_core::Result<()> {
/// use outbox_core::{ConsumerName, Dedup};
/// use outbox_postgres::{PgDedupConfig, PgDedupStore};
///
/// let inbox = PgDedupStore::new(pool.clone(), PgDedupConfig::default())?;
/// inbox.install().await?;
/// let billing = ConsumerName::new("billing")?;
/// let mut tx = pool.begin().await.expect("begin");
/// if inbox.record_in(&mut *tx, &billing, id).await? == Dedup::New {
///     // ... apply the message's effects on &mut *tx ...
/// }
/// tx.commit().await.expect("commit");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgDedupStore {
    pool: PgPool,
    config: PgDedupConfig,
    name: QualifiedName,
    retention_us: i64,
    sql: Arc<InboxStatements>,
}

/// The store's statements, rendered once. `$1`/`$2` are the consumer and id, the
/// retention is bound in microseconds.
fn dedup_statements(t: &QualifiedName) -> InboxStatements {
    // An expired record that was not purged yet counts as absent: recording refreshes
    // it and reports `New`.
    InboxStatements {
        record: format!(
            "INSERT INTO {t} AS d (consumer, message_id) VALUES ($1, $2) \
             ON CONFLICT (consumer, message_id) DO UPDATE SET processed_at = now() \
             WHERE d.processed_at < now() - $3 * interval '1 microsecond'"
        ),
        contains: format!(
            "SELECT EXISTS (SELECT 1 FROM {t} WHERE consumer = $1 AND message_id = $2 \
             AND processed_at >= now() - $3 * interval '1 microsecond')"
        ),
        purge: format!(
            "DELETE FROM {t} WHERE (consumer, message_id) IN \
             (SELECT consumer, message_id FROM {t} \
             WHERE processed_at < now() - $1 * interval '1 microsecond' \
             LIMIT $2 FOR UPDATE SKIP LOCKED)"
        ),
    }
}

impl PgDedupStore {
    /// A store on `pool` with `config`. Runs no SQL.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when `config` does not
    /// validate or its retention does not fit in 64-bit microseconds.
    pub fn new(pool: PgPool, config: PgDedupConfig) -> Result<Self> {
        config.validate()?;
        let name = config.qualified_name()?;
        let retention_us = config.retention_micros()?;
        Ok(PgDedupStore {
            pool,
            sql: Arc::new(dedup_statements(&name)),
            config,
            name,
            retention_us,
        })
    }

    /// The settings.
    pub fn config(&self) -> &PgDedupConfig {
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
        install(&self.pool, &self.name, &inbox_objects(&self.name)).await
    }
}

#[async_trait]
impl SqlxInbox for PgDedupStore {
    type Db = Postgres;

    fn map_error(what: &str, err: sqlx::Error) -> Error {
        from_sqlx(what, err)
    }

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn begin_consumer(&self) -> sqlx::Result<Transaction<'static, Postgres>> {
        self.pool.begin().await
    }

    fn statements(&self) -> &InboxStatements {
        &self.sql
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    fn bind_key<'q>(
        query: Query<'q, Postgres>,
        consumer: &'q ConsumerName,
        id: MessageId,
    ) -> Query<'q, Postgres> {
        query.bind(consumer.as_str()).bind(id.as_uuid())
    }

    fn bind_expiry<'q>(&self, query: Query<'q, Postgres>) -> Query<'q, Postgres> {
        query.bind(self.retention_us)
    }
}

outbox_sqlx::sqlx_dedup_store! {
    store: PgDedupStore,
    conn: PgConnection,
    /// Process message `id` for `consumer` exactly once in its own transaction: begin,
    /// record the id, run `handler` on the transaction, commit. A duplicate runs
    /// nothing and returns
    /// [`Processed::Duplicate`](outbox_core::consumer::Processed::Duplicate); a handler error rolls back
    /// everything, the id included, so the redelivered message runs again.
    ///
    /// ```no_run
    /// # async fn demo(inbox: outbox_postgres::PgDedupStore, id: outbox_core::MessageId)
    /// # -> outbox_core::Result<()> {
    /// use outbox_core::consumer::Processed;
    /// use outbox_core::ConsumerName;
    ///
    /// let billing = ConsumerName::new("billing")?;
    /// let outcome = inbox
    ///     .process(&billing, id, |tx| {
    ///         Box::pin(async move {
    ///             sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
    ///                 .execute(&mut *tx)
    ///                 .await
    ///                 .map_err(|e| outbox_core::Error::new(outbox_core::ErrorKind::Storage, "debit").with_source(e))?;
    ///             Ok(())
    ///         })
    ///     })
    ///     .await?;
    /// if outcome == Processed::Duplicate { /* acknowledge and move on */ }
    /// # Ok(()) }
    /// ```
    ///
    /// The handler gets the transaction for `'c` only, so it must own what it uses
    /// (move clones or `Arc`s into it), as in the example.
    ///
    /// # Errors
    /// The handler's error, or mapped driver errors of begin and record: nothing was
    /// committed. An error of the commit itself leaves the outcome unknown (the
    /// connection may have dropped after the server committed); the redelivered message
    /// then reports a duplicate or runs again. A concurrent delivery of the same id
    /// waits for this transaction (the inbox row lock) and then reports a duplicate.
    process
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_honour_expiry_and_bound_purges() {
        let sql = dedup_statements(&QualifiedName::new("s", "inbox").unwrap());
        assert!(sql.record.starts_with("INSERT INTO \"s\".\"inbox\" AS d"));
        assert!(
            sql.record
                .contains("DO UPDATE SET processed_at = now() WHERE d.processed_at <"),
            "only an expired record is refreshed: {}",
            sql.record
        );
        assert!(sql.contains.contains("processed_at >= now() - $3"));
        assert!(sql.purge.contains("LIMIT $2 FOR UPDATE SKIP LOCKED"));
    }
}
