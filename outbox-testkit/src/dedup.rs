//! In-memory [`DedupStore`] and [`DistributedLock`] for tests and single-process use.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_core::{
    Consistency, Dedup, DedupStore, DistributedLock, Error, LockGuard, MessageId, Result,
};

/// A strongly consistent in-process [`DedupStore`] with a retention period.
#[derive(Debug, Clone)]
pub struct MemoryDedupStore {
    retention: Duration,
    seen: Arc<Mutex<HashMap<(String, MessageId), Instant>>>,
}

impl MemoryDedupStore {
    /// Remember ids for `retention`.
    pub fn new(retention: Duration) -> Self {
        MemoryDedupStore {
            retention,
            seen: Arc::default(),
        }
    }

    fn check_consumer(consumer: &str) -> Result<()> {
        if consumer.is_empty() || consumer.len() > 200 {
            return Err(Error::invalid_input("consumer name must be 1 to 200 bytes"));
        }
        Ok(())
    }
}

#[async_trait]
impl DedupStore for MemoryDedupStore {
    fn consistency(&self) -> Consistency {
        Consistency::Strong
    }

    async fn contains(&self, consumer: &str, id: MessageId) -> Result<bool> {
        Self::check_consumer(consumer)?;
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        Ok(seen
            .get(&(consumer.to_owned(), id))
            .is_some_and(|at| at.elapsed() < self.retention))
    }

    async fn record(&self, consumer: &str, id: MessageId) -> Result<Dedup> {
        Self::check_consumer(consumer)?;
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let key = (consumer.to_owned(), id);
        match seen.get(&key) {
            Some(at) if at.elapsed() < self.retention => Ok(Dedup::Duplicate),
            _ => {
                seen.insert(key, Instant::now());
                Ok(Dedup::New)
            }
        }
    }

    async fn purge_expired(&self, limit: usize) -> Result<u64> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let expired: Vec<_> = seen
            .iter()
            .filter(|(_, at)| at.elapsed() >= self.retention)
            .map(|(k, _)| k.clone())
            .take(limit)
            .collect();
        for k in &expired {
            seen.remove(k);
        }
        Ok(expired.len() as u64)
    }
}

/// An in-process [`DistributedLock`]: exclusive among clones of the same value.
#[derive(Debug, Clone, Default)]
pub struct MemoryLock {
    held: Arc<Mutex<HashSet<String>>>,
}

impl MemoryLock {
    /// No locks held.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl DistributedLock for MemoryLock {
    async fn try_lock(&self, name: &str) -> Result<Option<Box<dyn LockGuard>>> {
        if name.is_empty() || name.len() > 200 {
            return Err(Error::invalid_input("lock name must be 1 to 200 bytes"));
        }
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if !held.insert(name.to_owned()) {
            return Ok(None);
        }
        Ok(Some(Box::new(MemoryLockGuard {
            name: name.to_owned(),
            held: Arc::clone(&self.held),
        })))
    }
}

#[derive(Debug)]
struct MemoryLockGuard {
    name: String,
    held: Arc<Mutex<HashSet<String>>>,
}

impl Drop for MemoryLockGuard {
    fn drop(&mut self) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.name);
    }
}

#[async_trait]
impl LockGuard for MemoryLockGuard {
    fn name(&self) -> &str {
        &self.name
    }

    async fn unlock(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
