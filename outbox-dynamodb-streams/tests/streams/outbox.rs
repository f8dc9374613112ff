//! Enqueue: with the caller's writes in one transaction, refusals that write nothing.

use std::time::Duration;

use outbox_core::{ErrorKind, NewMessage};
use outbox_dynamodb_streams::aws_sdk_dynamodb::types::AttributeValue;
use outbox_dynamodb_streams::aws_sdk_dynamodb::types::{Put, TransactWriteItem};

use crate::common;

async fn count_items(outbox: &outbox_dynamodb_streams::StreamOutbox) -> i32 {
    outbox
        .client()
        .scan()
        .table_name(outbox.config().table())
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .count()
}

streams_test! {
    flavor = current_thread;

    async fn refused_messages_write_nothing(
        (_, outbox) = common::url_and_outbox("stream outbox: refusals", "refuse")
    ) {
        let good = NewMessage::builder("d")
            .payload(b"x".to_vec())
            .build()
            .unwrap();
        let delayed = NewMessage::builder("d")
            .delay(Duration::from_secs(5))
            .build()
            .unwrap();
        let e = outbox
            .enqueue(Vec::new(), &[good.clone(), delayed.clone()])
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.message().contains("DynamoOutbox"), "{}", e.message());
        assert_eq!(e.ids(), [delayed.id()]);
        let e = outbox
            .enqueue(Vec::new(), &[good.clone(), good.clone()])
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict);
        assert_eq!(count_items(&outbox).await, 0);
        // Stored once; a second enqueue of the id is refused naming it, with the caller's
        // write not applied either.
        outbox
            .enqueue(Vec::new(), std::slice::from_ref(&good))
            .await
            .unwrap();
        // Alone, a message is one conditional PutItem: refused the same way.
        let e = outbox
            .enqueue(Vec::new(), std::slice::from_ref(&good))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict);
        assert_eq!(e.ids(), [good.id()]);
        assert_eq!(outbox.metrics().enqueued, 1);
        let order = TransactWriteItem::builder()
            .put(
                Put::builder()
                    .table_name(outbox.config().table())
                    .item("pk", AttributeValue::S("order#1".into()))
                    .item("sk", AttributeValue::S("o".into()))
                    .build()
                    .unwrap(),
            )
            .build();
        let e = outbox
            .enqueue(vec![order], std::slice::from_ref(&good))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict);
        assert_eq!(e.ids(), [good.id()]);
        assert_eq!(count_items(&outbox).await, 1);
        outbox.drop_tables().await.unwrap();
    }

    async fn install_checks_an_existing_table_for_a_stream_of_new_images(
        (_, outbox) = common::url_and_outbox("stream outbox: install", "inst")
    ) {
        // Installing again is a no-op.
        outbox.install().await.unwrap();
        assert!(outbox.stream_arn().await.unwrap().contains("stream"));
        // A table of that name without a stream is refused, naming the fix.
        let client = outbox.client();
        let plain = format!("{}_plain", outbox.config().table());
        let key = |name: &str, kind| {
            outbox_dynamodb_streams::aws_sdk_dynamodb::types::KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
                .unwrap()
        };
        let attr = |name: &str| {
            outbox_dynamodb_streams::aws_sdk_dynamodb::types::AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(
                    outbox_dynamodb_streams::aws_sdk_dynamodb::types::ScalarAttributeType::S,
                )
                .build()
                .unwrap()
        };
        use outbox_dynamodb_streams::aws_sdk_dynamodb::types::{BillingMode, KeyType};
        client
            .create_table()
            .table_name(&plain)
            .billing_mode(BillingMode::PayPerRequest)
            .key_schema(key("pk", KeyType::Hash))
            .key_schema(key("sk", KeyType::Range))
            .attribute_definitions(attr("pk"))
            .attribute_definitions(attr("sk"))
            .send()
            .await
            .unwrap();
        let other = outbox_dynamodb_streams::StreamOutbox::new(
            client.clone(),
            outbox_dynamodb_streams::StreamOutboxConfig::default().with_table(&plain),
        )
        .unwrap();
        let e = other.install().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Schema);
        assert!(e.message().contains("no stream"), "{}", e.message());
        assert_eq!(
            other.stream_arn().await.unwrap_err().kind(),
            ErrorKind::Schema
        );
        other.drop_tables().await.unwrap();
        outbox.drop_tables().await.unwrap();
    }
}
