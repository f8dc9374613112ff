//! Cases that need the backend's own transactions: atomic enqueue, row locks, bad
//! input. Guarantees 1, 2, 11 and 12.

use crate::harness::declared::SEALED;
use std::time::Duration;

use outbox_core::store::StoreCapabilities;
use outbox_core::{ErrorKind, KeyOrder, MessageLimits, NewMessage, Retention};

use super::*;
use crate::harness::Harness;

/// What the suite macro's `lacks(...)` list declares agrees with what the store itself
/// declares: lease renewal, and the key order and retention a store made with them
/// reports. The list is the one declaration of the harness; this checks it against
/// the store's [`StoreCapabilities`](outbox_core::store::StoreCapabilities).
pub async fn declared_capabilities_match_the_store(h: &dyn Harness) {
    let declared = h.features(SEALED);
    let f = plain(h).await;
    let renews = f.store().capabilities().lease_renewal;
    assert_eq!(
        renews,
        declared.lease_renewal,
        "the store declares lease_renewal {renews}, but its suite macro {} it: name \
         lease_renewal in lacks(...) exactly when the store does not renew",
        if declared.lease_renewal {
            "does not lack"
        } else {
            "lacks"
        }
    );
    if declared.per_key_ordering {
        let asked = StoreCapabilities::new(KeyOrder::PerKey, Retention::Delete);
        let made = fixture(h, asked).await.store().capabilities();
        assert!(
            made.same_semantics(&asked),
            "a store made for per-key order declares {made:?}: add per_key_ordering to \
             lacks(...) if the backend cannot keep it"
        );
    }
    if declared.keep_retention {
        let made = fixture(h, keeping()).await.store().capabilities();
        assert!(
            made.same_semantics(&keeping()),
            "a store made to keep history declares {made:?}: add keep_retention to \
             lacks(...) if the backend cannot keep it"
        );
    }
}

/// A rolled-back enqueue leaves nothing; a committed one is claimable.
pub async fn rolled_back_enqueue_leaves_nothing(h: &dyn Harness) {
    require(
        h.features(SEALED).transactional_enqueue,
        "transactional_enqueue",
    );
    let f = plain(h).await;
    let store = f.store();
    f.enqueue_rolled_back(msgs(3)).await.unwrap();
    assert!(claim(&*store, 10, LONG_LEASE).await.is_empty());
    assert_eq!(stats(&*f.admin()).await.pending, 0);
    f.enqueue(msgs(2)).await.unwrap();
    assert_eq!(claim(&*store, 10, LONG_LEASE).await.len(), 2);
}

/// A batch with one invalid message writes none of them.
pub async fn invalid_batch_writes_nothing(h: &dyn Harness) {
    let f = plain(h).await;
    let oversize = NewMessage::builder("big")
        .limits(MessageLimits::default().with_max_payload_bytes(usize::MAX))
        .payload(vec![7u8; 2 * 1024 * 1024])
        .build()
        .unwrap();
    let batch = vec![msg("ok", 0), msg("ok", 1), oversize];
    let err = f.enqueue(batch).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("payload"), "{err}");
    let s = stats(&*f.admin()).await;
    assert_eq!(
        (s.pending, s.in_flight, s.dead),
        (0, 0, 0),
        "nothing may be half-written"
    );
}

/// A claim skips a row another transaction has locked, without waiting for it, and
/// takes the row once the lock is gone.
pub async fn claim_skips_rows_locked_by_another_transaction(h: &dyn Harness) {
    require(h.features(SEALED).row_locks, "row_locks");
    let f = plain(h).await;
    let store = f.store();
    let batch = msgs(3);
    let locked = batch[0].id();
    f.enqueue(batch).await.unwrap();
    let lock = f.lock_row(locked).await.unwrap();

    let got = tokio::time::timeout(Duration::from_secs(10), claim(&*store, 10, LONG_LEASE))
        .await
        .expect("a claim must skip locked rows, not wait on them");
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|c| c.message.id != locked));
    let explicit = tokio::time::timeout(
        Duration::from_secs(10),
        claim_ids(&*store, &[locked], LONG_LEASE),
    )
    .await
    .expect("claim_ids must not wait either");
    assert!(explicit.is_empty());

    lock.release().await.unwrap();
    let got = claim(&*store, 10, LONG_LEASE).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message.id, locked);
}

/// Enqueueing an id that is already stored (or twice in one batch) is a conflict and
/// writes nothing of the batch.
pub async fn duplicate_ids_write_nothing(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    let first = msg("dup", 0);
    f.enqueue(vec![first.clone()]).await.unwrap();
    let err = f
        .enqueue(vec![msg("dup", 1), first.clone()])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    let twice = msg("dup", 2);
    let err = f.enqueue(vec![twice.clone(), twice]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    let s = stats(&*f.admin()).await;
    assert_eq!(s.pending, 1, "only the first message exists");
    let got = claim(&*store, 10, LONG_LEASE).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message.id, first.id());
}
