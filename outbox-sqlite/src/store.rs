//! [`SqliteOutbox`]: enqueue in the caller's transaction, and the [`OutboxStore`]
//! relays claim from.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;
use sqlx::{SqliteConnection, SqlitePool};

use outbox_core::backend::{bounded_error, check_enqueue};
use outbox_core::message::MAX_DELAY;
use outbox_core::{
    store::ClaimIds, store::ClaimRequest, store::Claimed, store::Disposition, store::Failure,
    store::Lease, store::LeaseToken, store::Settled, store::StoreCapabilities, Error, ErrorKind,
    MessageId, NewMessage, OutboxStore, Result,
};

use crate::config::SqliteOutboxConfig;
use crate::error::from_sqlx;
use crate::ident::TableName;
use crate::row::{decode_claimed, uuid_at};
use crate::schema;
use crate::sql::Statements;
use crate::time::{limit_param, micros, now_us};

/// Most messages one `INSERT` carries: 7 bound values each, well under SQLite's limit
/// of 32,766 parameters per statement.
const INSERT_CHUNK: usize = 1000;
const _: () = assert!(2 + 7 * INSERT_CHUNK < 32_766);

/// An SQLite outbox: enqueue with [`enqueue`](Self::enqueue) inside your transaction,
/// hand the store to a [`Relay`](outbox_core::Relay) to publish, and to operators as
/// an [`OutboxAdmin`](outbox_core::OutboxAdmin).
///
/// Cheap to clone (a pool handle and shared, prebuilt SQL). Open the pool with
/// [`open`](crate::open) (WAL, busy timeout, durable commits) or
/// [`open_in_memory`](crate::open_in_memory).
///
/// # The claim protocol on SQLite
///
/// SQLite has no row locks: one writer at a time holds the whole database. A claim
/// therefore needs no `SKIP LOCKED`; it runs in one `BEGIN IMMEDIATE` transaction,
/// which takes the write lock first, so claimers (in this process or another) take
/// turns and never see each other's half-done work:
///
/// 1. Outside any transaction, a read checks whether anything is due (WAL readers do
///    not wait for the writer); an idle poll ends there without touching the lock.
/// 2. `BEGIN IMMEDIATE`; select the due rows' `seq`, oldest availability first, then
///    enqueue order (under per-key order, only each key's head); stamp them with
///    `available_at = now + lease`, a fresh `lease_token` and `attempts + 1`
///    (saturating at [`MAX_ATTEMPTS`](outbox_core::store::MAX_ATTEMPTS)), returning
///    them.
/// 3. Rows that do not make a deliverable message are dead-lettered in the same
///    transaction with a `last_error` saying why; `COMMIT`, and the others are
///    returned. A schema problem (a column of another type) rolls the claim back.
/// 4. The relay publishes outside any transaction.
/// 5. Complete, fail and release are each one statement for the whole batch, matching
///    `id`, `lease_token` and "not dispatched, not dead".
/// 6. A crashed relay's rows become due when `available_at` (the lease expiry) passes.
///
/// Times are the host's clock (every process sharing the file runs on one host), in
/// microseconds since the Unix epoch.
///
/// # When to use it, and when to move to PostgreSQL
///
/// SQLite suits one process, or a few on one host sharing the file (never a network
/// file system: its locking is unreliable there). Every write, your business
/// transactions included, takes the one write lock in turn: a claim waits for the lock
/// (up to the busy timeout, then a retryable
/// [`ErrorKind::Contention`](outbox_core::ErrorKind::Contention) error) where PostgreSQL
/// would skip locked rows. Move to PostgreSQL when several hosts must write, when
/// write transactions are long, or when throughput needs relays that do not take
/// turns.
///
/// With [`KeyOrder::PerKey`](outbox_core::KeyOrder::PerKey), a row with a partition key
/// is claimable only when it has the lowest `seq` among its key's undelivered rows;
/// dead letters do not block their key. Requeueing a dead letter does not restore its
/// place in the key's order (see the PostgreSQL backend's notes, which apply as they
/// stand).
#[derive(Clone)]
pub struct SqliteOutbox {
    pool: SqlitePool,
    inner: Arc<Inner>,
}

struct Inner {
    config: SqliteOutboxConfig,
    name: TableName,
    sql: Statements,
}

impl fmt::Debug for SqliteOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.inner.config;
        config
            .debug_store(f, "SqliteOutbox")
            .finish_non_exhaustive()
    }
}

impl SqliteOutbox {
    /// An outbox on `pool` with `config`. Runs no SQL; call [`install`](Self::install)
    /// or apply [`ddl`](Self::ddl) with your migration tool first.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when `config` does not
    /// validate.
    pub fn new(pool: SqlitePool, config: SqliteOutboxConfig) -> Result<Self> {
        config.validate()?;
        let name = config.table_name()?;
        let sql = Statements::new(&name, &config);
        Ok(SqliteOutbox {
            pool,
            inner: Arc::new(Inner { config, name, sql }),
        })
    }

    /// The pool this outbox claims with.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The settings.
    pub fn config(&self) -> &SqliteOutboxConfig {
        &self.inner.config
    }

    /// The table, validated; displays as `"table"`, the name
    /// [`Schema::name`](outbox_core::schema::Schema::name) gives this outbox.
    pub fn qualified_name(&self) -> &TableName {
        &self.inner.name
    }

    /// The DDL for this outbox's table: idempotent statements creating the version
    /// table, the table and its indexes, and recording the layout version (the default
    /// names' DDL is checked in as `sql/outbox.sql`).
    pub fn ddl(&self) -> String {
        let name = &self.inner.name;
        schema::ddl(name, &schema::outbox_objects(name))
    }

    /// Create the table and indexes if missing, and record the layout version. Safe to
    /// call from every process at start-up.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists at
    /// another layout version; mapped driver errors otherwise.
    pub async fn install(&self) -> Result<()> {
        let name = &self.inner.name;
        schema::install(&self.pool, name, &schema::outbox_objects(name)).await
    }

    /// Enqueue `messages` on `conn`, which should be inside your open transaction (pass
    /// `&mut *tx`). Never commits.
    ///
    /// - Every message is checked against the config's
    ///   [`MessageLimits`](outbox_core::MessageLimits) first; one bad message, or an id
    ///   given twice, rejects the batch before anything is sent.
    /// - The batch is inserted in slice order (so per-key order follows the slice) in
    ///   one statement per thousand messages, inside a savepoint of your transaction (a
    ///   transaction of its own on a connection outside one): if any id is already
    ///   stored, or a statement fails, the savepoint is rolled back and the batch
    ///   writes nothing, **without** ending your transaction. Begin your transaction
    ///   through sqlx (`pool.begin_with(..)`, `Connection::begin`), which tracks the
    ///   nesting; a `BEGIN` sent as plain SQL is not seen, and the enqueue fails.
    /// - `created_at` is the time of this call (host clock), and each message is due
    ///   `delay` after it.
    /// - Start write transactions with `pool.begin_with("BEGIN IMMEDIATE")`. A plain
    ///   `BEGIN` starts as a reader, and once it has read, SQLite refuses to make it a
    ///   writer at once, without waiting out the busy timeout, when another connection
    ///   holds the write lock (`SQLITE_BUSY`) or has committed since the read
    ///   (`SQLITE_BUSY_SNAPSHOT`); both are reported as a retryable
    ///   [`ErrorKind::Contention`](outbox_core::ErrorKind::Contention), and the whole
    ///   transaction must be retried.
    ///
    /// ```no_run
    /// # async fn demo(outbox: outbox_sqlite::SqliteOutbox, relay: outbox_core::Relay) -> outbox_core::Result<()> {
    /// use outbox_core::NewMessage;
    ///
    /// let mut tx = outbox.pool().begin_with("BEGIN IMMEDIATE").await.expect("begin");
    /// // ... business writes on &mut *tx ...
    /// let msg = NewMessage::builder("orders.created").payload(b"{}".to_vec()).build()?;
    /// outbox.enqueue(&mut tx, &[msg]).await?;
    /// tx.commit().await.expect("commit");
    /// relay.wakeup().wake();
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// - [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) for a message
    ///   over the limits; [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) for
    ///   an id given twice in the batch. Nothing was sent.
    /// - [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) naming the ids
    ///   already stored. Nothing was written; the transaction is usable.
    /// - Mapped driver errors otherwise; nothing of the batch was written. When the
    ///   error made SQLite roll back your whole transaction (a full disk, an I/O error),
    ///   [`ErrorKind::Storage`](outbox_core::ErrorKind::Storage) says so, with the cause
    ///   as its source: begin again.
    pub async fn enqueue(
        &self,
        conn: &mut SqliteConnection,
        messages: &[NewMessage],
    ) -> Result<()> {
        check_enqueue(messages, self.inner.config.limits())?;
        if messages.is_empty() {
            return Ok(());
        }
        let delays = messages
            .iter()
            .map(|m| micros("delay", m.delay()))
            .collect::<Result<Vec<_>>>()?;
        // A savepoint inside the caller's transaction, or a transaction of its own on a
        // bare connection; dropped unfinished (the caller's future cancelled), sqlx rolls
        // it back before the connection is used again.
        let mut batch = sqlx::Connection::begin(&mut *conn)
            .await
            .map_err(|e| from_sqlx("enqueue", e))?;
        let outcome = self.insert(&mut batch, messages, &delays).await;
        match outcome {
            Ok(stored) if stored.is_empty() => {
                batch.commit().await.map_err(|e| from_sqlx("enqueue", e))
            }
            outcome => match batch.rollback().await {
                Ok(()) => Err(match outcome {
                    Ok(stored) => Error::already_stored(stored),
                    Err(err) => err,
                }),
                // Errors such as a full disk make SQLite roll back the whole transaction,
                // the savepoint with it; the caller must know the transaction is gone.
                Err(e) => Err(Error::new(
                    ErrorKind::Storage,
                    "enqueue failed and SQLite rolled back the whole transaction: begin \
                     it again",
                )
                .with_source(outcome.err().unwrap_or_else(|| from_sqlx("enqueue", e)))),
            },
        }
    }

    /// Enqueue one message; see [`enqueue`](Self::enqueue).
    ///
    /// # Errors
    /// As [`enqueue`](Self::enqueue).
    pub async fn enqueue_one(
        &self,
        conn: &mut SqliteConnection,
        message: &NewMessage,
    ) -> Result<()> {
        self.enqueue(conn, std::slice::from_ref(message)).await
    }

    /// Insert `messages` in chunks, skipping stored ids; returns the ids skipped.
    async fn insert(
        &self,
        conn: &mut SqliteConnection,
        messages: &[NewMessage],
        delays: &[i64],
    ) -> Result<Vec<MessageId>> {
        let now = now_us();
        let mut stored = Vec::new();
        for (chunk, delays) in messages
            .chunks(INSERT_CHUNK)
            .zip(delays.chunks(INSERT_CHUNK))
        {
            let sql = insert_sql(&self.inner.name, chunk.len());
            let mut query = sqlx::query_scalar::<_, Vec<u8>>(&sql).bind(now);
            for (m, delay) in chunk.iter().zip(delays) {
                query = query
                    .bind(m.id().as_uuid().as_bytes().to_vec())
                    .bind(m.destination().to_owned())
                    .bind(m.partition_key().map(str::to_owned))
                    .bind(m.payload().to_vec())
                    .bind(m.content_type().map(str::to_owned))
                    .bind(m.headers().to_json().to_string())
                    .bind(*delay);
            }
            let inserted: HashSet<Vec<u8>> = query
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| from_sqlx("enqueue", e))?
                .into_iter()
                .collect();
            stored.extend(
                chunk
                    .iter()
                    .map(NewMessage::id)
                    .filter(|id| !inserted.contains(id.as_uuid().as_bytes().as_slice())),
            );
        }
        Ok(stored)
    }

    /// The text of the statements a claim and a complete run (the due select, the
    /// lease update, the complete), for benchmarks that run the library's own SQL
    /// through sqlx directly (`outbox-bench/benches/sqlite_bench.rs`). Not a stable API.
    #[doc(hidden)]
    pub fn claim_complete_sql(&self) -> [&str; 3] {
        let sql = &self.inner.sql;
        [&sql.claim_select, &sql.claim_update, &sql.complete]
    }

    /// The statements a relay's calls send, by name (`claim_select`,
    /// `claim_ids_select`, `claim_update`, `dead_letter_claimed`, `complete`, `fail`,
    /// `release`, `purge_dispatched`), for the plan suite (`tests/sqlite/plan_suite.rs`): SQLite keeps no
    /// registry of prepared statements to read them back from. Not a stable API.
    #[doc(hidden)]
    pub fn relay_sql(&self, name: &str) -> Option<&str> {
        let sql = &self.inner.sql;
        Some(match name {
            "claim_select" => &sql.claim_select,
            "claim_ids_select" => &sql.claim_ids_select,
            "claim_update" => &sql.claim_update,
            "dead_letter_claimed" => &sql.dead_letter_claimed,
            "complete" => &sql.complete,
            "fail" => &sql.fail,
            "release" => &sql.release,
            "purge_dispatched" => &sql.admin.purge_dispatched,
            _ => return None,
        })
    }

    pub(crate) fn statements(&self) -> &Statements {
        &self.inner.sql
    }

    async fn claim_with(
        &self,
        select: &str,
        limit: usize,
        lease: std::time::Duration,
        ids: Option<String>,
    ) -> Result<Claimed> {
        let lease_us = micros("lease", lease)?;
        let select_due = |now: i64| {
            let query = sqlx::query_as::<_, (i64, i64)>(select)
                .bind(limit_param(limit))
                .bind(now);
            match &ids {
                Some(ids) => query.bind(ids.clone()),
                None => query,
            }
        };
        // An idle poll reads only: WAL readers do not wait for the writer.
        let any_due = select_due(now_us())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| from_sqlx("claim", e))?;
        if any_due.is_none() {
            return Ok(Claimed::default());
        }
        let err = |e| from_sqlx("claim", e);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
        let now = now_us();
        let due = select_due(now).fetch_all(&mut *tx).await.map_err(err)?;
        if due.is_empty() {
            return Ok(Claimed::default());
        }
        let order: Vec<i64> = due.iter().map(|(seq, _)| *seq).collect();
        let token = LeaseToken::new();
        let rows = sqlx::query(&self.inner.sql.claim_update)
            .bind(json!(order).to_string())
            .bind(now.saturating_add(lease_us))
            .bind(token.as_uuid().as_bytes().to_vec())
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        // A schema problem returns here, and dropping `tx` rolls the claim back.
        let decoded = decode_claimed(&rows, &order, token, self.inner.config.limits())?;
        let dead_lettered = decoded.poison.len();
        if !decoded.poison.is_empty() {
            let poison: Vec<(i64, String)> = decoded
                .poison
                .into_iter()
                .map(|(seq, reason)| (seq, bounded_error(reason)))
                .collect();
            tracing::warn!(
                ?poison,
                "dead-lettering claimed outbox rows that cannot be delivered"
            );
            sqlx::query(&self.inner.sql.dead_letter_claimed)
                .bind(json!(poison).to_string())
                .bind(now)
                .bind(token.as_uuid().as_bytes().to_vec())
                .execute(&mut *tx)
                .await
                .map_err(|e| from_sqlx("dead-lettering undeliverable rows", e))?;
        }
        tx.commit().await.map_err(err)?;
        Ok(Claimed::new(decoded.claimed).with_dead_lettered(dead_lettered))
    }

    /// Run a settle statement (`?1` the JSON batch, `?2` now when `with_now`) and
    /// report which of `requested` it applied.
    async fn settle(
        &self,
        what: &str,
        sql: &str,
        batch: serde_json::Value,
        with_now: bool,
        requested: impl Iterator<Item = MessageId>,
    ) -> Result<Settled> {
        let mut query = sqlx::query(sql).bind(batch.to_string());
        if with_now {
            query = query.bind(now_us());
        }
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| from_sqlx(what, e))?;
        let applied = rows
            .iter()
            .map(|row| uuid_at(row, 0).map(MessageId::from_uuid))
            .collect::<Result<Vec<_>>>()?;
        Ok(Settled::reconcile(requested, applied))
    }
}

/// The batch insert for `n` messages: `?1` now, then seven values per message.
fn insert_sql(t: &TableName, n: usize) -> String {
    let rows: Vec<String> = (0..n)
        .map(|k| {
            let b = 2 + 7 * k;
            format!(
                "(?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?1, ?1 + ?{})",
                b,
                b + 1,
                b + 2,
                b + 3,
                b + 4,
                b + 5,
                b + 6
            )
        })
        .collect();
    format!(
        "INSERT INTO {t} (id, destination, partition_key, payload, content_type, headers, \
         created_at, available_at) VALUES {} ON CONFLICT (id) DO NOTHING RETURNING id",
        rows.join(", ")
    )
}

/// A lease as `[id, token]` in hex, the form the settle statements read.
fn lease_json(lease: &Lease) -> serde_json::Value {
    json!([
        lease.id.as_uuid().simple().to_string(),
        lease.token.as_uuid().simple().to_string()
    ])
}

/// Text SQLite functions handle whole: NUL would cut it short.
fn storable(text: &str) -> String {
    text.replace('\0', "\u{fffd}")
}

#[async_trait]
impl OutboxStore for SqliteOutbox {
    fn capabilities(&self) -> StoreCapabilities {
        let config = &self.inner.config;
        StoreCapabilities::new(config.ordering(), config.retention())
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Claimed> {
        let sql = &self.inner.sql.claim_select;
        self.claim_with(sql, request.limit(), request.lease(), None)
            .await
    }

    async fn claim_ids(&self, request: &ClaimIds) -> Result<Claimed> {
        let ids = request.ids();
        if ids.is_empty() {
            return Ok(Claimed::default());
        }
        let hex: Vec<String> = ids
            .iter()
            .map(|id| id.as_uuid().simple().to_string())
            .collect();
        let sql = &self.inner.sql.claim_ids_select;
        let ids_json = Some(json!(hex).to_string());
        self.claim_with(sql, ids.len(), request.lease(), ids_json)
            .await
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Settled> {
        if leases.is_empty() {
            return Ok(Settled::default());
        }
        let batch = leases.iter().map(lease_json).collect();
        let keep = self.inner.config.retention() != outbox_core::Retention::Delete;
        let sql = &self.inner.sql.complete;
        self.settle("complete", sql, batch, keep, leases.iter().map(|l| l.id))
            .await
    }

    async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        if failures.is_empty() {
            return Ok(Settled::default());
        }
        let mut batch = Vec::with_capacity(failures.len());
        for failure in failures {
            let (dead, after) = match failure.disposition() {
                // Beyond MAX_DELAY (ten years) a retry time could overflow.
                Disposition::Retry { after } => (0, after.min(MAX_DELAY)),
                Disposition::DeadLetter => (1, std::time::Duration::ZERO),
            };
            let [id, token] = [
                failure.lease().id.as_uuid(),
                failure.lease().token.as_uuid(),
            ]
            .map(|u| u.simple().to_string());
            batch.push(json!([
                id,
                token,
                storable(failure.error()),
                dead,
                micros("retry delay", after)?
            ]));
        }
        let sql = &self.inner.sql.fail;
        let requested = failures.iter().map(|f| f.lease().id);
        self.settle("fail", sql, batch.into(), true, requested)
            .await
    }

    async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        if leases.is_empty() {
            return Ok(Settled::default());
        }
        let batch = leases.iter().map(lease_json).collect();
        let sql = &self.inner.sql.release;
        self.settle("release", sql, batch, true, leases.iter().map(|l| l.id))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_number_their_parameters_per_row() {
        let t = TableName::new("t").unwrap();
        let sql = insert_sql(&t, 2);
        assert!(sql.contains(
            "VALUES (?2, ?3, ?4, ?5, ?6, ?7, ?1, ?1 + ?8), (?9, ?10, ?11, ?12, ?13, ?14, ?1, ?1 + ?15)"
        ));
        assert!(sql.ends_with("ON CONFLICT (id) DO NOTHING RETURNING id"));
        assert_eq!(storable("a\0b"), "a\u{fffd}b");
    }
}
