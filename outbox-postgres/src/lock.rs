//! [`PgDistributedLock`]: a [`DistributedLock`] on PostgreSQL session advisory locks.

use std::fmt;

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};

use outbox_core::backend::{LockSession, SessionLockGuard};
use outbox_core::{lock::LockGuard, DistributedLock, LockName, Result};

use crate::error::from_sqlx;

/// Named locks shared by every process using the same database, for singleton work
/// such as purging (see [`Purger`](outbox_core::Purger)).
///
/// # Protocol
///
/// 1. [`try_lock`](DistributedLock::try_lock) takes a connection from the pool and runs
///    `pg_try_advisory_lock(hashtextextended(name, 0))` on it, never waiting.
/// 2. The returned guard owns that connection: the lock lives exactly as long as the
///    database session.
/// 3. [`unlock`](LockGuard::unlock) runs `pg_advisory_unlock` and returns the
///    connection to the pool.
/// 4. Dropping a guard without unlocking detaches its connection from the pool and
///    closes it, so the session ends and the server releases the lock; a lock-holding
///    connection is never handed to other pool users.
///
/// ## Limitations
///
/// - Names are hashed to 64 bits, so two different names could in principle share a
///   lock (never the reverse). Advisory locks taken by other software on the same
///   database share the key space.
/// - Names arrive validated ([`LockName`]) and are hashed as text by the server, so on
///   a database whose encoding is not UTF-8, a name with characters that encoding lacks
///   fails with the driver's error.
/// - Each held lock occupies one pool connection; size the pool for it.
/// - A lock lost with its session (a killed backend, a network cut) is not noticed by
///   the holder until its next statement; keep singleton work idempotent.
#[derive(Debug, Clone)]
pub struct PgDistributedLock {
    pool: PgPool,
}

impl PgDistributedLock {
    /// Locks taken on `pool`'s database.
    pub fn new(pool: PgPool) -> Self {
        PgDistributedLock { pool }
    }
}

#[async_trait]
impl DistributedLock for PgDistributedLock {
    async fn try_lock(&self, name: &LockName) -> Result<Option<Box<dyn LockGuard>>> {
        let conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| from_sqlx("acquire lock connection", e))?;
        // Own the connection in a guard before taking the lock, so that if this future
        // is dropped mid-statement the connection is closed, not pooled.
        let mut guard = SessionLockGuard::new(name.clone(), Session(conn));
        let locked: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
                .bind(name.as_str())
                .fetch_one(&mut *guard.session_mut().0)
                .await
                .map_err(|e| from_sqlx("try advisory lock", e))?;
        if locked {
            Ok(Some(Box::new(guard)))
        } else {
            // Nothing held: the connection can go back to the pool.
            drop(guard.into_session());
            Ok(None)
        }
    }
}

/// The pooled connection a [`PgDistributedLock`] is held on; see its protocol.
struct Session(PoolConnection<Postgres>);

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLockSession").finish_non_exhaustive()
    }
}

#[async_trait]
impl LockSession for Session {
    async fn release(&mut self, name: &LockName) -> Result<bool> {
        sqlx::query_scalar("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
            .bind(name.as_str())
            .fetch_one(&mut *self.0)
            .await
            .map_err(|e| from_sqlx("advisory unlock", e))
    }

    fn end(self) {
        // Dropping the detached connection closes its socket; the server ends the
        // session and releases the lock.
        drop(self.0.detach());
    }
}
