//! [`MssqlDistributedLock`]: a [`DistributedLock`] on `sp_getapplock`.

use std::fmt;

use async_trait::async_trait;

use outbox_core::{DistributedLock, LockGuard, LockName, Result};

use crate::error::from_tiberius;
use crate::exec::{query_all_rows, row_i32, row_str};
use crate::session::{dedicated, MssqlClient, MssqlPool};
use crate::sql::{Binder, Param, Stmt};

/// Take `name` for the session without waiting, then report the mode the session
/// holds it in (`Exclusive` when granted, `NoLock` when another session holds it) and
/// the session id.
pub(crate) fn try_lock(name: &str) -> Stmt {
    let mut b = Binder::default();
    let resource = b.bind(Param::Text(Some(name.to_owned())));
    b.finish(format!(
        "EXEC sp_getapplock @Resource = {resource}, @LockMode = 'Exclusive', \
         @LockOwner = 'Session', @LockTimeout = 0; \
         SELECT APPLOCK_MODE('public', {resource}, 'Session') AS mode, \
         CAST(@@SPID AS int) AS session_id;"
    ))
}

/// Release `name` if the session holds it, and report what it holds afterwards.
pub(crate) fn unlock(name: &str) -> Stmt {
    let mut b = Binder::default();
    let resource = b.bind(Param::Text(Some(name.to_owned())));
    b.finish(format!(
        "IF APPLOCK_MODE('public', {resource}, 'Session') <> 'NoLock' \
         EXEC sp_releaseapplock @Resource = {resource}, @LockOwner = 'Session'; \
         SELECT APPLOCK_MODE('public', {resource}, 'Session') AS mode;"
    ))
}

/// Named locks shared by every process using the same database, for singleton work
/// such as purging (see [`Purger`](outbox_core::Purger)).
///
/// # Protocol
///
/// 1. [`try_lock`](DistributedLock::try_lock) opens a dedicated connection (not a
///    pooled one) and runs `sp_getapplock` with `@LockOwner = 'Session'` and
///    `@LockTimeout = 0` (granted or refused at once, never waiting), then reads
///    `APPLOCK_MODE` to learn which.
/// 2. The returned guard owns that connection: the lock lives exactly as long as the
///    session.
/// 3. [`unlock`](LockGuard::unlock) runs `sp_releaseapplock` and closes the
///    connection.
/// 4. Dropping a guard without unlocking drops the connection: the socket closes, the
///    server ends the session and releases the lock.
///
/// ## Limitations
///
/// - Application locks are per database and share one name space with every other
///   user of `sp_getapplock` in it; names are compared as binary strings (case
///   matters) and are at most 255 characters, which [`LockName`]'s 255-byte limit
///   guarantees.
/// - Each held lock is one open connection.
/// - A lock lost with its session (a killed session, a network cut) is not noticed by
///   the holder until its next statement; keep singleton work idempotent.
#[derive(Debug, Clone)]
pub struct MssqlDistributedLock {
    pool: MssqlPool,
}

impl MssqlDistributedLock {
    /// Locks taken on `pool`'s database, each on a dedicated connection of its own
    /// (opened by the pool's manager, never pooled).
    pub fn new(pool: MssqlPool) -> Self {
        MssqlDistributedLock { pool }
    }
}

#[async_trait]
impl DistributedLock for MssqlDistributedLock {
    async fn try_lock(&self, name: &LockName) -> Result<Option<Box<dyn LockGuard>>> {
        let mut client = dedicated(&self.pool, "open a lock connection").await?;
        let rows = query_all_rows(&mut client, try_lock(name.as_str()))
            .await
            .map_err(|e| from_tiberius("sp_getapplock", e))?;
        let row = rows
            .first()
            .ok_or_else(|| crate::error::decode_error("sp_getapplock returned no row"))?;
        if row_str(row, "mode")? == "Exclusive" {
            Ok(Some(Box::new(MssqlLockGuard {
                name: name.clone(),
                session_id: row_i32(row, "session_id")?,
                client: Some(client),
            })))
        } else {
            // Held elsewhere (refused at once: @LockTimeout = 0). The connection
            // closes.
            Ok(None)
        }
    }
}

/// A held [`MssqlDistributedLock`]; see its protocol. `Debug` shows the holding
/// session's id (`@@SPID`), which operators can look up in `sys.dm_tran_locks`.
struct MssqlLockGuard {
    name: LockName,
    session_id: i32,
    client: Option<MssqlClient>,
}

impl fmt::Debug for MssqlLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MssqlLockGuard")
            .field("name", &self.name)
            .field("session_id", &self.session_id)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LockGuard for MssqlLockGuard {
    fn name(&self) -> &LockName {
        &self.name
    }

    async fn unlock(mut self: Box<Self>) -> Result<()> {
        let Some(mut client) = self.client.take() else {
            return Ok(());
        };
        let released = query_all_rows(&mut client, unlock(self.name.as_str())).await;
        // Whatever the answer, the session ends here, which releases the lock too.
        drop(client);
        match released {
            Ok(rows) => {
                if rows
                    .first()
                    .map(|r| row_str(r, "mode"))
                    .transpose()?
                    .as_deref()
                    != Some("NoLock")
                {
                    tracing::warn!(name = %self.name, "application lock still held after release; its session closes");
                }
                Ok(())
            }
            Err(e) => Err(from_tiberius("sp_releaseapplock", e)),
        }
    }
}

impl Drop for MssqlLockGuard {
    fn drop(&mut self) {
        if self.client.take().is_some() {
            tracing::debug!(name = %self.name, "lock guard dropped; its session closes");
        }
    }
}
