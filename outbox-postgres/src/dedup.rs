//! [`PgDedupStore`]: an inbox table of processed message ids, usable inside the
//! consumer's own transaction.
//!
//! # Protocol (idempotent consumer, same database)
//!
//! 1. Begin a transaction.
//! 2. [`PgDedupStore::record_in`] the message id on that transaction. A
//!    [`Dedup::Duplicate`] means the message was already processed: commit (or roll
//!    back) and acknowledge it.
//! 3. On [`Dedup::New`], apply the handler's writes on the same transaction.
//! 4. Commit: the writes and the id become visible together. A crash or rollback before
//!    the commit leaves neither, so the redelivered message is processed again.
//!
//! Concurrent deliveries of one id are serialised by the primary key: the second
//! `record_in` waits for the first transaction and then reports a duplicate (or `New`
//! if the first rolled back).
//!
//! ## Limitations
//!
//! - Ids are remembered for the configured retention period; a redelivery after
//!   [`purge_expired`](DedupStore::purge_expired) removed the id (or after the period
//!   ended) is treated as new.
//! - `record_in` holds a row lock on the id until the transaction ends; keep consumer
//!   transactions short.

use async_trait::async_trait;
use sqlx::{PgConnection, PgPool};

use outbox_core::{Consistency, Dedup, DedupStore, Error, MessageId, Result};

use crate::config::{derived_identifier, PgDedupConfig};
use crate::error::from_sqlx;
use crate::schema::{install_versioned, schema_prelude};
use crate::sql::limit_param;

/// Longest consumer name accepted, in bytes.
pub const MAX_CONSUMER_LEN: usize = 255;

/// Processed message ids per consumer in a PostgreSQL table; strongly consistent.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool, id: outbox_core::MessageId) -> outbox_core::Result<()> {
/// use outbox_core::Dedup;
/// use outbox_postgres::{PgDedupConfig, PgDedupStore};
///
/// let inbox = PgDedupStore::new(pool.clone(), PgDedupConfig::default())?;
/// inbox.install().await?;
/// let mut tx = pool.begin().await.expect("begin");
/// if inbox.record_in(&mut *tx, "billing", id).await? == Dedup::New {
///     // ... apply the message's effects on &mut *tx ...
/// }
/// tx.commit().await.expect("commit");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgDedupStore {
    pool: PgPool,
    config: PgDedupConfig,
    sql: std::sync::Arc<DedupStatements>,
}

#[derive(Debug)]
struct DedupStatements {
    record: String,
    contains: String,
    purge: String,
}

impl PgDedupStore {
    /// A store on `pool` with `config`. Runs no SQL.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when `config` does not
    /// validate.
    pub fn new(pool: PgPool, config: PgDedupConfig) -> Result<Self> {
        config.validate()?;
        let t = config.qualified_table();
        // An expired record that was not purged yet counts as absent: recording
        // refreshes it and reports `New`.
        let sql = DedupStatements {
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
        };
        Ok(PgDedupStore {
            pool,
            config,
            sql: std::sync::Arc::new(sql),
        })
    }

    /// The settings.
    pub fn config(&self) -> &PgDedupConfig {
        &self.config
    }

    /// The DDL for this store's table, idempotent, for your migration tool.
    pub fn ddl(&self) -> String {
        let mut text = objects_ddl(&self.config);
        // The table name is a validated identifier, safe as a literal here.
        text.push_str(&format!(
            "INSERT INTO \"{}\".{} (table_name, version) VALUES ('{}', {}) \
             ON CONFLICT (table_name) DO NOTHING;\n",
            self.config.schema_name(),
            crate::schema::VERSION_TABLE,
            self.config.table_name(),
            crate::schema::SCHEMA_VERSION,
        ));
        text
    }

    /// Create the schema and table if missing and record the layout version.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists at
    /// another layout version; mapped driver errors otherwise.
    pub async fn install(&self) -> Result<()> {
        let objects = objects_ddl(&self.config);
        let (schema, table) = (self.config.schema_name(), self.config.table_name());
        install_versioned(&self.pool, schema, table, &objects).await
    }

    /// Record `id` for `consumer` on `conn`, normally inside the transaction that
    /// applies the message's effects (pass `&mut *tx`), so both commit together.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) for an empty or
    /// oversize consumer name; mapped driver errors otherwise.
    pub async fn record_in(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        id: MessageId,
    ) -> Result<Dedup> {
        validate_consumer(consumer)?;
        let done = sqlx::query(&self.sql.record)
            .bind(consumer)
            .bind(id.as_uuid())
            .bind(self.retention_us()?)
            .execute(conn)
            .await
            .map_err(|e| from_sqlx("record message id", e))?;
        Ok(if done.rows_affected() == 1 {
            Dedup::New
        } else {
            Dedup::Duplicate
        })
    }

    fn retention_us(&self) -> Result<i64> {
        i64::try_from(self.config.retention_period().as_micros())
            .map_err(|_| Error::config("dedup retention is too long"))
    }
}

fn objects_ddl(config: &PgDedupConfig) -> String {
    let t = config.qualified_table();
    let index = derived_identifier(config.table_name(), "processed_at");
    format!(
        r#"{prelude}CREATE TABLE IF NOT EXISTS {t} (
    consumer text NOT NULL,
    message_id uuid NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS "{index}" ON {t} (processed_at);
"#,
        prelude = schema_prelude(config.schema_name()),
    )
}

fn validate_consumer(consumer: &str) -> Result<()> {
    if consumer.trim().is_empty() || consumer.len() > MAX_CONSUMER_LEN {
        return Err(Error::invalid_input(format!(
            "consumer name must be 1 to {MAX_CONSUMER_LEN} bytes and not blank"
        )));
    }
    if consumer.chars().any(char::is_control) {
        return Err(Error::invalid_input(
            "consumer name contains a control character",
        ));
    }
    Ok(())
}

#[async_trait]
impl DedupStore for PgDedupStore {
    fn consistency(&self) -> Consistency {
        Consistency::Strong
    }

    async fn contains(&self, consumer: &str, id: MessageId) -> Result<bool> {
        validate_consumer(consumer)?;
        sqlx::query_scalar(&self.sql.contains)
            .bind(consumer)
            .bind(id.as_uuid())
            .bind(self.retention_us()?)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| from_sqlx("look up message id", e))
    }

    async fn record(&self, consumer: &str, id: MessageId) -> Result<Dedup> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| from_sqlx("record message id", e))?;
        self.record_in(&mut conn, consumer, id).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let done = sqlx::query(&self.sql.purge)
            .bind(self.retention_us()?)
            .bind(limit_param(limit))
            .execute(&self.pool)
            .await
            .map_err(|e| from_sqlx("purge message ids", e))?;
        Ok(done.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn consumers_are_validated() {
        assert!(validate_consumer("billing").is_ok());
        for bad in ["", "  ", "a\nb", &"c".repeat(MAX_CONSUMER_LEN + 1)] {
            assert_eq!(
                validate_consumer(bad).unwrap_err().kind(),
                ErrorKind::InvalidInput
            );
        }
    }

    #[test]
    fn ddl_has_the_key_and_purge_index() {
        let text = objects_ddl(&PgDedupConfig::default().schema("s").table("inbox"));
        assert!(text.contains("CREATE TABLE IF NOT EXISTS \"s\".\"inbox\""));
        assert!(text.contains("PRIMARY KEY (consumer, message_id)"));
        assert!(text.contains("\"inbox_processed_at\" ON \"s\".\"inbox\" (processed_at)"));
    }
}
