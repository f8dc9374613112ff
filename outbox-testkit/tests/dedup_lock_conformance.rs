//! The dedup and lock conformance suites against [`MemoryDedupStore`] and [`MemoryLock`].
//!
//! Run: `cargo test -p outbox-testkit --test dedup_lock_conformance`
//!
//! [`MemoryDedupStore`]: outbox_testkit::MemoryDedupStore
//! [`MemoryLock`]: outbox_testkit::MemoryLock

use outbox_testkit::{MemoryDedupHarness, MemoryLockHarness};

async fn dedup_harness() -> Option<MemoryDedupHarness> {
    Some(MemoryDedupHarness::default())
}

async fn lock_harness() -> Option<MemoryLockHarness> {
    Some(MemoryLockHarness::default())
}

outbox_testkit::dedup_suite!(dedup_harness);
outbox_testkit::lock_suite!(lock_harness);
