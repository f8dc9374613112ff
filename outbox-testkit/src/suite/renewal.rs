//! Lease renewal: [`OutboxStore::renew`](outbox_core::OutboxStore::renew), for stores
//! that declare [`StoreCapabilities::lease_renewal`](outbox_core::store::StoreCapabilities).
//! Stores that do not declare it must refuse renewal with `Unsupported`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{store::OutboxStoreExt, ErrorKind, MessageId};

use super::*;
use crate::doubles::publishers::RecordingPublisher;
use crate::harness::{Fixture, Harness};

/// A plain fixture of a store that declares renewal; the case fails if it does not
/// (the suite macro runs these cases only without `lacks(lease_renewal)`).
async fn renewing(h: &dyn Harness) -> Box<dyn Fixture> {
    let f = plain(h).await;
    require(f.store().capabilities().lease_renewal, "lease_renewal");
    f
}

/// A store that does not declare [`lease_renewal`](outbox_core::store::StoreCapabilities)
/// refuses renewal with `Unsupported`, changing nothing; one that declares it extends
/// a held lease.
pub async fn renewal_is_refused_unless_declared(h: &dyn Harness) {
    let f = plain(h).await;
    let store = f.store();
    f.enqueue(msgs(1)).await.unwrap();
    let held = claim(&*store, 1, SHORT_LEASE).await.remove(0);
    let renewed = store.renew(&[held.lease], LONG_LEASE).await;
    if store.capabilities().lease_renewal {
        let renewed = renewed.expect("a store that declares lease renewal renews");
        assert_eq!(renewed.lost, Vec::<MessageId>::new());
        assert_eq!(renewed.leases.len(), 1, "{renewed:?}");
        assert!(renewed.leases[0].expires_at > held.lease.expires_at);
    } else {
        let err = renewed.expect_err("a store that does not declare lease renewal must refuse it");
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        // The refused renewal changed nothing: the short lease lapses as it would have.
        let again = claim_eventually(&*store, 1, LONG_LEASE).await.remove(0);
        assert_eq!(again.message.id, held.message.id);
    }
}

/// Renewing with a stale token is rejected and changes nothing: the new owner's lease
/// keeps its own expiry.
pub async fn renewal_with_a_stale_token_changes_nothing(h: &dyn Harness) {
    let f = renewing(h).await;
    let store = f.store();
    f.enqueue(msgs(1)).await.unwrap();
    let stale = claim(&*store, 1, SHORT_LEASE).await.remove(0);
    let fresh = claim_eventually(&*store, 1, SHORT_LEASE).await.remove(0);
    let renewed = store.renew(&[stale.lease], LONG_LEASE).await.unwrap();
    assert!(renewed.leases.is_empty(), "{renewed:?}");
    assert_eq!(renewed.lost, vec![stale.lease.id]);
    // Had the stale renewal extended the row, the fresh lease would not lapse now.
    let third = claim_eventually(&*store, 1, LONG_LEASE).await.remove(0);
    assert_eq!(third.message.id, fresh.message.id);
    assert_eq!(
        store.complete_one(&fresh.lease).await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );
    assert_eq!(
        store.renew(&[fresh.lease], LONG_LEASE).await.unwrap().lost,
        vec![fresh.lease.id]
    );
    store.complete_one(&third.lease).await.unwrap();
    assert_eq!(
        store.renew(&[third.lease], LONG_LEASE).await.unwrap().lost,
        vec![third.lease.id],
        "a settled lease cannot be renewed"
    );
    let err = store
        .renew(&[third.lease], Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

/// A renewed lease is not claimable by others until its new expiry, while a lease
/// taken at the same time and not renewed lapses.
pub async fn renewed_lease_is_not_claimable_by_others(h: &dyn Harness) {
    let f = renewing(h).await;
    let store = f.store();
    f.enqueue(msgs(2)).await.unwrap();
    // One claim each: a held-lock store renews a batch as a whole.
    let held = claim_each(&*store, 2, SHORT_LEASE).await;
    let renewed = store.renew(&[held[0].lease], LONG_LEASE).await.unwrap();
    assert!(renewed.lost.is_empty());
    assert_eq!(renewed.leases.len(), 1);
    let lease = renewed.leases[0];
    assert_eq!(
        (lease.id, lease.token),
        (held[0].lease.id, held[0].lease.token)
    );
    assert!(
        lease.expires_at > held[0].lease.expires_at,
        "the new expiry is later: {lease:?} vs {:?}",
        held[0].lease
    );
    // The unrenewed one lapses; by then the renewed one would have too.
    let lapsed = claim_eventually(&*store, 10, LONG_LEASE).await;
    let got: HashSet<MessageId> = lapsed.iter().map(|c| c.message.id).collect();
    assert_eq!(got, HashSet::from([held[1].lease.id]));
    assert!(claim(&*store, 10, LONG_LEASE).await.is_empty());
    store
        .complete_one(&lease)
        .await
        .expect("the renewed lease still holds");
}

/// A holder that stops renewing loses the lease at its (renewed) expiry: the message
/// is claimed anew and the old lease is fenced out.
pub async fn unrenewed_lease_lapses_at_expiry(h: &dyn Harness) {
    let f = renewing(h).await;
    let store = f.store();
    f.enqueue(msgs(1)).await.unwrap();
    let held = claim(&*store, 1, SHORT_LEASE).await.remove(0);
    let renewed = store.renew(&[held.lease], SHORT_LEASE).await.unwrap();
    assert_eq!(renewed.leases.len(), 1);
    let taken = claim_eventually(&*store, 1, LONG_LEASE).await.remove(0);
    assert_eq!(taken.message.id, held.message.id);
    assert_eq!(taken.message.attempts, 2);
    let renewed_again = store.renew(&[held.lease], LONG_LEASE).await.unwrap();
    assert_eq!(renewed_again.lost, vec![held.lease.id]);
    assert_eq!(
        store.complete_one(&held.lease).await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );
    store.complete_one(&taken.lease).await.unwrap();
}

/// A relay on a renewing store publishes a batch whose waves outlast one lease without
/// releasing or publishing anything twice: it renews before each wave that would not
/// fit in what is left.
pub async fn relay_renews_leases_across_publish_waves(h: &dyn Harness) {
    let f = renewing(h).await;
    let store = f.store();
    f.enqueue(msgs(4)).await.unwrap();
    // Four waves of one message, 500 ms each: 2 s against a 1.5 s lease. Without
    // renewal this config does not even validate.
    let publisher = RecordingPublisher::new().with_delay(Duration::from_millis(500));
    let config = fast_relay_config()
        .with_batch_size(4)
        .with_publish_batch_size(1)
        .with_publish_concurrency(1)
        .with_lease(Duration::from_millis(1500))
        .with_publish_timeout(Duration::from_secs(1));
    assert!(config.validate().is_err());
    let relay = relay(Arc::clone(&store), Arc::new(publisher.clone()), config);
    let handle = relay.spawn();
    publisher.wait_for_unique(4, DEADLINE).await.unwrap();
    relay.wait_idle(DEADLINE).await.unwrap();
    let report = handle.shutdown().await.unwrap();
    assert_eq!(
        (report.dispatched, report.released, report.leases_lost),
        (4, 0, 0),
        "{report:?}"
    );
    assert_eq!(publisher.duplicates(), 0);
    assert!(publisher.published().iter().all(|m| m.attempts == 1));
    let s = stats(&*f.admin()).await;
    assert_eq!((s.pending, s.in_flight), (0, 0));
}
