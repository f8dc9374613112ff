//! Held-lock claims ([`ClaimMode::HeldLock`](outbox_core::ClaimMode::HeldLock)) on
//! PostgreSQL: the row lock is the lease. The kit's
//! [`HeldBatches`](outbox_core::backend::HeldBatches) keeps the open batches; this
//! module is its engine.
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

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use outbox_core::backend::{
    bounded_error, DecodedClaim, HeldEngine, HeldRows, HeldSelect, HeldWhich,
};
use outbox_core::message::MAX_DELAY;
use outbox_core::{store::Disposition, store::Failure, Error, MessageId, MessageLimits, Result};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::error::from_sqlx;
use crate::held_sql::HeldStatements;
use crate::row::{decode_claimed, get};
use crate::sql::{limit_param, micros};

/// The PostgreSQL statements of held-lock claims, for the kit's
/// [`HeldBatches`](outbox_core::backend::HeldBatches).
pub(crate) struct PgHeld {
    /// The held transactions' connections.
    pool: PgPool,
    /// Registry writes and sweeps: the relay pool.
    registry: PgPool,
    sql: HeldStatements,
    limits: MessageLimits,
}

fn uuids(ids: &[MessageId]) -> Vec<Uuid> {
    ids.iter().map(MessageId::as_uuid).collect()
}

fn message_ids(ids: Vec<Uuid>) -> Vec<MessageId> {
    ids.into_iter().map(MessageId::from_uuid).collect()
}

impl PgHeld {
    pub(crate) fn new(
        pool: PgPool,
        registry: PgPool,
        sql: HeldStatements,
        limits: MessageLimits,
    ) -> Self {
        PgHeld {
            pool,
            registry,
            sql,
            limits,
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

    /// Run one sweep statement: `(gone, charged, kept)`.
    async fn sweep_one(&self) -> Result<(i64, i64, i64)> {
        let row = sqlx::query(&self.sql.sweep)
            .fetch_one(&self.registry)
            .await
            .map_err(|e| from_sqlx("sweep", e))?;
        Ok((
            get(&row, "gone")?,
            get(&row, "charged")?,
            get(&row, "kept")?,
        ))
    }
}

#[async_trait]
impl HeldEngine for PgHeld {
    type Tx = Transaction<'static, Postgres>;

    async fn begin(&self) -> Result<Self::Tx> {
        self.pool
            .begin()
            .await
            .map_err(|e| from_sqlx("claim (begin)", e))
    }

    async fn select(&self, tx: &mut Self::Tx, select: HeldSelect<'_>) -> Result<HeldRows> {
        let (sql, ids) = match select.which {
            HeldWhich::Due => (&self.sql.claim, None),
            HeldWhich::Ids(ids) => (&self.sql.claim_ids, Some(uuids(ids))),
            HeldWhich::Excluding(ids) => (&self.sql.claim_excluding, Some(uuids(ids))),
        };
        let mut query = sqlx::query(sql)
            .bind(limit_param(select.limit))
            .bind(micros("lease", select.lease)?);
        if let Some(ids) = ids {
            query = query.bind(ids);
        }
        let conn: &mut PgConnection = tx;
        let rows: Vec<PgRow> = query
            .fetch_all(conn)
            .await
            .map_err(|e| from_sqlx("claim", e))?;
        let Some(first) = rows.first() else {
            return Ok(HeldRows {
                decoded: DecodedClaim {
                    claimed: Vec::new(),
                    poison: Vec::new(),
                },
                batch: String::new(),
            });
        };
        let batch: String = get(first, "held_xid")?;
        let decoded = decode_claimed(&rows, select.token, &self.limits)?;
        Ok(HeldRows {
            decoded: decoded.map_ids(MessageId::from_uuid),
            batch,
        })
    }

    async fn dead_letter(
        &self,
        tx: &mut Self::Tx,
        poison: Vec<(MessageId, String)>,
    ) -> Result<usize> {
        let (ids, reasons): (Vec<Uuid>, Vec<String>) = poison
            .into_iter()
            .map(|(id, reason)| (id.as_uuid(), crate::store::storable(bounded_error(reason))))
            .unzip();
        let done: Vec<Uuid> = sqlx::query_scalar(&self.sql.dead_letter)
            .bind(ids)
            .bind(reasons)
            .fetch_all(&mut **tx)
            .await
            .map_err(|e| from_sqlx("dead-lettering undeliverable rows", e))?;
        Ok(done.len())
    }

    /// The sweep tells live batches by their transaction's status, so the record is
    /// not locked.
    async fn register(&self, _tx: &mut Self::Tx, batch: &str, ids: &[MessageId]) -> Result<()> {
        sqlx::query(&self.sql.register)
            .bind(batch)
            .bind(uuids(ids))
            .execute(&self.registry)
            .await
            .map_err(|e| from_sqlx("claim (registering the batch)", e))?;
        Ok(())
    }

    async fn complete(&self, tx: &mut Self::Tx, ids: &[MessageId]) -> Result<Vec<MessageId>> {
        let done: Vec<Uuid> = sqlx::query_scalar(&self.sql.complete)
            .bind(uuids(ids))
            .fetch_all(&mut **tx)
            .await
            .map_err(|e| from_sqlx("complete", e))?;
        Ok(message_ids(done))
    }

    async fn fail(&self, tx: &mut Self::Tx, failures: &[&Failure]) -> Result<Vec<MessageId>> {
        let mut ids = Vec::with_capacity(failures.len());
        let mut errors = Vec::with_capacity(failures.len());
        let mut dead = Vec::with_capacity(failures.len());
        let mut retry_us = Vec::with_capacity(failures.len());
        for failure in failures {
            let (is_dead, after) = match failure.disposition() {
                Disposition::Retry { after } => (false, after.min(MAX_DELAY)),
                Disposition::DeadLetter => (true, Duration::ZERO),
            };
            ids.push(failure.lease().id.as_uuid());
            errors.push(crate::store::storable(failure.error().to_owned()));
            dead.push(is_dead);
            retry_us.push(micros("retry delay", after)?);
        }
        let done: Vec<Uuid> = sqlx::query_scalar(&self.sql.fail)
            .bind(ids)
            .bind(errors)
            .bind(dead)
            .bind(retry_us)
            .fetch_all(&mut **tx)
            .await
            .map_err(|e| from_sqlx("fail", e))?;
        Ok(message_ids(done))
    }

    /// The settles delete the registry row in their statement; a batch ended by a
    /// release ran none, so it deletes the row here. Commit and begin are one round
    /// trip.
    async fn finish(&self, mut tx: Self::Tx, by_release: bool) -> Result<Self::Tx> {
        if by_release {
            let done = sqlx::query(&self.sql.unregister).execute(&mut *tx).await;
            if let Err(err) = done {
                self.abandon(tx).await;
                return Err(from_sqlx("release", err));
            }
        }
        let conn: &mut PgConnection = &mut tx;
        let done = sqlx::Executor::execute(conn, "COMMIT; BEGIN").await;
        if let Err(err) = done {
            self.abandon(tx).await;
            return Err(from_sqlx("settle (commit)", err));
        }
        Ok(tx)
    }

    async fn restart(&self, mut tx: Self::Tx) -> Result<Self::Tx> {
        let conn: &mut PgConnection = &mut tx;
        let done = sqlx::Executor::execute(conn, "ROLLBACK; BEGIN").await;
        if let Err(err) = done {
            self.abandon(tx).await;
            return Err(from_sqlx("claim (rolling back an empty claim)", err));
        }
        Ok(tx)
    }

    async fn abandon(&self, tx: Self::Tx) {
        if let Err(err) = tx.rollback().await {
            tracing::debug!(error = %err, "rolling back an ended held batch");
        }
    }

    async fn renew(&self, tx: &mut Self::Tx, lease: Duration) -> Result<SystemTime> {
        let row: PgRow = sqlx::query(&self.sql.renew)
            .bind(micros("lease", lease)?)
            .fetch_one(&mut **tx)
            .await
            .map_err(|e| from_sqlx("renew", e))?;
        let expires: chrono::DateTime<chrono::Utc> = get(&row, "expires_at")?;
        Ok(SystemTime::from(expires))
    }

    /// One statement per ended batch; a batch left with locked messages waits for a
    /// later sweep, and so does whatever lies past it.
    async fn sweep(&self) -> Result<u64> {
        let mut charged_total = 0u64;
        for _ in 0..MAX_SWEPT_BATCHES {
            let (gone, charged, kept) = self.sweep_one().await?;
            charged_total += u64::try_from(charged).unwrap_or(0);
            if gone == 0 || kept > 0 {
                break;
            }
        }
        Ok(charged_total)
    }

    fn session_gone(&self, err: &Error) -> bool {
        session_gone(err)
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
