//! Removing old rows in bounded batches, once at a time across a fleet: [`Purger`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::admin::{OutboxAdmin, MAX_ADMIN_BATCH};
use crate::dedup::DedupStore;
use crate::error::{Error, Result};
use crate::lock::DistributedLock;
use crate::names::LockName;
use crate::store::{OutboxStore, Retention};

/// The lock name a [`Purger`] of outbox history takes by default.
pub const PURGE_LOCK: &str = "outbox-purge";
/// The lock name a [`Purger`] of dedup records takes by default.
pub const DEDUP_PURGE_LOCK: &str = "outbox-dedup-purge";

/// What a [`Purger`] removes.
#[derive(Debug, Clone)]
enum Target {
    /// Dispatched outbox rows older than the window.
    History {
        admin: Arc<dyn OutboxAdmin>,
        window: Option<Duration>,
    },
    /// Dedup records past their retention.
    Dedup(Arc<dyn DedupStore>),
}

/// Deletes old rows one bounded batch at a time while holding a [`DistributedLock`],
/// so only one process in a fleet purges: dispatched outbox messages older than the
/// store's [`Retention::Keep`] window ([`for_outbox`](Self::for_outbox)), or dedup
/// records past their retention ([`for_dedup`](Self::for_dedup)).
///
/// Each batch is its own short statement, so a purge never holds locks on a large part
/// of the table and never touches pending, in-flight or dead messages. Run it now and
/// then with [`run_once`](Self::run_once), or let [`spawn`](Self::spawn) do so.
#[derive(Debug, Clone)]
pub struct Purger {
    target: Target,
    lock: Arc<dyn DistributedLock>,
    lock_name: LockName,
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
    /// Purge `store`'s dispatched history older than its [`Retention::Keep`] window,
    /// `batch` rows per statement (1 to [`MAX_ADMIN_BATCH`]), at most 100 statements per
    /// run. Under [`Retention::Delete`] there is no history and runs do nothing.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for a batch out of bounds.
    pub fn for_outbox<S>(
        store: Arc<S>,
        lock: Arc<dyn DistributedLock>,
        batch: usize,
    ) -> Result<Self>
    where
        S: OutboxStore + OutboxAdmin + 'static,
    {
        let window = match store.capabilities().retention {
            Retention::Keep { window } => Some(window),
            Retention::Delete => None,
        };
        let target = Target::History {
            admin: store,
            window,
        };
        Purger::new(target, lock, PURGE_LOCK, batch)
    }

    /// Purge `dedup`'s expired records, `batch` per statement (1 to
    /// [`MAX_ADMIN_BATCH`]), at most 100 statements per run.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for a batch out of bounds.
    pub fn for_dedup(
        dedup: Arc<dyn DedupStore>,
        lock: Arc<dyn DistributedLock>,
        batch: usize,
    ) -> Result<Self> {
        Purger::new(Target::Dedup(dedup), lock, DEDUP_PURGE_LOCK, batch)
    }

    fn new(
        target: Target,
        lock: Arc<dyn DistributedLock>,
        lock_name: &str,
        batch: usize,
    ) -> Result<Self> {
        if batch == 0 || batch > MAX_ADMIN_BATCH {
            return Err(Error::config(format!(
                "purge batch {batch} is outside 1..={MAX_ADMIN_BATCH}"
            )));
        }
        Ok(Purger {
            target,
            lock,
            lock_name: LockName::new(lock_name)?,
            batch,
            max_batches: 100,
        })
    }

    /// Use another lock name (for example one per outbox table).
    #[must_use]
    pub fn with_lock_name(mut self, name: LockName) -> Self {
        self.lock_name = name;
        self
    }

    /// Purge until a batch comes back short or the per-run statement cap is reached.
    /// Call it periodically (every few minutes) from every instance; the lock makes
    /// all but one skip.
    ///
    /// # Errors
    /// Lock or store errors; the lock is released either way.
    pub async fn run_once(&self) -> Result<PurgeRun> {
        if let Target::History { window: None, .. } = self.target {
            return Ok(PurgeRun::Purged(0));
        }
        let Some(guard) = self.lock.try_lock(&self.lock_name).await? else {
            return Ok(PurgeRun::Skipped);
        };
        let mut total = 0;
        let mut outcome = Ok(());
        for _ in 0..self.max_batches {
            match self.purge_batch().await {
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
        tracing::debug!(purged = total, lock = %self.lock_name, "purged");
        Ok(PurgeRun::Purged(total))
    }

    async fn purge_batch(&self) -> Result<u64> {
        match &self.target {
            Target::History { admin, window } => {
                let window = window.unwrap_or(Duration::MAX);
                admin.purge_dispatched(window, self.batch).await
            }
            Target::Dedup(dedup) => dedup.purge_expired(self.batch).await,
        }
    }

    /// Run [`run_once`](Self::run_once) every `interval` in a new task until
    /// `shutdown` resolves (for example `token.cancelled_owned()` of the service's
    /// `CancellationToken`). Errors are logged with their causes; the next run tries
    /// again.
    pub fn spawn(
        self,
        interval: Duration,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut shutdown = std::pin::pin!(shutdown);
            let mut tick = tokio::time::interval(interval.max(Duration::from_millis(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = &mut shutdown => break,
                    _ = tick.tick() => {}
                }
                if let Err(err) = self.run_once().await {
                    tracing::warn!(lock = %self.lock_name, error = %err.report(), "purge failed");
                }
            }
        })
    }
}
