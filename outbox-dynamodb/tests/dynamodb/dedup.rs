//! The dedup store's conditional put and expiry.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use outbox_core::{ConsumerName, Dedup, DedupStore, MessageId};
use outbox_testkit::wait_until;

use crate::common;

dynamo_test! {
    flavor = multi_thread(4);

    /// 64 concurrent records of one id: the conditional put lets exactly one through.
    async fn conditional_put_race_gives_exactly_one_new(
        client = common::client("outbox-dynamodb dedup race")
    ) {
        let store = Arc::new(
            common::dedup(&client, Duration::from_secs(600))
                .await
                .unwrap(),
        );
        let consumer = ConsumerName::new("race").unwrap();
        for _round in 0..3 {
            let id = MessageId::new();
            let racers: Vec<_> = (0..64)
                .map(|_| {
                    let (store, consumer) = (Arc::clone(&store), consumer.clone());
                    tokio::spawn(async move { store.record(&consumer, id).await.unwrap() })
                })
                .collect();
            let mut new = 0;
            for r in racers {
                if r.await.unwrap() == Dedup::New {
                    new += 1;
                }
            }
            assert_eq!(new, 1, "exactly one of 64 concurrent records is New");
            assert!(store.contains(&consumer, id).await.unwrap());
        }
    }
}

dynamo_test! {
    /// An expired record that TTL has not deleted yet (DynamoDB deletes within days; DynamoDB
    /// Local never) is absent to `contains` and `record`.
    async fn expired_items_still_stored_count_as_absent(
        client = common::client("outbox-dynamodb dedup expiry")
    ) {
        let store = common::dedup(&client, Duration::from_millis(300))
            .await
            .unwrap();
        let consumer = ConsumerName::new("ttl").unwrap();
        let id = MessageId::new();
        assert_eq!(store.record(&consumer, id).await.unwrap(), Dedup::New);
        assert_eq!(store.record(&consumer, id).await.unwrap(), Dedup::Duplicate);
        wait_until("the record to expire", || async {
            !store.contains(&consumer, id).await.unwrap()
        })
        .await;
        // Still there, TTL attribute and all: only the expiry makes it absent.
        let items = client
            .scan()
            .table_name(store.config().table())
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        assert_eq!(items.count(), 1, "the expired item is still stored");
        let item = &items.items()[0];
        assert!(matches!(item.get("ttl"), Some(AttributeValue::N(_))));
        assert_eq!(
            store.record(&consumer, id).await.unwrap(),
            Dedup::New,
            "re-recorded"
        );
        assert!(store.contains(&consumer, id).await.unwrap());
    }

    /// A layout-1 dedup table (shard partition key `pk`, sort key `sk`) is refused with a
    /// schema error naming its keys, not written to with the new keys.
    async fn a_layout_one_table_is_refused_by_install(
        client = common::client("outbox-dynamodb dedup layout")
    ) {
        use aws_sdk_dynamodb::types::{
            AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
        };
        use outbox_core::ErrorKind;
        use outbox_dynamodb::{DynamoDedupConfig, DynamoDedupStore};

        let table = common::table_name("dedup_v1");
        let mut create = client
            .create_table()
            .table_name(&table)
            .billing_mode(BillingMode::PayPerRequest);
        for (name, kind) in [("pk", KeyType::Hash), ("sk", KeyType::Range)] {
            create = create
                .key_schema(
                    KeySchemaElement::builder()
                        .attribute_name(name)
                        .key_type(kind)
                        .build()
                        .unwrap(),
                )
                .attribute_definitions(
                    AttributeDefinition::builder()
                        .attribute_name(name)
                        .attribute_type(ScalarAttributeType::S)
                        .build()
                        .unwrap(),
                );
        }
        create.send().await.unwrap();
        let store = DynamoDedupStore::new(
            client.clone(),
            DynamoDedupConfig::default().with_table(&table),
        )
        .unwrap();
        let err = store.install().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Schema, "{}", err.report());
        assert!(err.to_string().contains("sk (RANGE)"), "{err}");
    }
}
