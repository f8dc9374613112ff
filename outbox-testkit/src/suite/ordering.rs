//! Per-key order. Guarantee 6.

use crate::harness::declared::SEALED;
use std::collections::HashMap;
use std::sync::Arc;

use outbox_core::{store::Disposition, store::OutboxStoreExt, KeyOrder, MessageId, Retention};

use super::*;
use crate::doubles::publishers::RecordingPublisher;
use crate::harness::Harness;

fn ordered() -> StoreCapabilities {
    StoreCapabilities::new(KeyOrder::PerKey, Retention::Delete)
}

/// A claim returns only the head of each key; later messages of a key wait until the
/// head is settled; unkeyed messages and other keys proceed.
pub async fn claims_take_only_key_heads(h: &dyn Harness) {
    require(h.features(SEALED).per_key_ordering, "per_key_ordering");
    let f = fixture(h, ordered()).await;
    let store = f.store();
    let batch = vec![
        keyed("a", 0),
        keyed("a", 1),
        keyed("b", 0),
        msg("free", 0),
        keyed("a", 2),
    ];
    let ids: Vec<MessageId> = batch.iter().map(|m| m.id()).collect();
    f.enqueue(batch).await.unwrap();

    let mut first: Vec<MessageId> = claim(&*store, 10, LONG_LEASE)
        .await
        .iter()
        .map(|c| c.message.id)
        .collect();
    first.sort();
    let mut expected = vec![ids[0], ids[2], ids[3]];
    expected.sort();
    assert_eq!(first, expected, "heads of a and b plus the unkeyed message");
    assert!(
        claim(&*store, 10, LONG_LEASE).await.is_empty(),
        "a/1 waits for a/0 in flight"
    );
    assert!(
        claim_ids(&*store, &[ids[1]], LONG_LEASE).await.is_empty(),
        "claim_ids keeps order too"
    );
}

/// A dead-lettered head does not block its key forever.
pub async fn dead_head_does_not_block_its_key(h: &dyn Harness) {
    require(h.features(SEALED).per_key_ordering, "per_key_ordering");
    let f = fixture(h, ordered()).await;
    let store = f.store();
    let batch = vec![keyed("k", 0), keyed("k", 1)];
    let second = batch[1].id();
    f.enqueue(batch).await.unwrap();
    let head = claim(&*store, 10, LONG_LEASE).await;
    assert_eq!(head.len(), 1);
    store
        .fail_one(failure(head[0].lease, "poison", Disposition::DeadLetter))
        .await
        .unwrap();
    let next = claim(&*store, 10, LONG_LEASE).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].message.id, second);
}

/// Four relays racing over interleaved keys, with failures forcing retries, publish
/// every key in enqueue order.
pub async fn per_key_order_holds_with_racing_relays(h: &dyn Harness) {
    require(h.features(SEALED).per_key_ordering, "per_key_ordering");
    let f = fixture(h, ordered()).await;
    let store = f.store();
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5"];
    let mut expected: HashMap<String, Vec<MessageId>> = HashMap::new();
    let mut batch = Vec::new();
    for n in 0..40 {
        for key in keys {
            let m = keyed(key, n);
            expected.entry(key.to_owned()).or_default().push(m.id());
            batch.push(m);
        }
    }
    for chunk in batch.chunks(60) {
        f.enqueue(chunk.to_vec()).await.unwrap();
    }
    // Every message fails once, so heads go through retry backoff while others race.
    let publisher = RecordingPublisher::failing_first(1);
    let relays: Vec<_> = (0..4)
        .map(|i| {
            let config = fast_relay_config()
                .with_name(format!("relay-{i}"))
                .with_batch_size(4)
                .with_publish_batch_size(2)
                .with_publish_concurrency(2);
            relay(Arc::clone(&store), Arc::new(publisher.clone()), config).spawn()
        })
        .collect();
    // A bound against a hang, not a speed check.
    publisher.wait_for_unique(240, DEADLINE * 5).await.unwrap();
    for r in relays {
        r.shutdown().await.unwrap();
    }
    assert_eq!(publisher.first_publish_order_by_key(), expected);
}
