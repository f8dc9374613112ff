//! Body renewal: the bodies of messages that wait long are kept ahead of their time to
//! live by the relays' sweep (and by retries that back off long), and nothing else's.
//!
//! DynamoDB Local never deletes expired items, so these tests read the `ttl` attribute
//! of the body items (and `body_exp` of the state item) instead. A message is made to
//! have waited by moving its times back, exactly as if it had been enqueued that much
//! earlier (`age`): the body TTL must be at least an hour, and no test waits that long.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use outbox_core::{
    store::ClaimRequest, store::Disposition, store::Failure, KeyOrder, MessageId, MessageLimits,
    NewMessage, OutboxStore, Retention,
};
use outbox_dynamodb::{DynamoOutbox, DynamoOutboxConfig};
use outbox_testkit::wait_until;

use crate::common;

pub(crate) type Item = HashMap<String, AttributeValue>;

pub(crate) const LEASE: Duration = Duration::from_secs(30);
/// The shortest body TTL the config accepts: the sweep looks at messages waiting over
/// 3¾ minutes and renews bodies with under 30 minutes left; claims, retries and
/// releases renew bodies with under 30 minutes left past the new availability.
pub(crate) const BODY_TTL: Duration = Duration::from_secs(3600);
/// Long enough to be at risk: 20 minutes of body left.
pub(crate) const AT_RISK: Duration = Duration::from_secs(40 * 60);
/// Waiting long enough to be looked at, with 40 minutes of body left: not at risk.
pub(crate) const WAITING: Duration = Duration::from_secs(20 * 60);

pub(crate) fn config() -> DynamoOutboxConfig {
    DynamoOutboxConfig::default().with_body_ttl(BODY_TTL)
}

pub(crate) fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

pub(crate) fn pk(id: MessageId) -> AttributeValue {
    AttributeValue::S(format!("m#{}", id.as_uuid().hyphenated()))
}

pub(crate) fn num(item: &Item, name: &str) -> Option<u128> {
    match item.get(name) {
        Some(AttributeValue::N(text)) => text.parse().ok(),
        _ => None,
    }
}

fn shift(item: &mut Item, name: &str, by: u128) {
    if let Some(v) = num(item, name) {
        item.insert(name.to_owned(), AttributeValue::N((v - by).to_string()));
    }
}

pub(crate) async fn state(outbox: &DynamoOutbox, id: MessageId) -> Option<Item> {
    outbox
        .client()
        .get_item()
        .table_name(outbox.config().table())
        .key("pk", pk(id))
        .key("sk", AttributeValue::S("s".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
}

pub(crate) async fn body(outbox: &DynamoOutbox, id: MessageId) -> Vec<Item> {
    outbox
        .client()
        .query()
        .table_name(outbox.config().table())
        .consistent_read(true)
        .key_condition_expression("pk = :pk AND begins_with(sk, :b)")
        .expression_attribute_values(":pk", pk(id))
        .expression_attribute_values(":b", AttributeValue::S("b#".into()))
        .send()
        .await
        .unwrap()
        .items
        .unwrap_or_default()
}

pub(crate) async fn put(outbox: &DynamoOutbox, item: Item) {
    outbox
        .client()
        .put_item()
        .table_name(outbox.config().table())
        .set_item(Some(item))
        .send()
        .await
        .unwrap();
}

/// The body items' `ttl`, in part order.
pub(crate) async fn body_ttls(outbox: &DynamoOutbox, id: MessageId) -> Vec<u64> {
    body(outbox, id)
        .await
        .iter()
        .map(|part| u64::try_from(num(part, "ttl").expect("a body ttl")).unwrap())
        .collect()
}

/// The expiry the state item records for the body.
pub(crate) async fn body_exp(outbox: &DynamoOutbox, id: MessageId) -> Option<u64> {
    state(outbox, id)
        .await
        .and_then(|s| num(&s, "body_exp"))
        .map(|v| u64::try_from(v).unwrap())
}

/// Make message `id` look enqueued `by` earlier: its availability, creation, due time
/// and body expiry (on the state item and on every body item) all move back by `by`.
pub(crate) async fn age(outbox: &DynamoOutbox, id: MessageId, by: Duration) {
    let (us, secs) = (by.as_micros(), u128::from(by.as_secs()));
    if let Some(mut s) = state(outbox, id).await {
        shift(&mut s, "avail_us", us);
        shift(&mut s, "created_us", us);
        shift(&mut s, "due", us * 10_u128.pow(16));
        shift(&mut s, "body_exp", secs);
        put(outbox, s).await;
    }
    age_body(outbox, id, by).await;
}

/// Move only the body items' `ttl` back by `by`.
pub(crate) async fn age_body(outbox: &DynamoOutbox, id: MessageId, by: Duration) {
    for mut part in body(outbox, id).await {
        shift(&mut part, "ttl", u128::from(by.as_secs()));
        put(outbox, part).await;
    }
}

pub(crate) async fn claim(
    store: &DynamoOutbox,
    n: usize,
) -> Vec<outbox_core::store::ClaimedMessage> {
    store
        .claim(ClaimRequest::new(n, LEASE).unwrap())
        .await
        .unwrap()
        .into_messages()
}

dynamo_test! {
    /// A pending message waiting past half its body TTL gets every body item renewed to a
    /// full TTL from now, recorded on its state item, so the next sweep leaves it alone;
    /// a young message is not touched. The gauge shows how long the oldest waited.
    async fn a_message_waiting_past_half_its_body_ttl_is_renewed_by_the_sweep(
        client = common::client("outbox-dynamodb body sweep")
    ) {
        let limits = MessageLimits::default().with_max_payload_bytes(1024 * 1024);
        let outbox = common::outbox(&client, config().with_limits(limits))
            .await
            .unwrap();
        // 400 KiB: two body items (the split layout).
        let old = NewMessage::builder("old")
            .payload(vec![7u8; 400 * 1024])
            .build()
            .unwrap();
        let young = NewMessage::builder("young").build().unwrap();
        common::enqueue_all(&outbox, &[old.clone(), young.clone()])
            .await
            .unwrap();
        age(&outbox, old.id(), AT_RISK).await;
        let before = body_ttls(&outbox, old.id()).await;
        let young_before = body_ttls(&outbox, young.id()).await;
        assert_eq!(before.len(), 2);
        assert!(before[0] < now_s() + 21 * 60, "{before:?}");

        let start = now_s();
        assert_eq!(outbox.renew_bodies().await.unwrap(), 1);
        let after = body_ttls(&outbox, old.id()).await;
        let full = start + BODY_TTL.as_secs();
        assert!(
            after
                .iter()
                .all(|t| *t >= full && *t <= now_s() + BODY_TTL.as_secs() + 1),
            "every part renewed to a full TTL from now: {before:?} -> {after:?}"
        );
        assert_eq!(body_exp(&outbox, old.id()).await, Some(after[0]));
        assert_eq!(body_ttls(&outbox, young.id()).await, young_before);
        let m = outbox.metrics();
        assert_eq!(m.bodies_renewed, 1);
        // Billed at the body's size: 400 KiB of body items is about 400 write units.
        assert!(m.body_renewal_units >= 400.0, "{m:?}");
        assert!(m.last_body_sweep.is_some());
        assert!(
            m.oldest_due_age.is_some_and(|age| age >= AT_RISK),
            "{:?}",
            m.oldest_due_age
        );

        // Recorded: the next sweep reads the state and writes nothing.
        assert_eq!(outbox.renew_bodies().await.unwrap(), 0);
        assert_eq!(body_ttls(&outbox, old.id()).await, after);
        // And the message is still whole.
        let mut got = claim(&outbox, 10).await;
        got.sort_by_key(|c| c.message.id);
        let ids: Vec<MessageId> = got.iter().map(|c| c.message.id).collect();
        let mut want = vec![old.id(), young.id()];
        want.sort();
        assert_eq!(ids, want);
        let whole = got.iter().find(|c| c.message.id == old.id()).unwrap();
        assert_eq!(whole.message.payload, old.payload());
        assert_eq!(
            outbox.metrics().bodies_renewed,
            1,
            "the claim had enough left"
        );
    }

    /// A message waiting long enough to be looked at but with more than half its body TTL
    /// left, and a fresh one, are not written by the sweep; the at-risk one beside them is,
    /// and so is one waiting only a little over a sixteenth of the TTL whose body is at
    /// risk. A claim renews a body only when less than half the TTL would be left past its
    /// lease: not the waiting one under a short lease, the waiting one (not the fresh)
    /// under a long one.
    async fn a_message_not_at_risk_is_not_renewed(
        (_, outbox) = common::client_and_outbox("outbox-dynamodb body not at risk", config())
    ) {
        let messages: Vec<NewMessage> = (0..4)
            .map(|i| NewMessage::builder(format!("m{i}")).build().unwrap())
            .collect();
        common::enqueue_all(&outbox, &messages).await.unwrap();
        let (waiting, fresh, at_risk) = (messages[0].id(), messages[1].id(), messages[2].id());
        age(&outbox, waiting, WAITING).await;
        age(&outbox, at_risk, AT_RISK).await;
        // Waiting 5 minutes (over a sixteenth of the TTL, under a quarter), with a body
        // that has only 20 minutes left (as after a clock jump): the sweep must look.
        let recent = messages[3].id();
        age(&outbox, recent, Duration::from_secs(5 * 60)).await;
        let at_risk_body = AT_RISK - Duration::from_secs(5 * 60);
        age_body(&outbox, recent, at_risk_body).await;
        let mut recent_state = state(&outbox, recent).await.unwrap();
        shift(
            &mut recent_state,
            "body_exp",
            u128::from(at_risk_body.as_secs()),
        );
        put(&outbox, recent_state).await;
        let waiting_before = (
            body_ttls(&outbox, waiting).await,
            body_exp(&outbox, waiting).await,
        );
        let fresh_before = (
            body_ttls(&outbox, fresh).await,
            body_exp(&outbox, fresh).await,
        );
        let at_risk_before = body_ttls(&outbox, at_risk).await;

        assert_eq!(outbox.renew_bodies().await.unwrap(), 2);
        assert!(body_ttls(&outbox, recent).await[0] >= now_s() + BODY_TTL.as_secs() - 1);
        assert_eq!(
            (
                body_ttls(&outbox, waiting).await,
                body_exp(&outbox, waiting).await
            ),
            waiting_before
        );
        assert_eq!(
            (
                body_ttls(&outbox, fresh).await,
                body_exp(&outbox, fresh).await
            ),
            fresh_before
        );
        assert!(body_ttls(&outbox, at_risk).await[0] > at_risk_before[0] + 30 * 60);
        assert_eq!(outbox.metrics().bodies_renewed, 2);

        // A claim keeps half the TTL past its lease. Under a 30-second lease the waiting
        // message (40 minutes left) has enough, and a release (availability now) too.
        let got = claim(&outbox, 10).await;
        assert_eq!(got.len(), 4);
        let leases: Vec<outbox_core::store::Lease> = got.iter().map(|c| c.lease).collect();
        assert!(outbox.release(&leases).await.unwrap().lost.is_empty());
        assert_eq!(body_ttls(&outbox, waiting).await, waiting_before.0);
        assert_eq!(outbox.metrics().bodies_renewed, 2);
        // Under a 15-minute lease it has not (40 < 15 + 30): renewed past the lease; the
        // fresh one (60 minutes left) is not.
        let long = Duration::from_secs(15 * 60);
        let start = now_s();
        let got = outbox
            .claim(ClaimRequest::new(10, long).unwrap())
            .await
            .unwrap();
        assert_eq!(got.len(), 4);
        assert!(
            body_ttls(&outbox, waiting).await[0] >= start + long.as_secs() + BODY_TTL.as_secs()
        );
        assert_eq!(body_ttls(&outbox, fresh).await, fresh_before.0);
        assert_eq!(outbox.metrics().bodies_renewed, 3);
    }

    /// The sweep's renewals wait for the store's renewal budget: at 2 write units per
    /// second, two at-risk 1 KB bodies (each a body write and a state write) cannot all be
    /// renewed from the first second's balance, so some renewal waits; both are renewed.
    /// Without a budget nothing waits.
    async fn the_sweep_waits_for_its_renewal_budget(
        client = common::client("outbox-dynamodb body renewal budget")
    ) {
        for (budget, waits) in [(Some(2), true), (None, false)] {
            let outbox = common::outbox(&client, config().with_renewal_budget(budget))
                .await
                .unwrap();
            let messages: Vec<NewMessage> = (0..2)
                .map(|i| {
                    NewMessage::builder(format!("m{i}"))
                        .payload(vec![1u8; 1024])
                        .build()
                        .unwrap()
                })
                .collect();
            common::enqueue_all(&outbox, &messages).await.unwrap();
            for m in &messages {
                age(&outbox, m.id(), AT_RISK).await;
            }
            assert_eq!(outbox.renew_bodies().await.unwrap(), 2, "{budget:?}");
            let m = outbox.metrics();
            assert!(m.body_renewal_units >= 4.0, "{m:?}");
            assert_eq!(m.sweep_budget_waits > 0, waits, "{budget:?}: {m:?}");
        }
    }

    /// Under per-key order, a message blocked behind its key's head is never claimed while
    /// the head retries; the sweep a claim starts renews its body. The head's own body is
    /// renewed by the retry whose backoff would outlast it. A second claim within the
    /// sweep interval does not sweep again.
    async fn a_message_blocked_behind_its_keys_head_is_renewed_by_a_claims_sweep(
        (_, outbox) = common::client_and_outbox(
            "outbox-dynamodb body blocked",
            config().with_ordering(KeyOrder::PerKey),
        )
    ) {
        let keyed = |d: &str| {
            NewMessage::builder(d)
                .partition_key("order-1")
                .build()
                .unwrap()
        };
        let (head, blocked) = (keyed("head"), keyed("blocked"));
        common::enqueue_all(&outbox, &[head.clone(), blocked.clone()])
            .await
            .unwrap();
        age(&outbox, head.id(), AT_RISK).await;
        age(&outbox, blocked.id(), AT_RISK).await;
        let before = body_ttls(&outbox, blocked.id()).await;

        // This store's first claim starts a sweep of its shards, and claims the head only.
        let start = now_s();
        let got = claim(&outbox, 10).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].message.id, head.id());
        wait_until("the claim's sweep to renew the blocked body", || async {
            let after = body_ttls(&outbox, blocked.id()).await;
            after[0] >= start + BODY_TTL.as_secs()
                && body_exp(&outbox, blocked.id()).await == Some(after[0])
        })
        .await;
        let after = body_ttls(&outbox, blocked.id()).await;
        assert!(after[0] > before[0]);

        // The head backs off for two hours: its body must outlive the backoff.
        let backoff = Duration::from_secs(2 * 3600);
        let failed = outbox
            .fail(&[Failure::new(
                got[0].lease,
                "broker down",
                Disposition::Retry { after: backoff },
            )])
            .await
            .unwrap();
        assert!(failed.lost.is_empty());
        let head_ttl = body_ttls(&outbox, head.id()).await[0];
        assert!(
            head_ttl >= now_s() + backoff.as_secs() + BODY_TTL.as_secs() * 3 / 4,
            "the retry kept the head's body ahead of its backoff: {head_ttl}"
        );
        assert!(claim(&outbox, 10).await.is_empty(), "the key is blocked");

        // Put the blocked body at risk again: a claim within the sweep interval leaves
        // it (no second sweep), an explicit sweep renews it.
        age(&outbox, blocked.id(), BODY_TTL).await;
        let again = body_ttls(&outbox, blocked.id()).await;
        assert!(claim(&outbox, 10).await.is_empty());
        assert_eq!(body_ttls(&outbox, blocked.id()).await, again);
        assert_eq!(outbox.renew_bodies().await.unwrap(), 1);
        assert!(body_ttls(&outbox, blocked.id()).await[0] >= now_s() + BODY_TTL.as_secs() - 1);
    }

    /// A completed message's body is left to its time to live (under `Delete` its state is
    /// gone, under `Keep` it left the due index); a pending one beside it is renewed.
    async fn a_completed_messages_body_is_not_renewed(
        client = common::client("outbox-dynamodb body completed")
    ) {
        for retention in [
            Retention::Delete,
            Retention::Keep {
                window: Duration::from_secs(3600),
            },
        ] {
            let outbox = common::outbox(&client, config().with_retention(retention))
                .await
                .unwrap();
            let done = NewMessage::builder("done").build().unwrap();
            common::enqueue_all(&outbox, std::slice::from_ref(&done))
                .await
                .unwrap();
            let got = claim(&outbox, 1).await;
            assert_eq!(got.len(), 1);
            let settled = outbox.complete(&[got[0].lease]).await.unwrap();
            assert!(settled.lost.is_empty());
            let pending = NewMessage::builder("pending").build().unwrap();
            common::enqueue_all(&outbox, std::slice::from_ref(&pending))
                .await
                .unwrap();
            age(&outbox, done.id(), AT_RISK).await;
            age(&outbox, pending.id(), AT_RISK).await;
            let done_before = body_ttls(&outbox, done.id()).await;
            let pending_before = body_ttls(&outbox, pending.id()).await;

            assert_eq!(outbox.renew_bodies().await.unwrap(), 1, "{retention:?}");
            assert_eq!(
                body_ttls(&outbox, done.id()).await,
                done_before,
                "{retention:?}"
            );
            assert!(body_ttls(&outbox, pending.id()).await[0] > pending_before[0] + 30 * 60);
        }
    }

    /// A dead letter keeps its body (no time to live) and is never swept; a requeue gives
    /// the body a full time to live back and records it on the state item.
    async fn a_dead_letter_keeps_its_body_and_a_requeue_renews_it(
        (_, outbox) = common::client_and_outbox("outbox-dynamodb body dead letter", config())
    ) {
        let m = NewMessage::builder("dead").build().unwrap();
        common::enqueue_all(&outbox, std::slice::from_ref(&m))
            .await
            .unwrap();
        let got = claim(&outbox, 1).await;
        let failure = Failure::new(got[0].lease, "refused", Disposition::DeadLetter);
        assert!(outbox.fail(&[failure]).await.unwrap().lost.is_empty());
        age(&outbox, m.id(), AT_RISK).await;
        let parts = body(&outbox, m.id()).await;
        assert_eq!(parts.len(), 1);
        assert!(
            !parts[0].contains_key("ttl"),
            "a dead letter's body has no TTL"
        );
        assert_eq!(outbox.renew_bodies().await.unwrap(), 0);
        assert!(!body(&outbox, m.id()).await[0].contains_key("ttl"));

        let start = now_s();
        let selection = outbox_core::DeadLetterSelection::Ids(vec![m.id()]);
        assert_eq!(
            outbox_core::OutboxAdmin::requeue_dead(&outbox, &selection)
                .await
                .unwrap(),
            1
        );
        let ttl = body_ttls(&outbox, m.id()).await[0];
        assert!(ttl >= start + BODY_TTL.as_secs(), "{ttl}");
        assert_eq!(body_exp(&outbox, m.id()).await, Some(ttl));
    }
}
