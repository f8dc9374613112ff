//! [`MySqlDistributedLock`]: a [`DistributedLock`] on `GET_LOCK`.

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::{MySql, MySqlPool};

use outbox_core::backend::{LockSession, SessionLockGuard};
use outbox_core::{lock::LockGuard, DistributedLock, LockName, Result};

use crate::error::from_sqlx;

/// The server-side name of a lock named `?`: `outbox:` and the SHA-224 of the name in
/// hex, 63 characters, under the server's 64-character limit whatever the name.
pub(crate) const LOCK_KEY: &str = "CONCAT('outbox:', SHA2(?, 224))";

/// Named locks shared by every client of the same server, for singleton work such as
/// purging (see [`Purger`](outbox_core::Purger)).
///
/// # Protocol
///
/// 1. [`try_lock`](DistributedLock::try_lock) takes a connection from the pool and runs
///    `GET_LOCK(CONCAT('outbox:', SHA2(name, 224)), 0)` on it, never waiting.
/// 2. The returned guard owns that connection: the lock lives as long as the session.
/// 3. [`unlock`](LockGuard::unlock) runs `RELEASE_LOCK` and returns the connection to
///    the pool; when the release fails, or the lock was no longer held, the connection
///    is closed instead.
/// 4. Dropping a guard without unlocking closes its connection, so the server ends the
///    session and frees the lock; a lock-holding connection never returns to the pool.
///
/// ## Limitations
///
/// - Names map to SHA-224 digests (names of up to 255 bytes, compared byte for byte,
///   do not fit the server's 64 characters): two names sharing a lock would need a
///   SHA-224 collision. `GET_LOCK` names are server-wide, not per database.
/// - Each held lock occupies one pool connection; size the pool for it.
/// - A lock lost with its session (a killed connection) is not noticed by the holder
///   until its next statement; keep singleton work idempotent.
#[derive(Debug, Clone)]
pub struct MySqlDistributedLock {
    pool: MySqlPool,
}

impl MySqlDistributedLock {
    /// Locks taken on `pool`'s server.
    pub fn new(pool: MySqlPool) -> Self {
        MySqlDistributedLock { pool }
    }
}

#[async_trait]
impl DistributedLock for MySqlDistributedLock {
    async fn try_lock(&self, name: &LockName) -> Result<Option<Box<dyn LockGuard>>> {
        let acquired = self.pool.acquire().await;
        let session = Session(acquired.map_err(|e| from_sqlx("acquire lock connection", e))?);
        // The guard owns the session before the lock is taken: a future dropped
        // mid-statement closes the connection instead of pooling it.
        let mut guard = SessionLockGuard::new(name.clone(), session);
        let get_lock = format!("SELECT GET_LOCK({LOCK_KEY}, 0) <=> 1");
        let query = sqlx::query_scalar(&get_lock).bind(name.as_str());
        match query.fetch_one(&mut *guard.session_mut().0).await {
            Ok(true) => Ok(Some(Box::new(guard))),
            Ok(false) => {
                drop(guard.into_session());
                Ok(None)
            }
            Err(e) => Err(from_sqlx("GET_LOCK", e)),
        }
    }
}

/// The pooled connection a [`MySqlDistributedLock`] is held on.
#[derive(Debug)]
struct Session(PoolConnection<MySql>);

#[async_trait]
impl LockSession for Session {
    async fn release(&mut self, name: &LockName) -> Result<bool> {
        let released: Option<i64> = sqlx::query_scalar(&format!("SELECT RELEASE_LOCK({LOCK_KEY})"))
            .bind(name.as_str())
            .fetch_one(&mut *self.0)
            .await
            .map_err(|e| from_sqlx("RELEASE_LOCK", e))?;
        Ok(released == Some(1))
    }

    fn end(self) {
        drop(self.0.detach());
    }
}
