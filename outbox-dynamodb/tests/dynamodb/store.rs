//! Enqueue in the caller's transaction, refused conditional writes, poison items and
//! stale order markers.

use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use outbox_core::{
    store::ClaimRequest, store::OutboxStoreExt, ErrorKind, KeyOrder, MessageId, NewMessage,
    OutboxAdmin, OutboxStore,
};
use outbox_dynamodb::{DynamoOutbox, DynamoOutboxConfig};

use crate::common;

const LEASE: Duration = Duration::from_secs(30);

async fn claim(store: &DynamoOutbox, n: usize) -> Vec<outbox_core::store::ClaimedMessage> {
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

dynamo_test! {
    /// The caller's write and the messages commit together; when the caller's condition
    /// fails, or a message id is already stored, neither is written.
    async fn enqueue_commits_with_the_callers_writes_or_not_at_all(
        (_, outbox) =
            common::client_and_outbox("outbox-dynamodb enqueue", DynamoOutboxConfig::default())
    ) {
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

        // A retry of an enqueue that committed (as after a timeout) names every id: the
        // sign the documentation gives callers that the first attempt was stored. With a
        // condition of the caller's own failing too, it names none.
        let pair = [
            NewMessage::builder("a").build().unwrap(),
            NewMessage::builder("b").build().unwrap(),
        ];
        outbox
            .enqueue(vec![order_put(&outbox, "3")], &pair)
            .await
            .unwrap();
        let err = outbox.enqueue(Vec::new(), &pair).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
        let mut named = err.ids().to_vec();
        named.sort();
        let mut ids = vec![pair[0].id(), pair[1].id()];
        ids.sort();
        assert_eq!(named, ids, "{err}");
        let err = outbox
            .enqueue(vec![order_put(&outbox, "3")], &pair)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
        assert!(err.ids().is_empty(), "{err}");
    }

    /// Two claimers racing for the same message: one conditional write passes, the other
    /// is refused and counted.
    async fn racing_claims_are_decided_by_the_conditional_write(
        (_, outbox) =
            common::client_and_outbox("outbox-dynamodb claim race", DynamoOutboxConfig::default())
    ) {
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

    /// Items another tool wrote that do not make a valid message: headers that do not
    /// decode, a payload over the store's limit (500 KB, split over two body items), a
    /// state item whose body is gone, a state item whose `attempts` (projected into the
    /// `due` index) is not a number. Each is dead-lettered by the claim that meets it,
    /// with the reason, and delivery goes on: the good messages around them are returned.
    async fn poison_items_are_dead_lettered_by_the_claim(
        (client, outbox) =
            common::client_and_outbox("outbox-dynamodb poison", DynamoOutboxConfig::default())
    ) {
        let table = outbox.config().table().to_owned();
        let put_all = |items: Vec<std::collections::HashMap<String, AttributeValue>>| {
            let (client, table) = (client.clone(), table.clone());
            async move {
                for item in items {
                    client
                        .put_item()
                        .table_name(&table)
                        .set_item(Some(item))
                        .send()
                        .await
                        .unwrap();
                }
            }
        };
        let items_of = |m: &NewMessage, store: &DynamoOutbox| -> Vec<_> {
            store
                .enqueue_writes(std::slice::from_ref(m))
                .unwrap()
                .into_iter()
                .map(|w| w.put.unwrap().item)
                .collect()
        };
        let before = NewMessage::builder("ok").build().unwrap();
        outbox
            .enqueue(Vec::new(), std::slice::from_ref(&before))
            .await
            .unwrap();

        // Headers that do not decode: the first body item (sort key `b#000`) holds them.
        let bad_headers = NewMessage::builder("bad").build().unwrap();
        let mut items = items_of(&bad_headers, &outbox);
        assert_eq!(items[1]["sk"], AttributeValue::S("b#000".into()));
        items[1].insert(
            "headers".into(),
            AttributeValue::S("[\"not an object\"]".into()),
        );
        put_all(items).await;

        // An oversized payload, written by a store with a larger limit.
        let roomy = DynamoOutbox::new(
            client.clone(),
            outbox.config().clone().with_limits(
                outbox_core::MessageLimits::default().with_max_payload_bytes(1024 * 1024),
            ),
        )
        .unwrap();
        roomy.check_shards().await.unwrap();
        let oversized = NewMessage::builder("big")
            .limits(outbox_core::MessageLimits::default().with_max_payload_bytes(usize::MAX))
            .payload(vec![7u8; 500 * 1024])
            .build()
            .unwrap();
        let items = items_of(&oversized, &roomy);
        assert_eq!(items.len(), 3, "state and two body items");
        put_all(items).await;

        // A state item without its body.
        let bodiless = NewMessage::builder("gone").build().unwrap();
        put_all(items_of(&bodiless, &outbox).into_iter().take(1).collect()).await;

        // A projected attribute that does not decode: it must not stop the shard's claims.
        let miscounted = NewMessage::builder("miscounted").build().unwrap();
        let mut items = items_of(&miscounted, &outbox);
        items[0].insert("attempts".into(), AttributeValue::S("two".into()));
        put_all(items).await;

        let after = NewMessage::builder("ok").build().unwrap();
        outbox
            .enqueue(Vec::new(), std::slice::from_ref(&after))
            .await
            .unwrap();
        let got = outbox
            .claim(ClaimRequest::new(10, LEASE).unwrap())
            .await
            .unwrap();
        assert_eq!(got.dead_lettered, 4);
        let mut ids: Vec<MessageId> = got.iter().map(|c| c.message.id).collect();
        ids.sort();
        let mut want = vec![before.id(), after.id()];
        want.sort();
        assert_eq!(ids, want, "delivery goes on around the poison");
        let dead = outbox
            .dead_letters(&outbox_core::DeadLetterPage::new(Default::default(), 10).unwrap())
            .await
            .unwrap();
        assert_eq!(dead.len(), 4);
        let reason = |id: MessageId| {
            dead.iter()
                .find(|d| d.message.id == id)
                .and_then(|d| d.message.last_error.clone())
                .unwrap_or_default()
        };
        assert!(
            reason(bad_headers.id()).contains("headers"),
            "{}",
            reason(bad_headers.id())
        );
        assert!(
            reason(oversized.id()).contains("payload"),
            "{}",
            reason(oversized.id())
        );
        assert!(
            reason(bodiless.id()).contains("body"),
            "{}",
            reason(bodiless.id())
        );
        assert!(
            reason(miscounted.id()).contains("attempts that is not a number"),
            "{}",
            reason(miscounted.id())
        );
        let big = dead
            .iter()
            .find(|d| d.message.id == oversized.id())
            .unwrap();
        assert_eq!(
            big.message.payload.len(),
            500 * 1024,
            "the dead letter keeps its body"
        );
    }

    /// A crash between completing a keyed message and removing its order marker leaves a
    /// stale marker; the next head check of the key removes it instead of blocking forever.
    async fn stale_order_markers_do_not_block_their_key(
        client = common::client("outbox-dynamodb stale marker")
    ) {
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
        let marker = writes
            .iter()
            .filter_map(|w| w.put())
            .find(|p| p.item().contains_key("mid"))
            .expect("an order marker")
            .item()
            .clone();
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

    /// An outbox table of layout 1 (keys `pk`/`sk` with the `due` local index) is refused
    /// by install with a schema error that points at the migration note; nothing changes.
    async fn a_layout_one_outbox_table_is_refused_by_install(
        client = common::client("outbox-dynamodb outbox layout")
    ) {
        use aws_sdk_dynamodb::types::{
            AttributeDefinition, BillingMode, KeySchemaElement, KeyType, LocalSecondaryIndex,
            Projection, ProjectionType, ScalarAttributeType,
        };
        let table = common::table_name("outbox_v1");
        let key = |name: &str, kind: KeyType| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
                .unwrap()
        };
        let attr = |name: &str, kind: ScalarAttributeType| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(kind)
                .build()
                .unwrap()
        };
        client
            .create_table()
            .table_name(&table)
            .billing_mode(BillingMode::PayPerRequest)
            .key_schema(key("pk", KeyType::Hash))
            .key_schema(key("sk", KeyType::Range))
            .attribute_definitions(attr("pk", ScalarAttributeType::S))
            .attribute_definitions(attr("sk", ScalarAttributeType::S))
            .attribute_definitions(attr("due", ScalarAttributeType::N))
            .local_secondary_indexes(
                LocalSecondaryIndex::builder()
                    .index_name("due")
                    .key_schema(key("pk", KeyType::Hash))
                    .key_schema(key("due", KeyType::Range))
                    .projection(
                        Projection::builder()
                            .projection_type(ProjectionType::KeysOnly)
                            .build(),
                    )
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap();
        let outbox = DynamoOutbox::new(
            client.clone(),
            DynamoOutboxConfig::default().with_table(&table),
        )
        .unwrap();
        let err = outbox.install().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Schema, "{}", err.report());
        assert!(err.to_string().contains("layout 1"), "{err}");
        assert_eq!(outbox_core::schema::Schema::layout_version(&outbox), 2);
    }
}
