//! Mutual exclusion across processes for singleton work: [`DistributedLock`].

use std::fmt;

use async_trait::async_trait;

use crate::error::Result;
use crate::names::LockName;

/// A named lock shared by every process using the same storage.
///
/// Use it for work that must run once at a time across a fleet, such as purging
/// dispatched rows. Dispatch itself never needs it: claims coordinate per row.
///
/// # Contract
///
/// - `try_lock` never waits for another holder: it returns `Ok(None)` when the lock is
///   held elsewhere.
/// - While a guard is alive and its backing session is healthy, no other `try_lock` for
///   the same name succeeds.
/// - [`LockGuard::unlock`] releases at once. Dropping a guard without unlocking must
///   release eventually (session end, TTL), never hold the lock forever.
/// - Names arrive validated ([`LockName`]); a backend that must map them to its own
///   key space (PostgreSQL advisory locks take integers) does so without collisions
///   between names in practice (a 64-bit hash, say) and documents it.
#[async_trait]
pub trait DistributedLock: Send + Sync + fmt::Debug {
    /// Take the lock if nobody holds it.
    async fn try_lock(&self, name: &LockName) -> Result<Option<Box<dyn LockGuard>>>;
}

/// A held [`DistributedLock`].
#[async_trait]
pub trait LockGuard: Send + Sync + fmt::Debug {
    /// The lock's name.
    fn name(&self) -> &LockName;

    /// Release the lock.
    async fn unlock(self: Box<Self>) -> Result<()>;
}
