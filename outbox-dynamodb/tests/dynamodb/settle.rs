//! Settles of leases that were lost: whatever request carries the settle, a lease whose
//! message another claimer took over and settled is reported lost, never applied.

use std::time::Duration;

use outbox_core::{store::ClaimRequest, store::ClaimedMessage, OutboxStore};
use outbox_dynamodb::{DynamoOutbox, DynamoOutboxConfig};
use outbox_testkit::poll_for;

use crate::common;

const SHORT: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(30);

async fn claim(store: &DynamoOutbox, n: usize, lease: Duration) -> Vec<ClaimedMessage> {
    store
        .claim(ClaimRequest::new(n, lease).unwrap())
        .await
        .unwrap()
        .into_messages()
}

dynamo_test! {
    /// Under `Retention::Delete` without per-key order, completes travel as a PartiQL
    /// batch of `DELETE`s, and a PartiQL `DELETE` of a key that no longer exists succeeds
    /// with nothing deleted. A relay whose lease lapsed while another relay claimed the
    /// message again and completed it (deleting it) must still hear that its lease was
    /// lost, alone in its batch: the other complete in the same call applies.
    async fn completing_a_message_another_relay_completed_reports_the_lease_lost(
        client = common::client("outbox-dynamodb lost complete")
    ) {
        // Without shard leases, so the other relay reads the message's shard.
        let outbox = common::outbox(
            &client,
            DynamoOutboxConfig::default().with_shard_leases(None),
        )
        .await
        .unwrap();
        let lapsing = outbox_core::NewMessage::builder("lost").build().unwrap();
        common::enqueue_all(&outbox, std::slice::from_ref(&lapsing))
            .await
            .unwrap();
        let stale = claim(&outbox, 1, SHORT).await.remove(0);
        assert_eq!(stale.message.id, lapsing.id());

        // Another relay (a store of its own over the same table) claims it once the lease
        // lapsed, and completes it: the state item is deleted.
        let other = DynamoOutbox::new(client.clone(), outbox.config().clone()).unwrap();
        let fresh = poll_for(
            "the lease to lapse and the message to be claimed again",
            || {
                let other = other.clone();
                async move { claim(&other, 1, LONG).await.pop() }
            },
        )
        .await;
        assert_eq!(fresh.message.id, lapsing.id());
        let done = other.complete(&[fresh.lease]).await.unwrap();
        assert_eq!((done.applied, done.lost.len()), (1, 0));

        // A second message the stale relay still holds, completed in the same call.
        let held = outbox_core::NewMessage::builder("held").build().unwrap();
        common::enqueue_all(&outbox, std::slice::from_ref(&held))
            .await
            .unwrap();
        let live = poll_for("the second message to be claimed", || {
            let outbox = outbox.clone();
            async move { claim(&outbox, 1, LONG).await.pop() }
        })
        .await;
        assert_eq!(live.message.id, held.id());

        let settled = outbox.complete(&[stale.lease, live.lease]).await.unwrap();
        assert_eq!(
            settled.lost,
            vec![lapsing.id()],
            "the lapsed lease's message was completed by another relay: lost, not applied"
        );
        assert_eq!(settled.applied, 1, "the live lease completes");
    }

    /// A lease renewal writes the small state item and moves its `due` entry, whatever the
    /// payload: 3 write units per lease (S = 1 under 1 KB), no body write while the body
    /// has more than half its time to live left past the new expiry.
    async fn a_lease_renewal_costs_three_write_units_whatever_the_payload(
        (_, outbox) = common::client_and_outbox(
            "outbox-dynamodb renewal cost",
            DynamoOutboxConfig::default(),
        )
    ) {
        let messages: Vec<outbox_core::NewMessage> = [10, 200 * 1024]
            .into_iter()
            .map(|size| {
                outbox_core::NewMessage::builder("renewed")
                    .payload(vec![5u8; size])
                    .build()
                    .unwrap()
            })
            .collect();
        common::enqueue_all(&outbox, &messages).await.unwrap();
        let held = claim(&outbox, 2, SHORT).await;
        assert_eq!(held.len(), 2);
        let leases: Vec<_> = held.iter().map(|c| c.lease).collect();
        let before = outbox.metrics();
        let renewed = outbox.renew(&leases, LONG).await.unwrap();
        assert!(renewed.lost.is_empty(), "{renewed:?}");
        let after = outbox.metrics();
        assert_eq!(
            after.settle_units - before.settle_units,
            2.0 * 3.0,
            "{after:?}"
        );
        assert_eq!(after.bodies_renewed, before.bodies_renewed);
        assert_eq!(after.body_renewal_units, before.body_renewal_units);
        assert!(renewed
            .leases
            .iter()
            .all(|l| l.expires_at > leases[0].expires_at));
    }
}
