//! [`MySqlDedupStore`]: an inbox table of processed message ids, usable inside the
//! consumer's own transaction.
//!
//! [`MySqlDedupStore::record_in`] records an id on your transaction, so the handler's
//! writes and the id commit together ([`MySqlDedupStore::process`] runs begin, record,
//! handler, commit in one call). Concurrent deliveries of one id are serialised by the
//! primary key: the second waits for the first transaction, then reports a duplicate.
//!
//! The record is one `INSERT ... ON DUPLICATE KEY UPDATE`: an expired record is
//! refreshed (and reported `New`); an unexpired one is left as it is and marks the
//! statement with `LAST_INSERT_ID(1)`, which is how a duplicate is told from a new row
//! (sqlx connects with `CLIENT_FOUND_ROWS`, so both report one row).
//!
//! ## Limitations
//!
//! - Consumer names are `VARBINARY(255)`, compared byte for byte.
//! - Ids are remembered for the configured retention; a redelivery after that is new.
//! - `record_in` holds the id's row lock until the transaction ends.

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use outbox_sqlx::{InboxStatements, Query, SqlxInbox};
use sqlx::mysql::MySqlQueryResult;
use sqlx::{MySql, MySqlConnection, MySqlPool, Transaction};

use outbox_core::{ConsumerName, Error, MessageId, Result};

use crate::admin::purge_locked;
use crate::config::{MySqlDedupConfig, QualifiedName};
use crate::error::from_sqlx;
use crate::schema::{ddl, inbox_objects, install};
use crate::sql::{cutoff, NOW};
use crate::store::read_committed;

/// Processed message ids per consumer in a MySQL table; strongly consistent.
///
/// ```no_run
/// # async fn demo(pool: sqlx::MySqlPool, id: outbox_core::MessageId) -> outbox_core::Result<()> {
/// use outbox_core::{ConsumerName, Dedup};
/// use outbox_mysql::{MySqlDedupConfig, MySqlDedupStore};
///
/// let inbox = MySqlDedupStore::new(pool.clone(), MySqlDedupConfig::default())?;
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
pub struct MySqlDedupStore {
    /// The pool the store was made with: `process` begins on it.
    caller: MySqlPool,
    /// Its READ COMMITTED sibling, for `record`, `contains` and purges.
    pool: MySqlPool,
    config: MySqlDedupConfig,
    name: QualifiedName,
    retention_us: i64,
    sql: Arc<InboxStatements>,
    /// The purge's second statement: delete the records `sql.purge` locked
    /// (`[[consumer, id], ...]` in hex) by primary key.
    purge_delete: Arc<str>,
}

/// The statements: `?` consumer, `?` id, `?` retention µs (record, contains); `?`
/// retention µs, `?` limit (purge: the select of [`purge_locked`]).
fn dedup_statements(t: &QualifiedName) -> InboxStatements {
    // Saturating: a retention reaching past year 1000 would make `NOW - INTERVAL` NULL.
    let expired = format!("processed_at < {}", cutoff("?"));
    InboxStatements {
        record: format!(
            "INSERT INTO {t} (consumer, message_id, processed_at) VALUES (?, ?, {NOW}) \
             ON DUPLICATE KEY UPDATE processed_at = IF({expired}, {NOW}, \
             processed_at + INTERVAL (LAST_INSERT_ID(1) - 1) MICROSECOND)"
        ),
        contains: format!(
            "SELECT EXISTS (SELECT 1 FROM {t} WHERE consumer = ? AND message_id = ? \
             AND NOT {expired})"
        ),
        purge: format!(
            "SELECT JSON_ARRAY(HEX(consumer), HEX(message_id)) FROM {t} FORCE INDEX ({ix}) \
             WHERE {expired} ORDER BY processed_at LIMIT ? FOR UPDATE SKIP LOCKED",
            ix = t.quoted_derived("processed_at"),
        ),
    }
}

impl MySqlDedupStore {
    /// A store on `pool` with `config`. Runs no SQL. Its own statements (`record`,
    /// `contains`, purges) run on a READ COMMITTED pool beside `pool`, opened on first
    /// use, so a purge takes no gap locks; `process` begins on `pool`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when `config` does not
    /// validate or its retention does not fit in 64-bit microseconds.
    pub fn new(pool: MySqlPool, config: MySqlDedupConfig) -> Result<Self> {
        config.validate()?;
        let name = config.qualified_name()?;
        let retention_us = config.retention_micros()?;
        Ok(MySqlDedupStore {
            pool: read_committed(&pool, pool.options().get_max_connections()),
            caller: pool,
            sql: Arc::new(dedup_statements(&name)),
            purge_delete: format!(
                "DELETE {name} FROM JSON_TABLE(?, '$[*]' COLUMNS (c VARCHAR(510) PATH '$[0]', \
                 m CHAR(32) PATH '$[1]')) AS j STRAIGHT_JOIN {name} FORCE INDEX (PRIMARY) \
                 ON {name}.consumer = UNHEX(j.c) AND {name}.message_id = UNHEX(j.m)"
            )
            .into(),
            config,
            name,
            retention_us,
        })
    }

    /// The purge's select and delete: for the plan tests, which explain them.
    #[doc(hidden)]
    pub fn purge_sql(&self) -> [&str; 2] {
        [&self.sql.purge, &self.purge_delete]
    }

    /// The settings.
    pub fn config(&self) -> &MySqlDedupConfig {
        &self.config
    }

    /// The idempotent DDL of the inbox table (and its database and version table).
    pub fn ddl(&self) -> String {
        ddl(&self.name, &inbox_objects(&self.name))
    }

    /// Create what [`ddl`](Self::ddl) describes where missing, recording the version.
    ///
    /// # Errors
    /// As [`MySqlOutbox::install`](crate::MySqlOutbox::install).
    pub async fn install(&self) -> Result<()> {
        install(&self.caller, &self.name, &inbox_objects(&self.name)).await
    }
}

// The table, for tools such as the CLI.
outbox_core::backend::schema_from_inherent!(
    MySqlDedupStore,
    name = |s| s.config().display_name(),
    version = crate::SCHEMA_VERSION
);

#[async_trait]
impl SqlxInbox for MySqlDedupStore {
    type Db = MySql;

    fn statements(&self) -> &InboxStatements {
        &self.sql
    }

    async fn begin_consumer(&self) -> sqlx::Result<Transaction<'static, MySql>> {
        self.caller.begin().await
    }

    fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    fn map_error(what: &str, err: sqlx::Error) -> Error {
        from_sqlx(what, err)
    }

    fn rows_affected(done: &MySqlQueryResult) -> u64 {
        done.rows_affected()
    }

    /// Not marked `LAST_INSERT_ID(1)` by the duplicate branch.
    fn recorded(done: &MySqlQueryResult) -> bool {
        done.last_insert_id() != 1
    }

    fn bind_key<'q>(
        query: Query<'q, MySql>,
        consumer: &'q ConsumerName,
        id: MessageId,
    ) -> Query<'q, MySql> {
        query.bind(consumer.as_str()).bind(id.as_uuid())
    }

    fn bind_expiry<'q>(&self, query: Query<'q, MySql>) -> Query<'q, MySql> {
        query.bind(self.retention_us)
    }

    /// The select (`FOR UPDATE SKIP LOCKED`), then a delete of the records it locked,
    /// in one transaction: never waits on records a consumer holds.
    fn run_purge<'a>(&'a self, select: Query<'a, MySql>) -> BoxFuture<'a, sqlx::Result<u64>> {
        purge_locked(&self.pool, select, &self.purge_delete)
    }
}

outbox_sqlx::sqlx_dedup_store! {
    store: MySqlDedupStore,
    conn: MySqlConnection,
    /// Process message `id` for `consumer` once in its own transaction: begin, record,
    /// run `handler` (which must own what it uses), commit; a duplicate runs nothing.
    ///
    /// # Errors
    /// The handler's error or mapped driver errors; after a failed commit the outcome
    /// is unknown.
    process
}
