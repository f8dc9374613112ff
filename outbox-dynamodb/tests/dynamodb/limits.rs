//! The 400 KB item, 100-action and 4 MB transaction limits: typed errors before
//! anything is sent.

use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
use outbox_core::consumer::{EntityRecord, EntityStore};
use outbox_core::{EntityKey, ErrorKind, KeyOrder, MessageLimits, NewMessage, OutboxAdmin};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_over_400_kb_is_refused_before_sending() {
    let Some(client) = common::client("outbox-dynamodb item limit").await else {
        return;
    };
    // Limits that let the payload through, so the item limit is what refuses it.
    let limits = MessageLimits::default().with_max_payload_bytes(1024 * 1024);
    let outbox = common::outbox(&client, DynamoOutboxConfig::default().with_limits(limits))
        .await
        .unwrap();
    let err = outbox
        .enqueue(Vec::new(), &[big(10), big(MAX_ITEM_BYTES - 100)])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(
        err.to_string().contains("400 KB") || err.to_string().contains("item limit"),
        "{err}"
    );
    assert!(outbox.enqueue_writes(&[big(MAX_ITEM_BYTES)]).is_err());
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_over_100_actions_or_4_mb_are_refused_before_sending() {
    let Some(client) = common::client("outbox-dynamodb transaction limits").await else {
        return;
    };
    let outbox = common::outbox(&client, DynamoOutboxConfig::default())
        .await
        .unwrap();
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

    // Keyed messages under per-key order take two actions each: 51 make 102.
    let ordered = common::outbox(
        &client,
        DynamoOutboxConfig::default().with_ordering(KeyOrder::PerKey),
    )
    .await
    .unwrap();
    let keyed: Vec<NewMessage> = (0..51)
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
