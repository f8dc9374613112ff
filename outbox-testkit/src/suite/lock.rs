//! [`DistributedLock`] cases: exclusion without waiting, independent names, release by
//! unlock, by dropping the guard and by the holder's session ending.

use crate::harness::declared::SEALED;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::names::MAX_NAME_LEN;
use outbox_core::{lock::LockGuard, DistributedLock, ErrorKind, LockName};
use tokio::sync::Barrier;

use crate::harness::dedup::LockHarness;
use crate::macros::groups::require;
use crate::wait::poll_for;

/// Longer than any `try_lock` may take: it never waits for a holder.
const NO_WAIT: Duration = Duration::from_secs(10);
/// How many tasks race for one lock.
const RACERS: usize = 16;

async fn handle(h: &dyn LockHarness) -> Arc<dyn DistributedLock> {
    h.lock()
        .await
        .expect("harness could not make a lock handle")
}

/// A name no other case (or run) uses.
fn unique(label: &str) -> LockName {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    LockName::new(format!("conformance {label} {suffix}")).expect("valid lock name")
}

/// `try_lock`, failing the case if it errs or waits.
async fn try_lock(lock: &dyn DistributedLock, name: &LockName) -> Option<Box<dyn LockGuard>> {
    tokio::time::timeout(NO_WAIT, lock.try_lock(name))
        .await
        .unwrap_or_else(|_| {
            panic!("try_lock({name:?}) waited over {NO_WAIT:?}; it must never wait")
        })
        .unwrap_or_else(|e| panic!("try_lock({name:?}) failed: {}", e.report()))
}

async fn take(lock: &dyn DistributedLock, name: &LockName, why: &str) -> Box<dyn LockGuard> {
    let guard = try_lock(lock, name).await;
    let guard = guard.unwrap_or_else(|| panic!("{name:?} was refused, but {why}"));
    assert_eq!(guard.name(), name, "the guard reports another name");
    guard
}

async fn refused(lock: &dyn DistributedLock, name: &LockName, why: &str) {
    if let Some(guard) = try_lock(lock, name).await {
        let _ = guard.unlock().await;
        panic!("{name:?} was granted twice: {why}");
    }
}

async fn unlock(guard: Box<dyn LockGuard>) {
    let name = guard.name().clone();
    guard
        .unlock()
        .await
        .unwrap_or_else(|e| panic!("unlock of {name:?} failed: {}", e.report()));
}

/// A lock held by one handle is refused to every other handle and to its own holder's
/// handle, at once (`Ok(None)`), never by waiting.
pub async fn lock_held_elsewhere_is_refused_without_waiting(h: &dyn LockHarness) {
    let (ours, theirs) = (handle(h).await, handle(h).await);
    let name = unique("held");
    let guard = take(&*ours, &name, "nobody holds it").await;
    refused(&*theirs, &name, "another process holds it").await;
    refused(
        &*ours,
        &name,
        "the same process holds it through another guard",
    )
    .await;
    unlock(guard).await;
}

/// Of many concurrent `try_lock`s of one name from several handles, exactly one wins.
pub async fn lock_concurrent_try_locks_grant_one(h: &dyn LockHarness) {
    let handles = [handle(h).await, handle(h).await];
    let name = unique("contended");
    let start = Arc::new(Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let (lock, name, start) = (handles[i % 2].clone(), name.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                try_lock(&*lock, &name).await
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        winners.extend(task.await.expect("a try_lock task panicked"));
    }
    let won = winners.len();
    for guard in winners {
        unlock(guard).await;
    }
    assert_eq!(
        won, 1,
        "{won} of {RACERS} concurrent try_locks of one name won; exactly one must"
    );
}

/// Different names are different locks, however alike: holding one never refuses
/// another, including names that differ only in case or by a trailing space.
pub async fn lock_names_are_independent(h: &dyn LockHarness) {
    let (ours, theirs) = (handle(h).await, handle(h).await);
    let name = unique("independent");
    let base = name.as_str();
    let guard = take(&*ours, &name, "nobody holds it").await;
    let mut others = Vec::new();
    for other in [
        format!("{base} other"),
        base.to_uppercase(),
        format!("{base} "),
    ] {
        let other = LockName::new(other).expect("valid lock name");
        others.push(take(&*theirs, &other, "only a different name is held").await);
    }
    refused(&*theirs, &name, "taking other names must not release it").await;
    for other in others {
        unlock(other).await;
    }
    unlock(guard).await;
}

/// [`LockGuard::unlock`] releases at once: the next `try_lock`, from any handle, wins
/// without waiting or retrying.
pub async fn lock_unlock_releases_at_once(h: &dyn LockHarness) {
    let handles = [handle(h).await, handle(h).await];
    let name = unique("unlocked");
    for round in 0..6 {
        let (holder, other) = (&handles[round % 2], &handles[(round + 1) % 2]);
        let guard = take(&**holder, &name, "the previous holder unlocked it").await;
        refused(&**other, &name, "it is held").await;
        unlock(guard).await;
    }
    let guard = take(&*handles[0], &name, "it was unlocked").await;
    unlock(guard).await;
}

/// Dropping a guard without unlocking releases the lock eventually, and never to the
/// dropping handle alone: whoever takes it next excludes everyone else.
pub async fn lock_dropped_guard_is_released(h: &dyn LockHarness) {
    let (ours, theirs) = (handle(h).await, handle(h).await);
    let name = unique("dropped");
    let guard = take(&*ours, &name, "nobody holds it").await;
    refused(&*theirs, &name, "it is held").await;
    drop(guard);

    let next = poll_for("a dropped guard's lock to be released", || {
        let (theirs, name) = (theirs.clone(), name.clone());
        async move { try_lock(&*theirs, &name).await }
    })
    .await;
    refused(&*ours, &name, "the next holder took it after the drop").await;
    unlock(next).await;
    let again = take(&*ours, &name, "the next holder unlocked it").await;
    unlock(again).await;
}

/// A lock whose holder's session dies (a crash, a cut connection) is released, and the
/// orphaned guard's late unlock or drop leaves the next holder's lock alone.
pub async fn lock_severed_session_releases_the_lock(h: &dyn LockHarness) {
    require(h.features(SEALED).sever, "sever");
    let (ours, theirs) = (handle(h).await, handle(h).await);
    let name = unique("severed");
    let orphan = take(&*ours, &name, "nobody holds it").await;
    h.sever(&*orphan)
        .await
        .unwrap_or_else(|e| panic!("harness could not sever the session: {}", e.report()));

    let next = poll_for("a severed session's lock to be released", || {
        let (theirs, name) = (theirs.clone(), name.clone());
        async move { try_lock(&*theirs, &name).await }
    })
    .await;
    // Whatever the orphan's unlock returns, it must not release the next holder.
    let _ = orphan.unlock().await;
    refused(
        &*ours,
        &name,
        "an orphaned guard's unlock released the next holder's lock",
    )
    .await;
    let third = handle(h).await;
    refused(
        &*third,
        &name,
        "an orphaned guard's unlock released the next holder's lock",
    )
    .await;
    unlock(next).await;
}

/// Lock names follow the one rule of [`LockName`] (so bad ones never reach a backend),
/// and every valid name locks and excludes as given: the longest, non-ASCII ones and
/// ones full of quoting characters.
pub async fn lock_names_follow_the_one_rule(h: &dyn LockHarness) {
    let too_long = "n".repeat(MAX_NAME_LEN + 1);
    for bad in ["", "   ", "\t", "new\nline", "nul\0", &too_long] {
        let err = LockName::new(bad).expect_err("a bad lock name was accepted");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad:?}");
    }
    let (ours, theirs) = (handle(h).await, handle(h).await);
    let base = unique("names");
    let pad = |fill: &str| {
        let mut name = base.as_str().to_owned();
        // Bounded: each turn adds to the name, up to MAX_NAME_LEN.
        while name.len() + fill.len() <= MAX_NAME_LEN {
            name.push_str(fill);
        }
        name
    };
    let names = [
        format!("{base} quote ' \" ; -- \\ % _ *"),
        format!("{base} 日本語 🦀"),
        pad("n"),
        pad("é"),
    ];
    for name in names {
        let name = LockName::new(name).expect("valid lock name");
        let guard = take(&*ours, &name, "nobody holds it").await;
        refused(&*theirs, &name, "it is held").await;
        unlock(guard).await;
    }
}
