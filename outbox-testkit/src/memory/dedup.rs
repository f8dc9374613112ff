//! In-memory [`DedupStore`] and [`DistributedLock`] for tests and single-process use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_core::{
    lock::LockGuard, Consistency, ConsumerName, Dedup, DedupStore, DistributedLock, Error,
    ErrorKind, LockName, MessageId, Result,
};

/// A strongly consistent in-process [`DedupStore`] with a retention period.
///
/// Expired ids count as absent on every read, purged or not, as the contract asks.
/// Clones share the same records.
#[derive(Debug, Clone)]
pub struct MemoryDedupStore {
    retention: Duration,
    seen: Arc<Mutex<HashMap<(ConsumerName, MessageId), Instant>>>,
}

impl MemoryDedupStore {
    /// An empty store remembering ids for `retention`.
    pub fn new(retention: Duration) -> Self {
        MemoryDedupStore {
            retention,
            seen: Arc::default(),
        }
    }

    /// How long ids are remembered.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    fn seen(&self) -> MutexGuard<'_, HashMap<(ConsumerName, MessageId), Instant>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fresh(&self, at: Instant) -> bool {
        at.elapsed() < self.retention
    }
}

#[async_trait]
impl DedupStore for MemoryDedupStore {
    fn consistency(&self) -> Consistency {
        Consistency::Strong
    }

    async fn contains(&self, consumer: &ConsumerName, id: MessageId) -> Result<bool> {
        let key = (consumer.clone(), id);
        Ok(self.seen().get(&key).is_some_and(|at| self.fresh(*at)))
    }

    async fn record(&self, consumer: &ConsumerName, id: MessageId) -> Result<Dedup> {
        let mut seen = self.seen();
        let key = (consumer.clone(), id);
        match seen.get(&key) {
            Some(at) if self.fresh(*at) => Ok(Dedup::Duplicate),
            _ => {
                seen.insert(key, Instant::now());
                Ok(Dedup::New)
            }
        }
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        let mut seen = self.seen();
        let expired: Vec<_> = seen
            .iter()
            .filter(|(_, at)| !self.fresh(**at))
            .map(|(key, _)| key.clone())
            .take(limit)
            .collect();
        for key in &expired {
            seen.remove(key);
        }
        Ok(expired.len() as u64)
    }
}

/// An in-process [`DistributedLock`]: exclusive among clones of the same value.
///
/// Every held lock is its own session, as on PostgreSQL where each guard owns a
/// connection. [`end_session`](Self::end_session) ends one the way a crashed process or
/// a cut connection would: the lock is free at once, and the orphaned guard can no
/// longer release anything, so whoever takes the name next keeps it. Its
/// [`unlock`](LockGuard::unlock) then reports [`ErrorKind::Unavailable`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> outbox_core::Result<()> {
/// use outbox_core::{DistributedLock, LockName};
/// use outbox_testkit::MemoryLock;
///
/// let lock = MemoryLock::new();
/// let name = LockName::new("purge")?;
/// let guard = lock.try_lock(&name).await?.expect("free");
/// assert!(lock.end_session(&name), "as if the holder died");
/// let next = lock.try_lock(&name).await?.expect("released with the session");
/// drop(guard); // the orphaned guard does not release `next`
/// assert!(lock.try_lock(&name).await?.is_none());
/// next.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryLock {
    table: Arc<Mutex<Sessions>>,
}

/// Which session holds each name.
#[derive(Debug, Default)]
struct Sessions {
    held: HashMap<LockName, u64>,
    next: u64,
}

impl MemoryLock {
    /// No locks held.
    pub fn new() -> Self {
        Self::default()
    }

    /// The names held right now, each by its own session, sorted.
    pub fn sessions(&self) -> Vec<LockName> {
        let mut names: Vec<_> = self.table().held.keys().cloned().collect();
        names.sort();
        names
    }

    /// End the session holding `name`, as if its process died: the lock is released at
    /// once and its guard is orphaned. Returns whether a session held it.
    pub fn end_session(&self, name: &LockName) -> bool {
        self.table().held.remove(name).is_some()
    }

    fn table(&self) -> MutexGuard<'_, Sessions> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl DistributedLock for MemoryLock {
    async fn try_lock(&self, name: &LockName) -> Result<Option<Box<dyn LockGuard>>> {
        let mut table = self.table();
        if table.held.contains_key(name) {
            return Ok(None);
        }
        table.next += 1;
        let session = table.next;
        table.held.insert(name.clone(), session);
        Ok(Some(Box::new(MemoryLockGuard {
            name: name.clone(),
            session,
            lock: self.clone(),
        })))
    }
}

#[derive(Debug)]
struct MemoryLockGuard {
    name: LockName,
    session: u64,
    lock: MemoryLock,
}

impl MemoryLockGuard {
    /// Release the lock if this guard's session still holds it; returns whether it did.
    fn release(&self) -> bool {
        let mut table = self.lock.table();
        if table.held.get(&self.name) == Some(&self.session) {
            table.held.remove(&self.name);
            true
        } else {
            false
        }
    }
}

impl Drop for MemoryLockGuard {
    fn drop(&mut self) {
        self.release();
    }
}

#[async_trait]
impl LockGuard for MemoryLockGuard {
    fn name(&self) -> &LockName {
        &self.name
    }

    async fn unlock(self: Box<Self>) -> Result<()> {
        if self.release() {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::Unavailable,
                format!("the session of lock {:?} ended before unlock", self.name),
            ))
        }
    }
}
