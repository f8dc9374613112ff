//! Fencing: settling with a lease that was lost. Guarantee 3.

use outbox_core::{store::Disposition, store::OutboxStoreExt, ErrorKind};

use super::*;
use crate::harness::Harness;

/// Completing with a lease that lapsed and was re-claimed is `LeaseLost` and changes
/// nothing; the new owner's lease still works.
pub async fn stale_complete_is_rejected(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(1)).await.unwrap();
    let stale = claim(&*store, 1, SHORT_LEASE).await.remove(0);
    let fresh = claim_eventually(&*store, 1, LONG_LEASE).await.remove(0);

    let err = store.complete_one(&stale.lease).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost);
    assert_eq!(err.ids(), &[stale.lease.id]);
    let s = stats(&*f.admin()).await;
    assert_eq!(
        (s.pending, s.in_flight),
        (0, 1),
        "the stale complete must change nothing"
    );

    store
        .complete_one(&fresh.lease)
        .await
        .expect("the live lease completes");
    let s = stats(&*f.admin()).await;
    assert_eq!((s.pending, s.in_flight, s.dead), (0, 0, 0));
}

/// Failing or releasing with a lost lease is `LeaseLost` and changes nothing.
pub async fn stale_fail_and_release_are_rejected(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(1)).await.unwrap();
    let stale = claim(&*store, 1, SHORT_LEASE).await.remove(0);
    let fresh = claim_eventually(&*store, 1, LONG_LEASE).await.remove(0);

    for disposition in [
        Disposition::DeadLetter,
        Disposition::Retry { after: LONG_LEASE },
    ] {
        let failure = failure(stale.lease, "stale", disposition);
        let err = store.fail_one(failure).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LeaseLost);
    }
    let err = store.release_one(&stale.lease).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost);

    let s = stats(&*f.admin()).await;
    assert_eq!(
        (s.pending, s.in_flight, s.dead),
        (0, 1, 0),
        "nothing changed"
    );
    assert!(
        claim(&*store, 1, LONG_LEASE).await.is_empty(),
        "still held by the new owner"
    );
    store
        .release_one(&fresh.lease)
        .await
        .expect("the live lease releases");
    let again = claim(&*store, 1, LONG_LEASE).await;
    assert_eq!(
        again[0].message.last_error, None,
        "the stale fail recorded no error"
    );
}

/// A lease that lapsed but was not claimed again still completes, and until then the
/// message counts as pending. On a held-lock store a lapsed lease is lost with the
/// session that held it: the complete reports it lost and changes nothing.
pub async fn expired_unclaimed_lease_still_completes(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(1)).await.unwrap();
    let held = claim(&*store, 1, SHORT_LEASE).await.remove(0);
    wait_until("the lease to lapse", || async {
        let s = stats(&*f.admin()).await;
        (s.pending, s.in_flight) == (1, 0)
    })
    .await;
    if held_lock(&*store) {
        let err = store.complete_one(&held.lease).await.unwrap_err();
        assert_eq!(err.kind(), outbox_core::ErrorKind::LeaseLost);
        let s = stats(&*f.admin()).await;
        assert_eq!((s.pending, s.in_flight), (1, 0), "nothing was completed");
        return;
    }
    store
        .complete_one(&held.lease)
        .await
        .expect("nobody else holds it");
    let s = stats(&*f.admin()).await;
    assert_eq!((s.pending, s.in_flight), (0, 0));
}

/// A settled lease cannot be settled again.
pub async fn settled_leases_cannot_be_reused(h: &dyn Harness) {
    let f = fixture(h, keeping()).await;
    let store = f.store();
    f.enqueue(msgs(2)).await.unwrap();
    let got = claim(&*store, 2, LONG_LEASE).await;
    store.complete_one(&got[0].lease).await.unwrap();
    assert_eq!(
        store.complete_one(&got[0].lease).await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );
    assert_eq!(
        store.release_one(&got[0].lease).await.unwrap_err().kind(),
        ErrorKind::LeaseLost,
        "a completed message must not be released back to pending"
    );
    let settled = store.complete(&[got[0].lease, got[1].lease]).await.unwrap();
    assert_eq!(settled.applied, 1);
    assert_eq!(settled.lost, vec![got[0].lease.id]);
    let s = stats(&*f.admin()).await;
    assert_eq!((s.pending, s.in_flight, s.dispatched), (0, 0, 2));

    // A failed (retry-scheduled) lease is spent too.
    f.enqueue(msgs(1)).await.unwrap();
    let retried = claim(&*store, 1, LONG_LEASE).await.remove(0);
    let retry = failure(
        retried.lease,
        "once",
        Disposition::Retry { after: LONG_LEASE },
    );
    store.fail_one(retry.clone()).await.unwrap();
    assert_eq!(
        store.fail_one(retry).await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );
    assert_eq!(
        store.release_one(&retried.lease).await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );
    assert_eq!(
        store.complete_one(&retried.lease).await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );
    let s = stats(&*f.admin()).await;
    assert_eq!(
        (s.pending, s.in_flight),
        (1, 0),
        "still scheduled for its retry"
    );
}
