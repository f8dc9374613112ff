//! [`MssqlDistributedLock`]: a [`DistributedLock`] on `sp_getapplock`.

use std::fmt;

use async_trait::async_trait;

use outbox_core::backend::{LockSession, SessionLockGuard};
use outbox_core::{lock::LockGuard, DistributedLock, LockName, Result};

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
        let client = dedicated(&self.pool, "open a lock connection").await?;
        let mut guard = SessionLockGuard::new(
            name.clone(),
            Session {
                session_id: None,
                client,
            },
        );
        let session = guard.session_mut();
        let rows = query_all_rows(&mut session.client, try_lock(name.as_str()))
            .await
            .map_err(|e| from_tiberius("sp_getapplock", e))?;
        let row = rows
            .first()
            .ok_or_else(|| crate::error::decode_error("sp_getapplock returned no row"))?;
        session.session_id = Some(row_i32(row, "session_id")?);
        if row_str(row, "mode")? == "Exclusive" {
            Ok(Some(Box::new(guard)))
        } else {
            // Held elsewhere (refused at once: @LockTimeout = 0). The connection
            // closes.
            drop(guard.into_session());
            Ok(None)
        }
    }
}

/// The dedicated connection a [`MssqlDistributedLock`] is held on; see its protocol.
/// `Debug` shows its session id (`@@SPID`), which operators can look up in
/// `sys.dm_tran_locks`.
struct Session {
    session_id: Option<i32>,
    client: MssqlClient,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MssqlLockSession")
            .field("session_id", &self.session_id)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LockSession for Session {
    async fn release(&mut self, name: &LockName) -> Result<bool> {
        let rows = query_all_rows(&mut self.client, unlock(name.as_str()))
            .await
            .map_err(|e| from_tiberius("sp_releaseapplock", e))?;
        let mode = rows.first().map(|r| row_str(r, "mode")).transpose()?;
        Ok(mode.as_deref() == Some("NoLock"))
    }

    /// The connection is dedicated: dropping it always ends the session.
    fn end(self) {}
}
