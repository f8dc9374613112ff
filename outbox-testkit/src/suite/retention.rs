//! History and monitoring: purges and stats. Guarantee 8.

use crate::harness::declared::SEALED;
use std::time::Duration;

use outbox_core::{store::Disposition, store::OutboxStoreExt, Retention};

use super::*;
use crate::harness::Harness;

/// Purging deletes at most `limit` dispatched rows per call and never touches pending,
/// in-flight or dead ones.
pub async fn purge_is_bounded_and_spares_undelivered(h: &dyn Harness) {
    require(h.features(SEALED).keep_retention, "keep_retention");
    let f = fixture(h, keeping()).await;
    let store = f.store();
    f.enqueue(msgs(12)).await.unwrap();
    let got = claim_each(&*store, 9, LONG_LEASE).await;
    let leases: Vec<_> = got[..6].iter().map(|c| c.lease).collect();
    store
        .complete(&leases)
        .await
        .unwrap()
        .into_result()
        .unwrap();
    store
        .fail_one(failure(got[6].lease, "dead", Disposition::DeadLetter))
        .await
        .unwrap();
    // got[7], got[8] stay in flight; 3 stay pending.

    assert_eq!(
        f.admin()
            .purge_dispatched(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0,
        "inside the window"
    );
    assert_eq!(
        f.admin().purge_dispatched(Duration::ZERO, 4).await.unwrap(),
        4
    );
    assert_eq!(
        f.admin().purge_dispatched(Duration::ZERO, 4).await.unwrap(),
        2
    );
    assert_eq!(
        f.admin().purge_dispatched(Duration::ZERO, 4).await.unwrap(),
        0
    );
    let s = stats(&*f.admin()).await;
    assert_eq!((s.pending, s.in_flight, s.dead, s.dispatched), (3, 2, 1, 0));
}

/// Under `Retention::Delete` completing removes the row and purges find nothing.
pub async fn delete_retention_keeps_no_history(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    assert_eq!(store.capabilities().retention, Retention::Delete);
    f.enqueue(msgs(3)).await.unwrap();
    let got = claim(&*store, 3, LONG_LEASE).await;
    let leases: Vec<_> = got.iter().map(|c| c.lease).collect();
    assert_eq!(store.complete(&leases).await.unwrap().applied, 3);
    assert_eq!(
        f.admin()
            .purge_dispatched(Duration::ZERO, 10)
            .await
            .unwrap(),
        0
    );
    let s = stats(&*f.admin()).await;
    assert_eq!((s.pending, s.in_flight, s.dispatched), (0, 0, 0));
}

/// Stats count pending, in-flight, dead and kept rows exactly.
pub async fn stats_are_exact(h: &dyn Harness) {
    let options = if h.features(SEALED).keep_retention {
        keeping()
    } else {
        Default::default()
    };
    let f = fixture(h, options).await;
    let store = f.store();
    let empty = stats(&*f.admin()).await;
    assert_eq!(
        (empty.pending, empty.in_flight, empty.dead, empty.dispatched),
        (0, 0, 0, 0)
    );
    assert_eq!(empty.oldest_pending_age, None);

    f.enqueue(msgs(5)).await.unwrap();
    let s = stats(&*f.admin()).await;
    assert_eq!((s.pending, s.in_flight), (5, 0));
    assert!(s.oldest_pending_age.is_some());

    let got = claim(&*store, 3, LONG_LEASE).await;
    let s = stats(&*f.admin()).await;
    assert_eq!((s.pending, s.in_flight), (2, 3));

    store
        .fail_one(failure(got[0].lease, "x", Disposition::DeadLetter))
        .await
        .unwrap();
    store
        .fail_one(failure(
            got[1].lease,
            "x",
            Disposition::Retry {
                after: Duration::from_secs(3600),
            },
        ))
        .await
        .unwrap();
    store.complete_one(&got[2].lease).await.unwrap();
    let s = stats(&*f.admin()).await;
    let kept = u64::from(h.features(SEALED).keep_retention);
    assert_eq!(
        (s.pending, s.in_flight, s.dead, s.dispatched),
        (3, 0, 1, kept)
    );
}
