//! Order markers that cannot be lost: a requeue racing claims that remove the requeued
//! message's stale marker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use outbox_core::{
    store::ClaimRequest, store::Disposition, store::Failure, store::OutboxStoreExt,
    DeadLetterSelection, KeyOrder, NewMessage, OutboxAdmin, OutboxStore,
};
use outbox_dynamodb::DynamoOutboxConfig;

use crate::common;

const LEASE: Duration = Duration::from_secs(30);
const ROUNDS: usize = 30;
const CLAIMERS: usize = 4;

fn keyed(key: &str) -> NewMessage {
    NewMessage::builder("k").partition_key(key).build().unwrap()
}

dynamo_test! {
    flavor = multi_thread(4);

    /// Per round: X then Y on one key; X is dead-lettered and its order marker left
    /// behind (what a crash after the dead-letter leaves). Then `requeue_dead(X)` races
    /// claimers whose head checks find that stale marker and remove it. Before the fix the
    /// removal was unconditional and the requeue wrote the message and its marker in two
    /// requests, so a removal landing after the requeue left X undelivered without a marker
    /// and Y overtook it. Now, whatever the interleaving: no claim returns both, and once
    /// the race is over X is its key's head again, ahead of Y.
    ///
    /// The window is a few milliseconds: against the old code this test passed 60 rounds
    /// out of 60 on DynamoDB Local, so it guards the invariant under real concurrency but
    /// is not a reliable detector of the old bug; the fix rests on the transactions'
    /// conditions (see `src/markers.rs`).
    async fn requeue_racing_claims_keeps_per_key_order(
        client = common::client("outbox-dynamodb marker race")
    ) {
        let config = DynamoOutboxConfig::default().with_ordering(KeyOrder::PerKey);
        let outbox = Arc::new(common::outbox(&client, config).await.unwrap());
        for round in 0..ROUNDS {
            let key = format!("acct-{round}");
            let (x, y) = (keyed(&key), keyed(&key));
            let writes = outbox.enqueue_writes(&[x.clone(), y.clone()]).unwrap();
            let x_marker = writes
                .iter()
                .filter_map(|w| w.put())
                .find(|p| p.item().contains_key("mid"))
                .expect("X's order marker")
                .item()
                .clone();
            assert_eq!(
                x_marker.get("mid"),
                Some(&AttributeValue::S(
                    x.id().as_uuid().hyphenated().to_string()
                )),
                "the first marker is X's"
            );
            client
                .transact_write_items()
                .set_transact_items(Some(writes))
                .send()
                .await
                .unwrap();
            let got = outbox
                .claim(ClaimRequest::new(10, LEASE).unwrap())
                .await
                .unwrap();
            let ids: Vec<_> = got.iter().map(|c| c.message.id).collect();
            assert_eq!(ids, vec![x.id()], "X is its key's head");
            outbox
                .fail_one(Failure::new(got[0].lease, "boom", Disposition::DeadLetter))
                .await
                .unwrap();
            client
                .put_item()
                .table_name(outbox.config().table())
                .set_item(Some(x_marker))
                .send()
                .await
                .unwrap();

            let requeued = Arc::new(AtomicBool::new(false));
            // Everyone starts together: the stale marker is removed by the first head check,
            // so the race is in the first milliseconds.
            let start = Arc::new(tokio::sync::Barrier::new(CLAIMERS + 1));
            let claimers: Vec<_> = (0..CLAIMERS)
                .map(|_| {
                    let (outbox, requeued) = (outbox.clone(), requeued.clone());
                    let (x, y, start) = (x.id(), y.id(), start.clone());
                    tokio::spawn(async move {
                        start.wait().await;
                        // Claim (and release at once) until the requeue is done, then once more.
                        loop {
                            let over = requeued.load(Ordering::Acquire);
                            let got =
                                match outbox.claim(ClaimRequest::new(10, LEASE).unwrap()).await {
                                    Ok(got) => got,
                                    // Contention with the requeue's transaction: try again.
                                    Err(e) if e.is_retryable() && !over => continue,
                                    Err(e) => panic!("claim failed: {}", e.report()),
                                };
                            let ids: Vec<_> = got.iter().map(|c| c.message.id).collect();
                            assert!(
                                !(ids.contains(&x) && ids.contains(&y)),
                                "one claim took two messages of one key: {ids:?}"
                            );
                            for c in &got {
                                outbox.release_one(&c.lease).await.unwrap();
                            }
                            if over {
                                return;
                            }
                        }
                    })
                })
                .collect();
            let selection = DeadLetterSelection::Ids(vec![x.id()]);
            start.wait().await;
            let mut attempts = 0;
            let n = loop {
                attempts += 1;
                match outbox.requeue_dead(&selection).await {
                    Ok(n) => break n,
                    // A transaction conflict with a claimer's marker removal.
                    Err(e) if e.is_retryable() && attempts < 20 => {}
                    Err(e) => panic!("requeue failed: {}", e.report()),
                }
            };
            assert_eq!(n, 1, "X was requeued");
            requeued.store(true, Ordering::Release);
            for c in claimers {
                c.await.expect("a claimer panicked");
            }

            let got = outbox
                .claim(ClaimRequest::new(10, LEASE).unwrap())
                .await
                .unwrap();
            let ids: Vec<_> = got.iter().map(|c| c.message.id).collect();
            assert_eq!(
                ids,
                vec![x.id()],
                "round {round}: after the requeue X must be its key's head, ahead of Y"
            );
            outbox.complete_one(&got[0].lease).await.unwrap();
            let got = outbox
                .claim(ClaimRequest::new(10, LEASE).unwrap())
                .await
                .unwrap();
            let ids: Vec<_> = got.iter().map(|c| c.message.id).collect();
            assert_eq!(ids, vec![y.id()], "round {round}: Y follows X");
            outbox.complete_one(&got[0].lease).await.unwrap();
        }
    }
}

dynamo_test! {
    /// A requeued dead letter goes back to its original place in its key's order (its
    /// marker put back in the requeue's transaction: a message of its key enqueued after
    /// it waits behind it again), and to the end of the due order of its shards (due now,
    /// not at the start of time): an unkeyed message enqueued before the requeue is
    /// claimed first.
    async fn a_requeued_dead_letter_goes_back_to_its_place(
        (_, outbox) = common::client_and_outbox(
            "outbox-dynamodb requeue place",
            DynamoOutboxConfig::default().with_ordering(KeyOrder::PerKey),
        )
    ) {
        let claim = |n: usize| {
            let outbox = outbox.clone();
            async move {
                outbox
                    .claim(ClaimRequest::new(n, LEASE).unwrap())
                    .await
                    .unwrap()
                    .into_messages()
            }
        };
        let (first, plain) = (keyed("order-7"), NewMessage::builder("u").build().unwrap());
        common::enqueue_all(&outbox, &[first.clone(), plain.clone()])
            .await
            .unwrap();
        for c in claim(2).await {
            let dead = Failure::new(c.lease, "poison", Disposition::DeadLetter);
            outbox.fail_one(dead).await.unwrap();
        }
        let (later, waiting) = (keyed("order-7"), NewMessage::builder("w").build().unwrap());
        common::enqueue_all(&outbox, &[later.clone(), waiting.clone()])
            .await
            .unwrap();
        let selection = DeadLetterSelection::Ids(vec![first.id(), plain.id()]);
        assert_eq!(outbox.requeue_dead(&selection).await.unwrap(), 2);

        // `waiting` (due before the requeue) comes first, then the requeued two; `later`
        // waits behind `first`, its key's head again.
        let got: Vec<_> = claim(10).await.iter().map(|c| c.message.id).collect();
        assert_eq!(got.first(), Some(&waiting.id()), "{got:?}");
        let mut rest = got[1..].to_vec();
        rest.sort();
        let mut requeued = vec![first.id(), plain.id()];
        requeued.sort();
        assert_eq!(rest, requeued, "{got:?}: `later` is blocked behind `first`");
    }
}
