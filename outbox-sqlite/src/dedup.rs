//! [`SqliteDedupStore`]: an inbox table of processed message ids, usable inside the
//! consumer's own transaction.
//!
//! # Protocol (idempotent consumer, same database)
//!
//! [`SqliteDedupStore::process`] runs these steps in one call;
//! [`SqliteDedupStore::record_in`] is the step 2 building block for a caller that
//! manages the transaction itself.
//!
//! 1. Begin an immediate transaction (it takes SQLite's write lock at once).
//! 2. [`record_in`](SqliteDedupStore::record_in) the message id on that transaction. A
//!    [`Dedup::Duplicate`](outbox_core::Dedup::Duplicate) means the message was already processed: end the
//!    transaction and acknowledge the message.
//! 3. On [`Dedup::New`](outbox_core::Dedup::New), apply the handler's writes on the same transaction.
//! 4. Commit: the writes and the id become visible together. A crash or rollback before
//!    the commit leaves neither, so the redelivered message is processed again.
//!
//! Concurrent deliveries of one id are serialised by the write lock: the second
//! transaction starts when the first has ended, and then reports a duplicate (or
//! `New` if the first rolled back).
//!
//! ## Limitations
//!
//! - Ids are remembered for the configured retention; a redelivery after
//!   [`purge_expired`](outbox_core::DedupStore::purge_expired) removed the id (or after the period
//!   ended) is treated as new.
//! - The write lock is held for the whole consumer transaction, and every other writer
//!   of the database waits for it: keep consumer transactions short.

use std::sync::Arc;

use async_trait::async_trait;
use outbox_sqlx::{InboxStatements, Query, SqlxInbox};
use sqlx::sqlite::SqliteQueryResult;
use sqlx::{Sqlite, SqliteConnection, SqlitePool, Transaction};

use outbox_core::{ConsumerName, Error, MessageId, Result};

use crate::config::SqliteDedupConfig;
use crate::error::from_sqlx;
use crate::ident::TableName;
use crate::schema::{ddl, inbox_objects, install};
use crate::time::now_us;

/// Processed message ids per consumer in an SQLite table; strongly consistent (one
/// database, read after write).
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool, id: outbox_core::MessageId) -> outbox_core::Result<()> {
/// use outbox_core::{ConsumerName, Dedup};
/// use outbox_sqlite::{SqliteDedupConfig, SqliteDedupStore};
///
/// let inbox = SqliteDedupStore::new(pool.clone(), SqliteDedupConfig::default())?;
/// inbox.install().await?;
/// let billing = ConsumerName::new("billing")?;
/// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.expect("begin");
/// if inbox.record_in(&mut tx, &billing, id).await? == Dedup::New {
///     // ... apply the message's effects on &mut *tx ...
/// }
/// tx.commit().await.expect("commit");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteDedupStore {
    pool: SqlitePool,
    config: SqliteDedupConfig,
    name: TableName,
    retention_us: i64,
    sql: Arc<InboxStatements>,
}

/// The store's statements, rendered once. `?1`/`?2` are the consumer and id, `?3` now
/// and `?4` the retention in microseconds.
fn dedup_statements(t: &TableName) -> InboxStatements {
    // An expired record that was not purged yet counts as absent: recording refreshes
    // it and reports `New`.
    InboxStatements {
        record: format!(
            "INSERT INTO {t} AS d (consumer, message_id, processed_at) VALUES (?1, ?2, ?3) \
             ON CONFLICT (consumer, message_id) DO UPDATE SET processed_at = ?3 \
             WHERE d.processed_at < ?3 - ?4"
        ),
        contains: format!(
            "SELECT EXISTS (SELECT 1 FROM {t} WHERE consumer = ?1 AND message_id = ?2 \
             AND processed_at >= ?3 - ?4)"
        ),
        purge: format!(
            "DELETE FROM {t} WHERE (consumer, message_id) IN \
             (SELECT consumer, message_id FROM {t} WHERE processed_at < ?1 - ?2 LIMIT ?3)"
        ),
    }
}

impl SqliteDedupStore {
    /// A store on `pool` with `config`. Runs no SQL.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when `config` does not
    /// validate or its retention does not fit in 64-bit microseconds.
    pub fn new(pool: SqlitePool, config: SqliteDedupConfig) -> Result<Self> {
        config.validate()?;
        let name = config.table_name()?;
        let retention_us = config.retention_micros()?;
        Ok(SqliteDedupStore {
            pool,
            sql: Arc::new(dedup_statements(&name)),
            config,
            name,
            retention_us,
        })
    }

    /// The settings.
    pub fn config(&self) -> &SqliteDedupConfig {
        &self.config
    }

    /// The DDL for this store's table, idempotent, for your migration tool (the
    /// default names' DDL is checked in as `sql/inbox.sql`).
    pub fn ddl(&self) -> String {
        ddl(&self.name, &inbox_objects(&self.name))
    }

    /// Create the table if missing and record the layout version.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists at
    /// another layout version; mapped driver errors otherwise.
    pub async fn install(&self) -> Result<()> {
        install(&self.pool, &self.name, &inbox_objects(&self.name)).await
    }
}

#[async_trait]
impl SqlxInbox for SqliteDedupStore {
    type Db = Sqlite;

    fn map_error(what: &str, err: sqlx::Error) -> Error {
        from_sqlx(what, err)
    }

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// An immediate transaction: it takes SQLite's write lock at once.
    async fn begin_consumer(&self) -> sqlx::Result<Transaction<'static, Sqlite>> {
        self.pool.begin_with("BEGIN IMMEDIATE").await
    }

    fn statements(&self) -> &InboxStatements {
        &self.sql
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    fn bind_key<'q>(
        query: Query<'q, Sqlite>,
        consumer: &'q ConsumerName,
        id: MessageId,
    ) -> Query<'q, Sqlite> {
        query
            .bind(consumer.as_str())
            .bind(id.as_uuid().as_bytes().to_vec())
    }

    /// The time now (read once per statement), then the retention.
    fn bind_expiry<'q>(&self, query: Query<'q, Sqlite>) -> Query<'q, Sqlite> {
        query.bind(now_us()).bind(self.retention_us)
    }
}

outbox_sqlx::sqlx_dedup_store! {
    store: SqliteDedupStore,
    conn: SqliteConnection,
    /// Process message `id` for `consumer` exactly once in its own immediate
    /// transaction: begin, record the id, run `handler` on the transaction, commit. A
    /// duplicate runs nothing and returns
    /// [`Processed::Duplicate`](outbox_core::consumer::Processed::Duplicate); a handler error
    /// rolls back everything, the id included, so the redelivered message runs again.
    ///
    /// ```no_run
    /// # async fn demo(inbox: outbox_sqlite::SqliteDedupStore, id: outbox_core::MessageId)
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
    /// The handler gets the transaction for `'c` only, so it must own what it uses.
    ///
    /// # Errors
    /// The handler's error, or mapped driver errors of begin and record: nothing was
    /// committed. An error of the commit itself (disk full, say) leaves nothing
    /// committed either, so the redelivered message runs again.
    process
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_honour_expiry_and_bound_purges() {
        let sql = dedup_statements(&TableName::new("inbox").unwrap());
        assert!(sql.record.starts_with("INSERT INTO \"inbox\" AS d"));
        assert!(
            sql.record
                .contains("DO UPDATE SET processed_at = ?3 WHERE d.processed_at < ?3 - ?4"),
            "only an expired record is refreshed: {}",
            sql.record
        );
        assert!(sql.contains.contains("processed_at >= ?3 - ?4"));
        assert!(sql.purge.contains("LIMIT ?3"));
    }
}
