//! Removing dispatched history in bounded batches: [`Purger`].

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::lock::DistributedLock;
use crate::store::{OutboxStore, Retention};

/// The lock name a [`Purger`] takes by default.
pub const PURGE_LOCK: &str = "outbox-purge";

/// Deletes dispatched messages older than the store's [`Retention::Keep`] window, one
/// bounded batch at a time, while holding a [`DistributedLock`] so only one process in a
/// fleet purges. Under [`Retention::Delete`] there is no history and it does nothing.
///
/// Each batch is its own short statement, so a purge never holds locks on a large part
/// of the table and never touches pending, in-flight or dead messages.
#[derive(Debug, Clone)]
pub struct Purger {
    store: Arc<dyn OutboxStore>,
    lock: Arc<dyn DistributedLock>,
    lock_name: String,
    batch: usize,
    max_batches: usize,
}

/// What one [`Purger::run_once`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurgeRun {
    /// Another process holds the purge lock; nothing was done.
    Skipped,
    /// This many rows were deleted.
    Purged(u64),
}

impl Purger {
    /// Purge `store`'s expired history, `batch` rows per statement, at most 100
    /// statements per run.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for a zero batch.
    pub fn new(
        store: Arc<dyn OutboxStore>,
        lock: Arc<dyn DistributedLock>,
        batch: usize,
    ) -> Result<Self> {
        if batch == 0 {
            return Err(Error::config("purge batch must be at least 1"));
        }
        Ok(Purger {
            store,
            lock,
            lock_name: PURGE_LOCK.to_owned(),
            batch,
            max_batches: 100,
        })
    }

    /// Use another lock name (for example one per outbox table).
    pub fn lock_name(mut self, name: impl Into<String>) -> Self {
        self.lock_name = name.into();
        self
    }

    /// Purge until a batch comes back short or the per-run statement cap is reached.
    /// Call it periodically (every few minutes) from every instance; the lock makes
    /// all but one skip.
    ///
    /// # Errors
    /// Lock or store errors; the lock is released either way.
    pub async fn run_once(&self) -> Result<PurgeRun> {
        let Retention::Keep { window } = self.store.capabilities().retention else {
            return Ok(PurgeRun::Purged(0));
        };
        let Some(guard) = self.lock.try_lock(&self.lock_name).await? else {
            return Ok(PurgeRun::Skipped);
        };
        let mut total = 0;
        let mut outcome = Ok(());
        for _ in 0..self.max_batches {
            match self.store.purge_dispatched(window, self.batch).await {
                Ok(n) => {
                    total += n;
                    if n < self.batch as u64 {
                        break;
                    }
                }
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        let unlocked = guard.unlock().await;
        outcome?;
        unlocked?;
        tracing::debug!(purged = total, "purged dispatched messages");
        Ok(PurgeRun::Purged(total))
    }
}
