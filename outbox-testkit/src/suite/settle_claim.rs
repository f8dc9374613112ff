//! Settling one batch and claiming the next in one call:
//! [`OutboxStore::settle_and_claim`](outbox_core::OutboxStore::settle_and_claim).

use crate::harness::declared::SEALED;
use std::collections::HashSet;

use outbox_core::{
    store::ClaimRequest, store::Disposition, store::OutboxStoreExt, store::Settlement, MessageId,
};

use super::*;
use crate::harness::Harness;

fn next(limit: usize) -> ClaimRequest {
    ClaimRequest::new(limit, LONG_LEASE).expect("valid claim request")
}

fn ids(claimed: &[ClaimedMessage]) -> HashSet<MessageId> {
    claimed.iter().map(|c| c.message.id).collect()
}

/// The settlement applies, then the next due messages are claimed with fresh leases.
pub async fn settle_and_claim_settles_then_claims(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(5)).await.unwrap();
    let first = claim(&*store, 3, LONG_LEASE).await;
    let leases: Vec<Lease> = first.iter().map(|c| c.lease).collect();
    let failed = vec![failure(
        leases[1],
        "broker said no",
        Disposition::Retry { after: LONG_LEASE },
    )];
    let settlement = Settlement {
        complete: &[leases[0]],
        fail: &failed,
        release: &[leases[2]],
    };
    let out = store.settle_and_claim(settlement, next(10)).await.unwrap();
    assert_eq!(
        (
            out.completed.applied,
            out.failed.applied,
            out.released.applied
        ),
        (1, 1, 1)
    );
    assert!(out.completed.lost.is_empty() && out.failed.lost.is_empty());
    let claimed = out.claimed.expect("the claim succeeded");
    assert_eq!(
        claimed.len(),
        2,
        "the two never claimed; the released one is excluded"
    );
    assert!(ids(&claimed).is_disjoint(&ids(&first)));
    let s = stats(&*f.admin()).await;
    assert_eq!(
        (s.pending, s.in_flight),
        (2, 2),
        "the retry waits, the release is due, two are held by the new claim"
    );
    for c in &claimed {
        store
            .complete_one(&c.lease)
            .await
            .expect("the new leases hold");
    }
    let again = claim(&*store, 10, LONG_LEASE).await;
    assert_eq!(
        ids(&again),
        HashSet::from([leases[2].id]),
        "the released message is due again"
    );
}

/// A stale lease in the settled part is reported lost and its message is left to its
/// new owner; the claim part goes on.
pub async fn settle_and_claim_reports_lost_leases(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(1)).await.unwrap();
    let stale = claim(&*store, 1, SHORT_LEASE).await.remove(0);
    let fresh = claim_eventually(&*store, 1, LONG_LEASE).await.remove(0);
    f.enqueue(vec![msg("later", 1)]).await.unwrap();
    let failed = vec![failure(stale.lease, "stale", Disposition::DeadLetter)];
    let settlement = Settlement {
        complete: &[stale.lease],
        fail: &[],
        release: &[],
    };
    let out = store.settle_and_claim(settlement, next(10)).await.unwrap();
    assert_eq!(out.completed.applied, 0);
    assert_eq!(out.completed.lost, vec![stale.lease.id]);
    let claimed = out.claimed.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].message.destination, "later");

    let settlement = Settlement {
        complete: &[],
        fail: &failed,
        release: &[stale.lease],
    };
    let out = store.settle_and_claim(settlement, next(10)).await.unwrap();
    assert_eq!(out.failed.lost, vec![stale.lease.id]);
    assert_eq!(out.released.lost, vec![stale.lease.id]);
    assert!(out.claimed.unwrap().is_empty(), "nothing else is due");
    let s = stats(&*f.admin()).await;
    assert_eq!(
        (s.in_flight, s.dead),
        (2, 0),
        "the stale settles changed nothing"
    );
    store
        .complete_one(&fresh.lease)
        .await
        .expect("the new owner's lease still holds");
}

/// The claim part never returns a message the settlement named, even when it is due
/// again by then: a lapsed lease completed, a failure retried at once, a release.
pub async fn settle_and_claim_never_returns_what_it_settled(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(3)).await.unwrap();
    let held = claim(&*store, 3, SHORT_LEASE).await;
    wait_until("the leases to lapse", || async {
        stats(&*f.admin()).await.pending == 3
    })
    .await;
    let retry_now = vec![failure(
        held[1].lease,
        "again",
        Disposition::Retry {
            after: std::time::Duration::ZERO,
        },
    )];
    let settlement = Settlement {
        complete: &[held[0].lease],
        fail: &retry_now,
        release: &[held[2].lease],
    };
    let out = store.settle_and_claim(settlement, next(10)).await.unwrap();
    // On a held-lock store a lapsed lease is lost with its session: nothing settles,
    // and all three are due again (for the next claim, not this one).
    let held_lock = held_lock(&*store);
    let (applied, left, due_again) = if held_lock {
        ((0, 0, 0), 3, ids(&held))
    } else {
        (
            (1, 1, 1),
            2,
            HashSet::from([held[1].lease.id, held[2].lease.id]),
        )
    };
    assert_eq!(
        (
            out.completed.applied,
            out.failed.applied,
            out.released.applied
        ),
        applied,
        "lapsed leases nobody claimed still settle (lease claims only)"
    );
    let claimed = out.claimed.unwrap();
    assert!(
        ids(&claimed).is_disjoint(&ids(&held)),
        "returned a message settled in the same call: {claimed:?}"
    );
    let s = stats(&*f.admin()).await;
    assert_eq!(
        s.pending + s.in_flight,
        left,
        "the completed one is gone, the other two wait"
    );
    let rest = claim(&*store, 10, LONG_LEASE).await;
    assert_eq!(
        ids(&rest),
        due_again,
        "what was failed or released is due for the next claim"
    );
}

/// The claim part skips rows another transaction holds locked, as a plain claim does,
/// and never waits for them.
pub async fn settle_and_claim_skips_locked_rows(h: &dyn Harness) {
    require(h.features(SEALED).row_locks, "row_locks");
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(1)).await.unwrap();
    let first = claim(&*store, 1, LONG_LEASE).await.remove(0);
    let locked = msg("locked", 1);
    let locked_id = locked.id();
    f.enqueue(vec![locked]).await.unwrap();
    let lock = f.lock_row(locked_id).await.unwrap();
    let settlement = Settlement {
        complete: &[first.lease],
        fail: &[],
        release: &[],
    };
    let out = within(
        "settle_and_claim next to a locked row",
        store.settle_and_claim(settlement, next(10)),
    )
    .await
    .unwrap();
    assert_eq!(out.completed.applied, 1);
    assert!(out.claimed.unwrap().is_empty(), "the locked row is skipped");
    lock.release().await.unwrap();
    let got = claim(&*store, 10, LONG_LEASE).await;
    assert_eq!(ids(&got), HashSet::from([locked_id]));
}
