//! The body sweep off the claim's path: it fails alone (a claim neither fails nor waits
//! for it), one message's failure does not stop the rest of its shard, a failed sweep
//! is counted and does not pass for a sweep, and renewals racing each other or a
//! dead-lettering write nothing. Helpers and times as in `bodies.rs`.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use outbox_core::{store::ClaimIds, store::ClaimRequest, KeyOrder, NewMessage, OutboxStore};
use outbox_dynamodb::DynamoOutbox;
use outbox_testkit::wait_until;

use crate::bodies::{
    age, age_body, body, body_exp, body_ttls, config, now_s, pk, put, Item, AT_RISK, BODY_TTL,
    LEASE,
};
use crate::common;

/// Replace message `id`'s first body item by one at DynamoDB's 400 KB item limit with
/// a one-digit `ttl`, the largest that DynamoDB stores: pushing that `ttl` out to a
/// ten-digit one makes the item too large, so every renewal of it fails.
async fn unrenewable_body(outbox: &DynamoOutbox, id: outbox_core::MessageId) {
    let item = |len: usize| -> Item {
        Item::from([
            ("pk".to_owned(), pk(id)),
            ("sk".to_owned(), AttributeValue::S("b#000".into())),
            (
                "payload".to_owned(),
                AttributeValue::B(vec![0u8; len].into()),
            ),
            ("ttl".to_owned(), AttributeValue::N("1".into())),
        ])
    };
    let (mut fits, mut too_big) = (390_000, 409_601);
    while too_big - fits > 1 {
        let mid = (fits + too_big) / 2;
        let sent = outbox
            .client()
            .put_item()
            .table_name(outbox.config().table())
            .set_item(Some(item(mid)))
            .send()
            .await;
        if sent.is_ok() {
            fits = mid;
        } else {
            too_big = mid;
        }
    }
    put(outbox, item(fits)).await;
}

dynamo_test! {
    /// Messages blocked behind their key's leased head, all at risk and in one shard, the
    /// oldest of them with a body no renewal can write: the claim returns (claiming
    /// nothing), the sweep it started counts the one failure and renews all the others.
    async fn a_failing_renewal_neither_fails_the_claim_nor_stops_the_shards_pass(
        client = common::client("outbox-dynamodb sweep failure")
    ) {
        let store = DynamoOutbox::new(
            client.clone(),
            config()
                .with_table(common::table_name("outbox"))
                .with_shards(1)
                .with_ordering(KeyOrder::PerKey),
        )
        .unwrap();
        store.install().await.unwrap();
        let keyed = |d: String| NewMessage::builder(d).partition_key("k").build().unwrap();
        let messages: Vec<NewMessage> = (0..22).map(|i| keyed(format!("m{i}"))).collect();
        common::enqueue_all(&store, &messages).await.unwrap();
        let (head, bad, good) = (&messages[0], &messages[1], &messages[2..]);
        // The head is leased: the others stay blocked, in the due index, unclaimed.
        let ids = ClaimIds::new(&[head.id()], LEASE).unwrap();
        assert_eq!(store.claim_ids(&ids).await.unwrap().messages.len(), 1);
        age(&store, bad.id(), AT_RISK + Duration::from_secs(60)).await;
        for m in good {
            age(&store, m.id(), AT_RISK).await;
        }
        unrenewable_body(&store, bad.id()).await;

        let start = now_s();
        let claimed = store
            .claim(ClaimRequest::new(10, LEASE).unwrap())
            .await
            .unwrap();
        assert!(claimed.messages.is_empty(), "the key is blocked");
        wait_until("the sweep to renew every renewable body", || async {
            for m in good {
                if body_exp(&store, m.id())
                    .await
                    .is_none_or(|e| e < start + BODY_TTL.as_secs())
                {
                    return false;
                }
            }
            true
        })
        .await;
        for m in good {
            assert!(body_ttls(&store, m.id()).await[0] >= start + BODY_TTL.as_secs());
        }
        wait_until("the sweep to finish its pass", || async {
            store.metrics().last_body_sweep.is_some()
        })
        .await;
        let m = store.metrics();
        assert!(m.body_sweep_errors >= 1, "{m:?}");
        assert_eq!(m.bodies_renewed, 20, "{m:?}");
        assert_eq!(body_ttls(&store, bad.id()).await, vec![1], "not renewable");
    }

    /// A store whose table is missing: its claim fails (reading the table's shard count)
    /// and starts no sweep; an explicit sweep reports the error, is counted, and is no
    /// sweep: `last_body_sweep` stays `None`.
    async fn a_failed_sweep_is_counted_and_not_taken_for_a_sweep(
        client = common::client("outbox-dynamodb sweep fails")
    ) {
        let store = DynamoOutbox::new(
            client,
            config()
                .with_table(common::table_name("missing"))
                .with_shard_leases(None),
        )
        .unwrap();
        assert!(store
            .claim(ClaimRequest::new(1, LEASE).unwrap())
            .await
            .is_err());
        assert_eq!(store.metrics().body_sweep_errors, 0, "no sweep started");
        assert!(store.renew_bodies().await.is_err());
        let m = store.metrics();
        assert_eq!(m.body_sweep_errors, 1, "{m:?}");
        assert_eq!(m.last_body_sweep, None, "{m:?}");
        assert_eq!(m.bodies_renewed, 0);
    }

    /// A renewer that finds the body already renewed by another (its own state read was
    /// older than that renewal) is refused and writes nothing, though its own renewal
    /// would be a little later: renewals are conditioned on the need, not on the new
    /// time to live.
    async fn a_second_renewer_is_refused(
        (_, outbox) = common::client_and_outbox("outbox-dynamodb renewal race", config())
    ) {
        let m = NewMessage::builder("raced").build().unwrap();
        common::enqueue_all(&outbox, std::slice::from_ref(&m))
            .await
            .unwrap();
        age(&outbox, m.id(), AT_RISK).await;
        assert_eq!(outbox.renew_bodies().await.unwrap(), 1);
        // The first renewer's body write, a little earlier than the second's would be,
        // with its record of it not yet written: the state still says at risk.
        age_body(&outbox, m.id(), Duration::from_secs(10)).await;
        let renewed = body_ttls(&outbox, m.id()).await;
        let mut state = crate::bodies::state(&outbox, m.id()).await.unwrap();
        let old = (now_s() + 20 * 60).to_string();
        state.insert("body_exp".into(), AttributeValue::N(old));
        put(&outbox, state).await;
        let refused = outbox.metrics().refused_writes;

        assert_eq!(outbox.renew_bodies().await.unwrap(), 0);
        assert_eq!(
            body_ttls(&outbox, m.id()).await,
            renewed,
            "not written again"
        );
        let metrics = outbox.metrics();
        assert_eq!(metrics.bodies_renewed, 1, "{metrics:?}");
        assert_eq!(metrics.refused_writes, refused + 1, "{metrics:?}");
    }

    /// An undelivered message whose body has no time to live (a dead letter's body, as a
    /// requeue that could not set it leaves it) is not given one by a renewal: the sweep's
    /// write is refused.
    async fn a_body_without_a_ttl_is_not_given_one(
        (_, outbox) = common::client_and_outbox("outbox-dynamodb renewal no ttl", config())
    ) {
        let m = NewMessage::builder("kept").build().unwrap();
        common::enqueue_all(&outbox, std::slice::from_ref(&m))
            .await
            .unwrap();
        age(&outbox, m.id(), AT_RISK).await;
        let mut part = body(&outbox, m.id()).await.remove(0);
        part.remove("ttl");
        put(&outbox, part).await;

        assert_eq!(outbox.renew_bodies().await.unwrap(), 0);
        assert!(!body(&outbox, m.id()).await[0].contains_key("ttl"));
        assert_eq!(outbox.metrics().bodies_renewed, 0);
        assert!(body_exp(&outbox, m.id()).await.unwrap() < now_s() + 30 * 60);
    }
}
