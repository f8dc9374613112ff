//! Held-lock claims ([`ClaimMode::HeldLock`](outbox_core::ClaimMode::HeldLock)) on
//! InnoDB: the row lock is the lease. The kit's
//! [`HeldBatches`](outbox_core::backend::HeldBatches) keeps the open batches; this
//! module is its engine.
//!
//! # Protocol
//!
//! 1. A claim runs on a connection of the held pool (READ COMMITTED, so locking reads
//!    take no gap locks) in a transaction. One statement picks the due rows no open
//!    batch has registered by a plain read of `<table>_due` (per-key heads included),
//!    then locks them by primary key `FOR UPDATE SKIP LOCKED` and reads them, writing
//!    nothing (see `held_sql` for why not one locking range scan). Before it, the session's
//!    `idle_transaction_timeout` is set to the lease in whole seconds (rounded up; sent
//!    only when it changes), so a relay that hangs between statements for longer has
//!    its connection ended by the server, which rolls the batch back. That setting is
//!    MariaDB's: MySQL has no bound on an idle transaction, and a claim there fails with
//!    a [`Config`](outbox_core::ErrorKind::Config) error.
//!    The claim also takes the batch's user-level lock (`GET_LOCK('obx-held-<batch>',
//!    0)`, in its select list: no round trip of its own), which the session holds
//!    until the batch ends and the server frees if the session dies.
//! 2. The batch is registered: one row of `<table>_held` (the claim's token, the ids as
//!    a JSON array), inserted on the relay pool and committed before anything is
//!    published, then locked `FOR UPDATE` in the batch's transaction.
//! 3. Settles run in the claim's transaction, by primary key, with no token to match.
//!    The settle that leaves no lease open deletes the registry row and sends `COMMIT;
//!    DO RELEASE_ALL_LOCKS(); BEGIN` in one round trip, keeping the new transaction for
//!    the next claim.
//! 4. A batch that never commits rolls back, which unlocks its registry row. InnoDB
//!    cannot say whether another session's transaction is alive, so the **sweep** asks
//!    the locks instead: it locks registry rows `SKIP LOCKED`, which passes over every
//!    live batch's, then the rows' undelivered messages `SKIP LOCKED`. Every message it
//!    can lock belongs to a batch that ended without an outcome: it is charged one
//!    attempt. A registry row keeps the ids still locked (a dead batch's messages
//!    another claim took meanwhile) and is deleted when none are left. (A sweep that
//!    read live batches' rows deadlocked with them: a locking read waits on a row a
//!    live batch has deleted, `SKIP LOCKED` or not, while that batch waits for its
//!    registry row.) The sweep also passes over rows whose batch's user-level lock is
//!    held: between the registry row's commit and the batch's lock on it, only that
//!    lock says the batch lives. (Without it a sweep that took the row in that moment
//!    deadlocked with the batch, about one held-mode suite run in four.) The sweep runs
//!    at READ COMMITTED, so the rows it passes over are not kept locked.
//!
//! Cost per batch: the claim, the registry insert (another connection) and its lock,
//! a settle statement per publish call, the registry delete and the commit.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use chrono::NaiveDateTime;
use outbox_core::backend::{bounded_error, HeldEngine, HeldRows, HeldSelect, HeldWhich};
use outbox_core::backend::{limit_param, micros};
use outbox_core::{store::Failure, Error, ErrorKind, MessageId, MessageLimits, Result};
use sqlx::{MySql, MySqlConnection, MySqlPool, Transaction};
use uuid::Uuid;

use crate::error::{from_sqlx, number};
use crate::held_sql::{batch_lock, HeldStatements};
use crate::row::decode_claimed;
use crate::sql::{json_hex, padded, with_ids};
use crate::store::{fail_rows, failure_rows};

/// A held transaction and what its session has armed.
pub(crate) struct HeldTx {
    tx: Transaction<'static, MySql>,
    /// The registry key of the batch it holds, once a claim took rows.
    batch: Option<Uuid>,
    /// The session's `idle_transaction_timeout`, seconds, once this store set it.
    armed: Option<u64>,
}

/// The InnoDB statements of held-lock claims.
pub(crate) struct MySqlHeld {
    /// The held transactions' connections.
    pool: MySqlPool,
    /// Registry writes and sweeps: the relay pool.
    registry: MySqlPool,
    sql: HeldStatements,
    limits: MessageLimits,
}

/// The most seconds MariaDB's `idle_transaction_timeout` takes (one year).
const MAX_IDLE_SECONDS: u64 = 31_536_000;

/// `lease` as the whole seconds of an idle timeout: rounded up, at least 1.
fn idle_seconds(lease: Duration) -> u64 {
    let whole = lease.as_secs() + u64::from(lease.subsec_nanos() > 0);
    whole.clamp(1, MAX_IDLE_SECONDS)
}

fn uuids(ids: &[MessageId]) -> Vec<Uuid> {
    ids.iter().map(MessageId::as_uuid).collect()
}

impl MySqlHeld {
    pub(crate) fn new(
        pool: MySqlPool,
        registry: MySqlPool,
        sql: HeldStatements,
        limits: MessageLimits,
    ) -> Self {
        MySqlHeld {
            pool,
            registry,
            sql,
            limits,
        }
    }

    /// The held transactions' pool.
    pub(crate) fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The statements.
    pub(crate) fn statements(&self) -> &HeldStatements {
        &self.sql
    }

    /// Set the session's idle bound to `lease`, unless it is set to that already.
    async fn arm(&self, tx: &mut HeldTx, lease: Duration) -> Result<()> {
        let seconds = idle_seconds(lease);
        if tx.armed == Some(seconds) {
            return Ok(());
        }
        let result = sqlx::query(&self.sql.arm)
            .bind(seconds)
            .execute(&mut *tx.tx)
            .await;
        match result {
            Ok(_) => {
                tx.armed = Some(seconds);
                Ok(())
            }
            // Unknown system variable: a MySQL server.
            Err(err) if number(&err) == Some(1193) => Err(Error::new(
                ErrorKind::Config,
                "held-lock claims need MariaDB's idle_transaction_timeout to end the \
                 transaction of a relay that hangs; this server has none (MySQL)",
            )),
            Err(err) => Err(from_sqlx("claim (idle timeout)", err)),
        }
    }

    /// The sweep's one transaction: see the [module docs](self).
    async fn sweep_once(&self) -> Result<u64> {
        let err = |e| from_sqlx("sweep", e);
        // READ COMMITTED, whatever the relay pool's level: the registry rows of live
        // batches that the first read passes over are unlocked at once.
        let mut conn = self.registry.acquire().await.map_err(err)?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(err)?;
        let rows: Vec<(String, String)> = sqlx::query_as(&self.sql.swept)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        if rows.is_empty() {
            tx.rollback().await.map_err(err)?;
            return Ok(0);
        }
        let mut batches: Vec<(String, Vec<Uuid>)> = Vec::with_capacity(rows.len());
        for (batch, ids) in rows {
            let ids: Vec<String> = serde_json::from_str(&ids)
                .map_err(|e| Error::new(ErrorKind::Decode, format!("registry row {batch}: {e}")))?;
            let ids = ids
                .iter()
                .map(|h| Uuid::parse_str(h))
                .collect::<std::result::Result<Vec<Uuid>, _>>()
                .map_err(|e| Error::new(ErrorKind::Decode, format!("registry row {batch}: {e}")))?;
            batches.push((batch, ids));
        }
        let listed = json_hex(batches.iter().flat_map(|(_, ids)| ids.iter().copied()));
        let free: Vec<Uuid> = sqlx::query_scalar(&self.sql.free)
            .bind(&listed)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        let undelivered: Vec<Uuid> = sqlx::query_scalar(&self.sql.undelivered)
            .bind(&listed)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        let charged = if free.is_empty() {
            0
        } else {
            sqlx::query(&self.sql.charge)
                .bind(json_hex(free.iter().copied()))
                .execute(&mut *tx)
                .await
                .map_err(err)?
                .rows_affected()
        };
        let free: HashSet<Uuid> = free.into_iter().collect();
        let busy: HashSet<Uuid> = undelivered
            .into_iter()
            .filter(|id| !free.contains(id))
            .collect();
        let mut ended = Vec::new();
        for (batch, ids) in &batches {
            let left: Vec<Uuid> = ids.iter().copied().filter(|id| busy.contains(id)).collect();
            if left.is_empty() {
                ended.push(serde_json::Value::from(batch.as_str()));
            } else if left.len() < ids.len() {
                sqlx::query(&self.sql.keep)
                    .bind(json_hex(left))
                    .bind(batch)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
            }
        }
        if !ended.is_empty() {
            sqlx::query(&self.sql.drop_batches)
                .bind(serde_json::Value::from(ended).to_string())
                .execute(&mut *tx)
                .await
                .map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        Ok(charged)
    }
}

#[async_trait]
impl HeldEngine for MySqlHeld {
    type Tx = HeldTx;

    async fn begin(&self) -> Result<HeldTx> {
        let tx = self
            .pool
            .begin()
            .await
            .map_err(|e| from_sqlx("claim (begin)", e))?;
        Ok(HeldTx {
            tx,
            batch: None,
            armed: None,
        })
    }

    async fn select(&self, tx: &mut HeldTx, select: HeldSelect<'_>) -> Result<HeldRows> {
        self.arm(tx, select.lease).await?;
        let (sql, ids) = match select.which {
            HeldWhich::Ids(ids) => (with_ids(&self.sql.claim_ids, ids.len()), uuids(ids)),
            HeldWhich::Excluding(ids) if !ids.is_empty() => {
                (with_ids(&self.sql.claim_excluding, ids.len()), uuids(ids))
            }
            HeldWhich::Due | HeldWhich::Excluding(_) => (self.sql.claim.clone(), Vec::new()),
        };
        let batch = select.token.as_uuid();
        let hex = batch.simple().to_string();
        let query = sqlx::query(&sql)
            .bind(micros("lease", select.lease)?)
            .bind(batch_lock(&hex));
        let limit = limit_param(select.limit);
        let rows = padded(&ids)
            .fold(query, |q, id| q.bind(id))
            .bind(limit)
            .bind(limit)
            .fetch_all(&mut *tx.tx)
            .await
            .map_err(|e| from_sqlx("claim", e))?;
        let decoded = decode_claimed(&rows, select.token, &self.limits)?;
        tx.batch = (!rows.is_empty()).then_some(batch);
        Ok(HeldRows {
            decoded: decoded.map_ids(MessageId::from_uuid),
            batch: hex,
        })
    }

    async fn dead_letter(
        &self,
        tx: &mut HeldTx,
        poison: Vec<(MessageId, String)>,
    ) -> Result<usize> {
        let token = outbox_core::store::LeaseToken::new();
        let reasons: Vec<(Uuid, String)> = poison
            .into_iter()
            .map(|(id, why)| (id.as_uuid(), bounded_error(why)))
            .collect();
        let rows = reasons
            .iter()
            .map(|(id, why)| (*id, token, why.as_str(), true, 0));
        let done = sqlx::query(&self.sql.fail)
            .bind(fail_rows(rows))
            .execute(&mut *tx.tx)
            .await
            .map_err(|e| from_sqlx("dead-lettering undeliverable rows", e))?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(0))
    }

    /// Inserted on the relay pool, then locked in the batch's transaction, so sweeps
    /// skip it for as long as the batch lives (and never wait on its messages).
    async fn register(&self, tx: &mut HeldTx, batch: &str, ids: &[MessageId]) -> Result<()> {
        sqlx::query(&self.sql.register)
            .bind(batch)
            .bind(json_hex(uuids(ids)))
            .execute(&self.registry)
            .await
            .map_err(|e| from_sqlx("claim (registering the batch)", e))?;
        sqlx::query(&self.sql.hold)
            .bind(batch)
            .execute(&mut *tx.tx)
            .await
            .map_err(|e| from_sqlx("claim (holding the batch's record)", e))?;
        Ok(())
    }

    async fn complete(&self, tx: &mut HeldTx, ids: &[MessageId]) -> Result<Vec<MessageId>> {
        sqlx::query(&self.sql.complete)
            .bind(json_hex(uuids(ids)))
            .execute(&mut *tx.tx)
            .await
            .map_err(|e| from_sqlx("complete", e))?;
        // The rows are locked by this transaction since the claim, undelivered.
        Ok(ids.to_vec())
    }

    async fn fail(&self, tx: &mut HeldTx, failures: &[&Failure]) -> Result<Vec<MessageId>> {
        sqlx::query(&self.sql.fail)
            .bind(failure_rows(failures.iter().copied())?)
            .execute(&mut *tx.tx)
            .await
            .map_err(|e| from_sqlx("fail", e))?;
        Ok(failures.iter().map(|f| f.lease().id).collect())
    }

    async fn finish(&self, mut tx: HeldTx, _by_release: bool) -> Result<HeldTx> {
        if let Some(batch) = tx.batch.take() {
            let done = sqlx::query(&self.sql.unregister)
                .bind(batch)
                .execute(&mut *tx.tx)
                .await;
            if let Err(err) = done {
                self.abandon(tx).await;
                return Err(from_sqlx("settle (ending the batch)", err));
            }
        }
        let conn: &mut MySqlConnection = &mut tx.tx;
        let done = sqlx::Executor::execute(conn, self.sql.commit).await;
        if let Err(err) = done {
            self.abandon(tx).await;
            return Err(from_sqlx("settle (commit)", err));
        }
        Ok(tx)
    }

    async fn restart(&self, mut tx: HeldTx) -> Result<HeldTx> {
        let conn: &mut MySqlConnection = &mut tx.tx;
        let done = sqlx::Executor::execute(conn, self.sql.rollback).await;
        if let Err(err) = done {
            self.abandon(tx).await;
            return Err(from_sqlx("claim (rolling back an empty claim)", err));
        }
        Ok(tx)
    }

    async fn abandon(&self, mut tx: HeldTx) {
        // The batch's lock first: its registry row stays locked until the rollback.
        let conn: &mut MySqlConnection = &mut tx.tx;
        if let Err(err) = sqlx::Executor::execute(conn, "DO RELEASE_ALL_LOCKS()").await {
            tracing::debug!(error = %err, "releasing an ended held batch's lock");
        }
        if let Err(err) = tx.tx.rollback().await {
            tracing::debug!(error = %err, "rolling back an ended held batch");
        }
    }

    /// Any statement restarts the idle clock; the bound changes only with the lease.
    async fn renew(&self, tx: &mut HeldTx, lease: Duration) -> Result<SystemTime> {
        self.arm(tx, lease).await?;
        let expires: NaiveDateTime =
            sqlx::query_scalar("SELECT UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND")
                .bind(micros("lease", lease)?)
                .fetch_one(&mut *tx.tx)
                .await
                .map_err(|e| from_sqlx("renew", e))?;
        Ok(expires.and_utc().into())
    }

    async fn sweep(&self) -> Result<u64> {
        self.sweep_once().await
    }

    fn session_gone(&self, err: &Error) -> bool {
        session_gone(err)
    }
}

/// Whether `err` means the held transaction's session is gone: the connection broke,
/// or the server ended it (idle transaction timeout, `KILL`, shutdown).
fn session_gone(err: &Error) -> bool {
    use std::error::Error as _;
    let mut source = err.source();
    while let Some(cause) = source {
        if let Some(sqlx_err) = cause.downcast_ref::<sqlx::Error>() {
            return match sqlx_err {
                sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::PoolClosed => true,
                // Shutdown, network errors, connection killed, client idle timeout.
                other => number(other).is_some_and(|n| {
                    matches!(n, 1053 | 1152 | 1158..=1161 | 1927 | 2006 | 2013 | 4031)
                }),
            };
        }
        source = cause.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_bound_is_the_lease_in_whole_seconds_rounded_up() {
        assert_eq!(idle_seconds(Duration::from_millis(1)), 1);
        assert_eq!(idle_seconds(Duration::from_secs(30)), 30);
        assert_eq!(idle_seconds(Duration::from_millis(30_001)), 31);
        assert_eq!(
            idle_seconds(Duration::from_secs(u64::MAX)),
            MAX_IDLE_SECONDS
        );
    }

    #[test]
    fn ids_are_a_json_array_of_hex() {
        let id = Uuid::from_u128(0xab);
        assert_eq!(json_hex([id]), format!("[\"{}\"]", id.simple()));
    }

    #[test]
    fn a_broken_connection_is_a_gone_session() {
        let io = from_sqlx(
            "settle",
            sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
        );
        assert!(session_gone(&io));
        assert!(!session_gone(&Error::new(ErrorKind::Storage, "other")));
    }
}
