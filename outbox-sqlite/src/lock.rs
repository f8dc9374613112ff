//! [`SqliteDistributedLock`]: a [`DistributedLock`] for the processes sharing one
//! database file, as leased rows.
//!
//! A lock is a row `(name, holder, expires_at)`. `try_lock` inserts it, or takes over
//! a row whose lease ran out, in one statement; it never waits for a holder (only,
//! like every write, for SQLite's write lock). A guard renews its lease every third of
//! the lease from a background task and deletes the row on
//! [`unlock`](LockGuard::unlock) or when dropped (from a spawned task, when a Tokio
//! runtime is running). A holder that dies frees the lock when its lease runs out.
//!
//! ## Limitations
//!
//! - Renewal is a write, so it waits for SQLite's write lock like any other: a
//!   renewal held up past the busy timeout is retried at once, and the lease (at least
//!   [`SqliteLockConfig::MIN_LEASE`](crate::SqliteLockConfig::MIN_LEASE), three busy
//!   timeouts) leaves room for three such attempts.
//! - A holder stalled for longer than the lease (a blocked runtime, a suspended
//!   process) loses the lock without knowing: another process may take it. Keep the
//!   work under the lock idempotent (purges are), or the lease well above any stall.
//! - Exclusion holds among processes on one host: SQLite's own locking is not reliable
//!   on network file systems.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::SqlitePool;
use tokio::task::JoinHandle;
use uuid::Uuid;

use outbox_core::{lock::LockGuard, DistributedLock, LockName, Result};

use crate::config::SqliteLockConfig;
use crate::error::from_sqlx;
use crate::ident::TableName;
use crate::schema::{ddl, install, lock_objects};
use crate::time::{micros, now_us};

/// Named locks in an SQLite table, leased and renewed by their holders.
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> outbox_core::Result<()> {
/// use outbox_core::{DistributedLock, LockName};
/// use outbox_sqlite::{SqliteDistributedLock, SqliteLockConfig};
///
/// let locks = SqliteDistributedLock::new(pool, SqliteLockConfig::default())?;
/// locks.install().await?;
/// if let Some(guard) = locks.try_lock(&LockName::new("purge")?).await? {
///     // ... the work only one process may do at a time ...
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteDistributedLock {
    pool: SqlitePool,
    name: TableName,
    lease: Duration,
    lease_us: i64,
}

impl SqliteDistributedLock {
    /// Locks on `pool` with `config`. Runs no SQL.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when `config` does not
    /// validate.
    pub fn new(pool: SqlitePool, config: SqliteLockConfig) -> Result<Self> {
        config.validate()?;
        Ok(SqliteDistributedLock {
            pool,
            name: config.table_name()?,
            lease: config.lease(),
            lease_us: micros("lock lease", config.lease())?,
        })
    }

    /// The DDL for the lock table, idempotent (the default name's DDL is checked in as
    /// `sql/locks.sql`).
    pub fn ddl(&self) -> String {
        ddl(&self.name, &lock_objects(&self.name))
    }

    /// Create the table if missing and record the layout version.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists at
    /// another layout version; mapped driver errors otherwise.
    pub async fn install(&self) -> Result<()> {
        install(&self.pool, &self.name, &lock_objects(&self.name)).await
    }
}

#[async_trait]
impl DistributedLock for SqliteDistributedLock {
    async fn try_lock(&self, name: &LockName) -> Result<Option<Box<dyn LockGuard>>> {
        let t = &self.name;
        let holder = Uuid::new_v4();
        let now = now_us();
        let taken = sqlx::query(&format!(
            "INSERT INTO {t} AS l (name, holder, expires_at) VALUES (?1, ?2, ?3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
             expires_at = excluded.expires_at WHERE l.expires_at <= ?4"
        ))
        .bind(name.as_str())
        .bind(holder.as_bytes().to_vec())
        .bind(now.saturating_add(self.lease_us))
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(|e| from_sqlx("take lock", e))?;
        if taken.rows_affected() == 0 {
            return Ok(None);
        }
        let renewal = tokio::spawn(renew(self.clone(), name.clone(), holder, self.lease / 3));
        Ok(Some(Box::new(SqliteLockGuard {
            lock: self.clone(),
            name: name.clone(),
            holder,
            renewal: Some(renewal),
        })))
    }
}

/// How soon a failed renewal is tried again.
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(100);

/// Extend the lease every `every` while the row is still ours; stop when it is not.
async fn renew(lock: SqliteDistributedLock, name: LockName, holder: Uuid, every: Duration) {
    let sql = format!(
        "UPDATE {} SET expires_at = ?3 WHERE name = ?1 AND holder = ?2",
        lock.name
    );
    let mut wait = every;
    loop {
        tokio::time::sleep(wait).await;
        let renewed = sqlx::query(&sql)
            .bind(name.as_str())
            .bind(holder.as_bytes().to_vec())
            .bind(now_us().saturating_add(lock.lease_us))
            .execute(&lock.pool)
            .await;
        wait = match renewed {
            Ok(done) if done.rows_affected() == 1 => every,
            Ok(_) => {
                tracing::error!(lock = %name, "lock lease lapsed and was taken over; renewal stops");
                return;
            }
            // The failed attempt already waited out the busy timeout: try again soon,
            // while the lease still runs.
            Err(e) => {
                let err = from_sqlx("renew lock", e);
                tracing::warn!(lock = %name, error = %err.report(), "could not renew lock lease; retrying");
                RETRY_AFTER_FAILURE
            }
        };
    }
}

/// A held [`SqliteDistributedLock`].
struct SqliteLockGuard {
    lock: SqliteDistributedLock,
    name: LockName,
    holder: Uuid,
    renewal: Option<JoinHandle<()>>,
}

impl fmt::Debug for SqliteLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteLockGuard")
            .field("name", &self.name)
            .field("table", &self.lock.name)
            .finish_non_exhaustive()
    }
}

impl SqliteLockGuard {
    async fn delete(lock: &SqliteDistributedLock, name: &LockName, holder: Uuid) -> Result<()> {
        sqlx::query(&format!(
            "DELETE FROM {} WHERE name = ?1 AND holder = ?2",
            lock.name
        ))
        .bind(name.as_str())
        .bind(holder.as_bytes().to_vec())
        .execute(&lock.pool)
        .await
        .map(|_| ())
        .map_err(|e| from_sqlx("release lock", e))
    }
}

#[async_trait]
impl LockGuard for SqliteLockGuard {
    fn name(&self) -> &LockName {
        &self.name
    }

    async fn unlock(mut self: Box<Self>) -> Result<()> {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        Self::delete(&self.lock, &self.name, self.holder).await
    }
}

impl Drop for SqliteLockGuard {
    fn drop(&mut self) {
        let Some(renewal) = self.renewal.take() else {
            return; // unlocked
        };
        renewal.abort();
        // Dropped while held: release from a task if a runtime runs, else the lease
        // runs out.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (lock, name, holder) = (self.lock.clone(), self.name.clone(), self.holder);
            runtime.spawn(async move {
                if let Err(err) = SqliteLockGuard::delete(&lock, &name, holder).await {
                    tracing::warn!(lock = %name, error = %err.report(), "dropped lock not released; its lease runs out instead");
                }
            });
        }
    }
}
