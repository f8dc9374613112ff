//! [`PgAdvisoryLock`]: a [`DistributedLock`] on PostgreSQL session advisory locks.

use std::fmt;

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};

use outbox_core::{DistributedLock, Error, LockGuard, Result};

use crate::error::from_sqlx;

/// Longest lock name accepted, in bytes.
pub const MAX_LOCK_NAME_LEN: usize = 200;

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
/// - Each held lock occupies one pool connection; size the pool for it.
/// - A lock lost with its session (a killed backend, a network cut) is not noticed by
///   the holder until its next statement; keep singleton work idempotent.
#[derive(Debug, Clone)]
pub struct PgAdvisoryLock {
    pool: PgPool,
}

impl PgAdvisoryLock {
    /// Locks taken on `pool`'s database.
    pub fn new(pool: PgPool) -> Self {
        PgAdvisoryLock { pool }
    }
}

fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_LOCK_NAME_LEN {
        return Err(Error::invalid_input(format!(
            "lock name must be 1 to {MAX_LOCK_NAME_LEN} bytes, got {}",
            name.len()
        )));
    }
    if name.contains('\0') {
        return Err(Error::invalid_input("lock name contains a NUL character"));
    }
    Ok(())
}

#[async_trait]
impl DistributedLock for PgAdvisoryLock {
    async fn try_lock(&self, name: &str) -> Result<Option<Box<dyn LockGuard>>> {
        validate_name(name)?;
        let conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| from_sqlx("acquire lock connection", e))?;
        // Own the connection in a guard before taking the lock, so that if this future
        // is dropped mid-statement the connection is closed, not pooled.
        let mut guard = PgLockGuard {
            name: name.to_owned(),
            conn: Some(conn),
        };
        let conn = guard.conn.as_mut().expect("connection set above");
        let locked: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
                .bind(name)
                .fetch_one(&mut **conn)
                .await
                .map_err(|e| from_sqlx("try advisory lock", e))?;
        if locked {
            Ok(Some(Box::new(guard)))
        } else {
            // Nothing held: the connection can go back to the pool.
            drop(guard.conn.take());
            Ok(None)
        }
    }
}

/// A held [`PgAdvisoryLock`]; see its protocol.
pub struct PgLockGuard {
    name: String,
    conn: Option<PoolConnection<Postgres>>,
}

impl fmt::Debug for PgLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLockGuard")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LockGuard for PgLockGuard {
    fn name(&self) -> &str {
        &self.name
    }

    async fn unlock(mut self: Box<Self>) -> Result<()> {
        let Some(mut conn) = self.conn.take() else {
            return Ok(());
        };
        let unlocked =
            sqlx::query_scalar::<_, bool>("SELECT pg_advisory_unlock(hashtextextended($1, 0))")
                .bind(&self.name)
                .fetch_one(&mut *conn)
                .await;
        match unlocked {
            Ok(true) => Ok(()),
            Ok(false) => {
                tracing::warn!(name = %self.name, "advisory lock was not held at unlock");
                Ok(())
            }
            Err(e) => {
                // The lock may still be held: end the session rather than pool it.
                drop(conn.detach());
                Err(from_sqlx("advisory unlock", e))
            }
        }
    }
}

impl Drop for PgLockGuard {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            tracing::debug!(name = %self.name, "lock guard dropped; closing its session");
            // Dropping the detached connection closes its socket; the server ends the
            // session and releases the lock.
            drop(conn.detach());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn names_are_validated() {
        assert!(validate_name("outbox-purge").is_ok());
        assert!(validate_name(&"n".repeat(MAX_LOCK_NAME_LEN)).is_ok());
        for bad in [
            String::new(),
            "n".repeat(MAX_LOCK_NAME_LEN + 1),
            "a\0b".into(),
        ] {
            assert_eq!(
                validate_name(&bad).unwrap_err().kind(),
                ErrorKind::InvalidInput
            );
        }
    }
}
