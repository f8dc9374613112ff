//! Enqueue in the caller's transaction, refused conditional writes, poison items and
//! stale order markers.

use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use outbox_core::{
    ClaimRequest, ErrorKind, KeyOrder, MessageId, NewMessage, OutboxAdmin, OutboxStore,
    OutboxStoreExt,
};
use outbox_dynamodb::{DynamoOutbox, DynamoOutboxConfig};

use crate::common;

const LEASE: Duration = Duration::from_secs(30);

async fn claim(store: &DynamoOutbox, n: usize) -> Vec<outbox_core::ClaimedMessage> {
    store
        .claim(ClaimRequest::new(n, LEASE).unwrap())
        .await
        .unwrap()
        .into_messages()
}

fn order_put(outbox: &DynamoOutbox, order: &str) -> TransactWriteItem {
    let put = Put::builder()
        .table_name(outbox.config().table())
        .item("pk", AttributeValue::S(format!("order#{order}")))
        .item("sk", AttributeValue::S("order".into()))
        .item("status", AttributeValue::S("paid".into()))
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .unwrap();
    TransactWriteItem::builder().put(put).build()
}

async fn order_exists(outbox: &DynamoOutbox, order: &str) -> bool {
    outbox
        .client()
        .get_item()
        .table_name(outbox.config().table())
        .key("pk", AttributeValue::S(format!("order#{order}")))
        .key("sk", AttributeValue::S("order".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .is_some()
}

/// The caller's write and the messages commit together; when the caller's condition
/// fails, or a message id is already stored, neither is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_commits_with_the_callers_writes_or_not_at_all() {
    let Some(client) = common::client("outbox-dynamodb enqueue").await else {
        return;
    };
    let outbox = common::outbox(&client, DynamoOutboxConfig::default())
        .await
        .unwrap();
    let first = NewMessage::builder("orders.paid").build().unwrap();
    outbox
        .enqueue(vec![order_put(&outbox, "1")], std::slice::from_ref(&first))
        .await
        .unwrap();
    assert!(order_exists(&outbox, "1").await);

    // The order exists already: its condition cancels the transaction.
    let err = outbox
        .enqueue(
            vec![order_put(&outbox, "1")],
            &[NewMessage::builder("x").build().unwrap()],
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert!(err.ids().is_empty(), "the caller's write failed, not an id");

    // A stored id: a conflict naming it, and the new order is not written either.
    let err = outbox
        .enqueue(
            vec![order_put(&outbox, "2")],
            &[NewMessage::builder("y").build().unwrap(), first.clone()],
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert_eq!(err.ids(), &[first.id()]);
    assert!(!order_exists(&outbox, "2").await);
    assert_eq!(outbox.stats().await.unwrap().pending, 1);
}

/// Two claimers racing for the same message: one conditional write passes, the other
/// is refused and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_claims_are_decided_by_the_conditional_write() {
    let Some(client) = common::client("outbox-dynamodb claim race").await else {
        return;
    };
    let outbox = common::outbox(&client, DynamoOutboxConfig::default())
        .await
        .unwrap();
    let messages: Vec<NewMessage> = (0..30)
        .map(|_| NewMessage::builder("r").build().unwrap())
        .collect();
    common::enqueue_all(&outbox, &messages).await.unwrap();
    let claimers: Vec<_> = (0..6)
        .map(|_| {
            let outbox = outbox.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let got = claim(&outbox, 5).await;
                    if got.is_empty() {
                        return mine;
                    }
                    mine.extend(got.into_iter().map(|c| c.message.id));
                }
            })
        })
        .collect();
    let mut all: Vec<MessageId> = Vec::new();
    for c in claimers {
        all.extend(c.await.unwrap());
    }
    all.sort();
    let before = all.len();
    all.dedup();
    assert_eq!(
        (before, all.len()),
        (30, 30),
        "each message claimed exactly once"
    );
    let m = outbox.metrics();
    assert_eq!(m.claimed, 30);
    assert!(m.claim_write_units > 0.0 || m.claim_read_units >= 0.0);
}

/// An item another tool wrote with headers that do not decode is dead-lettered by the
/// claim that meets it, with the reason; the others are returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_items_are_dead_lettered_by_the_claim() {
    let Some(client) = common::client("outbox-dynamodb poison").await else {
        return;
    };
    let outbox = common::outbox(&client, DynamoOutboxConfig::default())
        .await
        .unwrap();
    let good = NewMessage::builder("ok").build().unwrap();
    let poison = NewMessage::builder("bad").build().unwrap();
    let mut writes = outbox
        .enqueue_writes(std::slice::from_ref(&poison))
        .unwrap();
    let mut put = writes.remove(0).put.unwrap();
    put.item.insert(
        "headers".into(),
        AttributeValue::S("[\"not an object\"]".into()),
    );
    client
        .put_item()
        .table_name(outbox.config().table())
        .set_item(Some(put.item))
        .send()
        .await
        .unwrap();
    outbox
        .enqueue(Vec::new(), std::slice::from_ref(&good))
        .await
        .unwrap();
    let got = claim(&outbox, 10).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message.id, good.id());
    let dead = outbox
        .dead_letters(&outbox_core::DeadLetterPage::new(Default::default(), 10).unwrap())
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message.id, poison.id());
    let reason = dead[0].message.last_error.clone().unwrap();
    assert!(reason.contains("headers"), "{reason}");
}

/// A crash between completing a keyed message and removing its order marker leaves a
/// stale marker; the next head check of the key removes it instead of blocking forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_order_markers_do_not_block_their_key() {
    let Some(client) = common::client("outbox-dynamodb stale marker").await else {
        return;
    };
    let config = DynamoOutboxConfig::default().with_ordering(KeyOrder::PerKey);
    let outbox = common::outbox(&client, config).await.unwrap();
    // The marker of a message that was never stored (its put lost in a crash is
    // impossible, as both share a transaction; a marker surviving its message is what a
    // crash after the settle leaves): write only the marker of `ghost`.
    let ghost = NewMessage::builder("k")
        .partition_key("acct-1")
        .build()
        .unwrap();
    let writes = outbox.enqueue_writes(std::slice::from_ref(&ghost)).unwrap();
    let marker = writes[1].put().unwrap().item().clone();
    client
        .put_item()
        .table_name(outbox.config().table())
        .set_item(Some(marker))
        .send()
        .await
        .unwrap();
    let next = NewMessage::builder("k")
        .partition_key("acct-1")
        .build()
        .unwrap();
    outbox
        .enqueue(Vec::new(), std::slice::from_ref(&next))
        .await
        .unwrap();
    let got = claim(&outbox, 10).await;
    assert_eq!(got.len(), 1, "the stale marker must not block the key");
    assert_eq!(got[0].message.id, next.id());
    outbox.complete_one(&got[0].lease).await.unwrap();
    assert_eq!(outbox.stats().await.unwrap().pending, 0);
}
