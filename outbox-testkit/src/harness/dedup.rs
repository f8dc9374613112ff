//! What a backend implements to run the [`DedupStore`] and [`DistributedLock`] suites,
//! and the harnesses of the in-memory implementations.
//!
//! The cases live in [`suite`](crate::suite) (the `dedup_*` and `lock_*` functions) and
//! become tests through [`dedup_suite!`](crate::dedup_suite) and
//! [`lock_suite!`](crate::lock_suite).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{lock::LockGuard, DedupStore, DistributedLock, Error, ErrorKind, Result};

use crate::harness::declared::Sealed;
use crate::memory::dedup::{MemoryDedupStore, MemoryLock};

/// What a [`DedupStore`] under test supports, as its suite macro declares it: every
/// capability but those named in `dedup_suite!(make; lacks(short_retention))` (or
/// [`consumer_suite!`](crate::consumer_suite)'s list). A backend does not build it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DedupFeatures {
    /// The store declares [`Consistency::Strong`](outbox_core::Consistency::Strong): a
    /// record is visible from the moment `record` returns. The suite checks the
    /// declaration matches and, when strong, that it holds.
    pub strong: bool,
    /// Stores can be made with a retention of a fraction of a second, so the suite can
    /// wait for records to expire.
    pub short_retention: bool,
}

impl DedupFeatures {
    /// Everything on: what a store on a transactional database should support.
    pub fn all() -> Self {
        DedupFeatures {
            strong: true,
            short_retention: true,
        }
    }

    /// Everything but the capabilities `lacks` names (a suite macro's list).
    pub(crate) fn lacking(lacks: &[&str]) -> Self {
        DedupFeatures {
            strong: !lacks.contains(&"strong"),
            short_retention: !lacks.contains(&"short_retention"),
        }
    }
}

/// Hands out isolated [`DedupStore`]s, one or more per case.
#[async_trait]
pub trait DedupHarness: Send + Sync + 'static {
    /// What the store supports, as its suite macro declared it; answered by
    /// [`Declared`](crate::Declared), never by a backend.
    fn features(&self, _: Sealed) -> DedupFeatures {
        DedupFeatures::all()
    }

    /// A fresh, empty store remembering ids for `retention`, in its own table or key
    /// prefix, so cases can run in parallel. The suite asks for a retention under a
    /// second only when [`DedupFeatures::short_retention`] is declared.
    async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>>;

    /// A lock on the backend's storage for [`Purger::for_dedup`](outbox_core::Purger::for_dedup).
    /// Cases give their purgers unique lock names, so the lock may be shared.
    async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>>;
}

/// What a [`DistributedLock`] under test supports, as its suite macro declares it: the
/// case that needs `sever` shows as ignored under `lock_suite!(make; lacks(sever))`.
/// A backend does not build it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockFeatures {
    /// [`LockHarness::sever`] is implemented.
    pub sever: bool,
}

impl LockFeatures {
    /// Everything on.
    pub fn all() -> Self {
        LockFeatures { sever: true }
    }

    /// Everything but the capabilities `lacks` names (a suite macro's list).
    pub(crate) fn lacking(lacks: &[&str]) -> Self {
        LockFeatures {
            sever: !lacks.contains(&"sever"),
        }
    }
}

/// Hands out handles on a backend's lock space, as separate processes would hold them.
///
/// Lock names are global to the storage, so the cases isolate themselves with unique
/// names (a random suffix) rather than with a fresh store.
#[async_trait]
pub trait LockHarness: Send + Sync + 'static {
    /// What the harness supports, as its suite macro declared it; answered by
    /// [`Declared`](crate::Declared), never by a backend.
    fn features(&self, _: Sealed) -> LockFeatures {
        LockFeatures::all()
    }

    /// A new handle on the lock space shared by every handle of this harness, with its
    /// own connections, as another process of a fleet would have.
    async fn lock(&self) -> Result<Arc<dyn DistributedLock>>;

    /// End the session backing `guard` the way a crashed process or a cut connection
    /// would (a killed backend, an expired session), without unlocking. The guard is
    /// left orphaned; the suite later unlocks or drops it and ignores what that
    /// returns. Called only when [`LockFeatures::sever`] is declared.
    async fn sever(&self, guard: &dyn LockGuard) -> Result<()> {
        let _ = guard;
        Err(Error::new(ErrorKind::Unsupported, "sever"))
    }
}

/// Runs the dedup suite against [`MemoryDedupStore`], with a [`MemoryLock`] for purgers.
#[derive(Debug, Clone, Default)]
pub struct MemoryDedupHarness {
    lock: MemoryLock,
}

#[async_trait]
impl DedupHarness for MemoryDedupHarness {
    async fn store(&self, retention: Duration) -> Result<Arc<dyn DedupStore>> {
        Ok(Arc::new(MemoryDedupStore::new(retention)))
    }

    async fn purge_lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(self.lock.clone()))
    }
}

/// Runs the lock suite against [`MemoryLock`]: every handle is a clone of one lock, and
/// [`sever`](LockHarness::sever) is [`MemoryLock::end_session`].
#[derive(Debug, Clone, Default)]
pub struct MemoryLockHarness {
    lock: MemoryLock,
}

#[async_trait]
impl LockHarness for MemoryLockHarness {
    async fn lock(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(self.lock.clone()))
    }

    async fn sever(&self, guard: &dyn LockGuard) -> Result<()> {
        if self.lock.end_session(guard.name()) {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::Unavailable,
                format!("no session holds lock {:?}", guard.name()),
            ))
        }
    }
}
