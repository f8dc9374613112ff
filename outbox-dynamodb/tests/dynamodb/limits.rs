//! The 400 KB item, 100-action and 4 MB transaction limits: typed errors before
//! anything is sent.

use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
use outbox_core::consumer::{EntityRecord, EntityStore};
use outbox_core::{
    EntityKey, ErrorKind, KeyOrder, MessageLimits, NewMessage, OutboxAdmin, OutboxStore,
};
use outbox_dynamodb::{
    check_transaction, DynamoOutboxConfig, MAX_ITEM_BYTES, MAX_TRANSACTION_ACTIONS,
};

use crate::common;

fn big(payload: usize) -> NewMessage {
    NewMessage::builder("big")
        .limits(MessageLimits::default().with_max_payload_bytes(usize::MAX))
        .payload(vec![1u8; payload])
        .build()
        .unwrap()
}

async fn nothing_stored(outbox: &outbox_dynamodb::DynamoOutbox) {
    let s = outbox.stats().await.unwrap();
    assert_eq!(
        (s.pending, s.in_flight, s.dead),
        (0, 0, 0),
        "nothing may be written"
    );
}

dynamo_test! {
    /// The split layout: a payload at and past the 400 KB item limit is stored over several
    /// body items and delivered intact; the claim and complete write only the small state
    /// item, so they cost what a tiny message's do. The payload rule still refuses what the
    /// config does not allow, before anything is sent.
    async fn payloads_past_the_400_kb_item_limit_are_split(
        client = common::client("outbox-dynamodb item limit")
    ) {
        let limits = MessageLimits::default().with_max_payload_bytes(1024 * 1024);
        let outbox = common::outbox(&client, DynamoOutboxConfig::default().with_limits(limits))
            .await
            .unwrap();
        let sent = [
            big(10),
            big(MAX_ITEM_BYTES - 100),
            big(MAX_ITEM_BYTES),
            big(1000 * 1024),
        ];
        let writes = outbox.enqueue_writes(&sent).unwrap();
        // State + 1, 2, 2 and 4 body items.
        assert_eq!(writes.len(), 4 + 1 + 2 + 2 + 4);
        for chunk in sent.chunks(1) {
            outbox.enqueue(Vec::new(), chunk).await.unwrap();
        }
        let got = outbox
            .claim(
                outbox_core::store::ClaimRequest::new(10, std::time::Duration::from_secs(30))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(got.len(), 4);
        for m in &sent {
            let claimed = got.iter().find(|c| c.message.id == m.id()).unwrap();
            assert_eq!(claimed.message.payload, m.payload(), "payload intact");
        }
        let leases: Vec<_> = got.iter().map(|c| c.lease).collect();
        assert_eq!(outbox.complete(&leases).await.unwrap().applied, 4);
        let m = outbox.metrics();
        // Whatever the payload, a claim writes the state item (under 1 KB: one unit) and
        // moves its `due` index entry (two), a complete deletes both (two).
        assert!(
            m.claim_write_units <= 4.0 * 3.0 && m.settle_units <= 4.0 * 2.0,
            "claim {} + complete {} units for 4 messages",
            m.claim_write_units,
            m.settle_units
        );
        nothing_stored(&outbox).await;

        // Under the default limits the payload rule refuses it first, naming the payload.
        let plain = common::outbox(&client, DynamoOutboxConfig::default())
            .await
            .unwrap();
        let err = plain
            .enqueue(Vec::new(), &[big(300 * 1024)])
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("payload"), "{err}");
        nothing_stored(&plain).await;

        let entities = common::entities(&client).await.unwrap();
        let key = EntityKey::new("acct-9").unwrap();
        let record = EntityRecord {
            state: serde_json::Value::String("x".repeat(MAX_ITEM_BYTES)),
            ..EntityRecord::default()
        };
        let err = entities.persist(&key, None, &record).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert!(
            entities.load(&key).await.unwrap().is_none(),
            "nothing written"
        );
    }

    /// Large headers beside a full first part: the first body item carries less payload
    /// so the headers fit, instead of the message being refused for an item over 400 KB
    /// (300 KiB of payload and 150 KB of headers made one).
    async fn large_headers_shrink_the_first_part_instead_of_refusing_the_message(
        client = common::client("outbox-dynamodb large headers")
    ) {
        let limits = MessageLimits::default().with_max_payload_bytes(1024 * 1024);
        let outbox = common::outbox(&client, DynamoOutboxConfig::default().with_limits(limits))
            .await
            .unwrap();
        let mut builder = NewMessage::builder("headers")
            .limits(MessageLimits::default().with_max_payload_bytes(usize::MAX))
            .payload(vec![3u8; 350 * 1024]);
        for i in 0..37 {
            builder = builder.header(format!("h{i:02}"), "v".repeat(4000));
        }
        let m = builder.build().unwrap();
        let writes = outbox.enqueue_writes(std::slice::from_ref(&m)).unwrap();
        assert_eq!(writes.len(), 1 + 2, "state and two body items");
        outbox
            .enqueue(Vec::new(), std::slice::from_ref(&m))
            .await
            .unwrap();
        let got = outbox
            .claim(
                outbox_core::store::ClaimRequest::new(1, std::time::Duration::from_secs(30))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].message.payload, m.payload(), "payload intact");
        assert_eq!(&got[0].message.headers, m.headers(), "headers intact");
    }

    async fn transactions_over_100_actions_or_4_mb_are_refused_before_sending(
        (client, outbox) = common::client_and_outbox(
            "outbox-dynamodb transaction limits",
            DynamoOutboxConfig::default(),
        )
    ) {
        let many: Vec<NewMessage> = (0..=MAX_TRANSACTION_ACTIONS)
            .map(|i| NewMessage::builder(format!("d{i}")).build().unwrap())
            .collect();
        let err = outbox.enqueue(Vec::new(), &many).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains("100"), "{err}");
        nothing_stored(&outbox).await;

        // The caller's writes count: 99 of theirs plus 2 messages.
        let theirs: Vec<TransactWriteItem> = (0..99)
            .map(|i| {
                let put = Put::builder()
                    .table_name(outbox.config().table())
                    .item(
                        "pk",
                        aws_sdk_dynamodb::types::AttributeValue::S(format!("caller#{i}")),
                    )
                    .item("sk", aws_sdk_dynamodb::types::AttributeValue::S("x".into()))
                    .build()
                    .unwrap();
                TransactWriteItem::builder().put(put).build()
            })
            .collect();
        let err = outbox.enqueue(theirs, &many[..2]).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");

        // Keyed messages under per-key order take three actions each: 34 make 102.
        let ordered = common::outbox(
            &client,
            DynamoOutboxConfig::default().with_ordering(KeyOrder::PerKey),
        )
        .await
        .unwrap();
        let keyed: Vec<NewMessage> = (0..34)
            .map(|i| {
                NewMessage::builder("k")
                    .partition_key(format!("key-{i}"))
                    .build()
                    .unwrap()
            })
            .collect();
        let err = ordered.enqueue(Vec::new(), &keyed).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        nothing_stored(&ordered).await;

        // 4 MB: fifteen items of 300 KB each are under the item limit, over the total.
        let limits = MessageLimits::default().with_max_payload_bytes(1024 * 1024);
        let roomy = common::outbox(&client, DynamoOutboxConfig::default().with_limits(limits))
            .await
            .unwrap();
        let heavy: Vec<NewMessage> = (0..15).map(|_| big(300 * 1024)).collect();
        let writes = roomy.enqueue_writes(&heavy).unwrap();
        let err = check_transaction(&writes).unwrap_err();
        assert!(err.to_string().contains("4194304"), "{err}");
        let err = roomy.enqueue(Vec::new(), &heavy).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        nothing_stored(&roomy).await;
    }

    /// A split message (two body items) goes through dead-lettering, requeue and discard
    /// whole: each is one transaction with every body item.
    async fn a_split_message_is_requeued_and_discarded_whole(
        client = common::client("outbox-dynamodb split dead letter")
    ) {
        let limits = MessageLimits::default().with_max_payload_bytes(1024 * 1024);
        let outbox = common::outbox(&client, DynamoOutboxConfig::default().with_limits(limits))
            .await
            .unwrap();
        let m = big(MAX_ITEM_BYTES);
        outbox
            .enqueue(Vec::new(), std::slice::from_ref(&m))
            .await
            .unwrap();
        let lease = std::time::Duration::from_secs(30);
        let dead_letter = || async {
            let got = outbox
                .claim(outbox_core::store::ClaimRequest::new(1, lease).unwrap())
                .await
                .unwrap();
            assert_eq!(got.messages[0].message.payload, m.payload());
            let failure = outbox_core::store::Failure::new(
                got.messages[0].lease,
                "poison",
                outbox_core::store::Disposition::DeadLetter,
            );
            assert!(outbox.fail(&[failure]).await.unwrap().lost.is_empty());
        };
        let selection = outbox_core::DeadLetterSelection::Ids(vec![m.id()]);
        dead_letter().await;
        assert_eq!(outbox.requeue_dead(&selection).await.unwrap(), 1);
        let body = crate::bodies::body_ttls(&outbox, m.id()).await;
        assert_eq!(body.len(), 2, "both parts have a time to live again");
        dead_letter().await;
        assert_eq!(outbox.discard_dead(&selection).await.unwrap(), 1);
        assert!(crate::bodies::body(&outbox, m.id()).await.is_empty());
        nothing_stored(&outbox).await;
    }
}
