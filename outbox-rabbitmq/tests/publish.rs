//! Publishing against a real RabbitMQ (`OUTBOX_AMQP_URL`): outcomes, what arrives,
//! routing failures, concurrency and large batches. Each test declares its own
//! uniquely named exchange and queues and deletes them at the end.

#[macro_use]
mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use common::{all_published, headers, message, message_id, messages, text};
use outbox_core::{ErrorKind, PublishOutcome, Publisher};
use outbox_rabbitmq::{RabbitPublisher, Route, Routing};

rabbit_test! {
    async fn every_field_and_payload_byte_arrives_in_batch_order(
        (_, mut broker) = common::broker()
    ) {
        let exchange = broker.topic_exchange().await;
        let queue = broker.bound_queue(&exchange, "routed.#", false).await;
        let publisher =
            RabbitPublisher::new(broker.config().with_routing(Routing::exchange(&exchange)))
                .unwrap();

        let mut batch = Vec::new();
        let mut full = message("routed.full", br#"{"order":42}"#.to_vec());
        full.content_type = Some("application/json".into());
        full.partition_key = Some("order-42".into());
        full.headers.insert(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        );
        full.headers.insert("x-tenant", "acme");
        full.headers.insert("x-text", "tab\there, ünïcode ✓");
        batch.push(full);
        batch.push(message("routed.empty", Vec::new()));
        batch.push(message("routed.binary", (0..=255u8).collect::<Vec<u8>>()));
        let mut keyed = message("routed.keyed", b"k".to_vec());
        keyed.partition_key = Some("key only".into());
        batch.push(keyed);

        let outcomes = publisher.publish(&batch).await.unwrap();
        assert_eq!(outcomes, vec![PublishOutcome::Published; batch.len()]);

        let got = broker.take(&queue, batch.len()).await;
        for (sent, got) in batch.iter().zip(&got) {
            assert_eq!(message_id(got), sent.id, "batch order kept");
            assert_eq!(got.routing_key.as_str(), sent.destination);
            assert_eq!(got.exchange.as_str(), exchange);
            assert_eq!(got.data, sent.payload, "payload of {}", sent.destination);
            assert_eq!(*got.properties.delivery_mode(), Some(2), "persistent");
            assert_eq!(
                text(got.properties.content_type()),
                sent.content_type.as_deref()
            );
            let seconds = sent
                .created_at
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs();
            assert_eq!(*got.properties.timestamp(), Some(seconds));
            let (headers, key) = headers(got);
            assert_eq!(headers, sent.headers);
            assert_eq!(key, sent.partition_key);
        }
        broker.teardown().await;
    }

    async fn the_default_mapping_delivers_to_the_queue_named_by_the_destination(
        (_, mut broker) = common::broker()
    ) {
        let queue = common::unique("direct");
        broker.queue_named(&queue, true).await;
        let publisher = RabbitPublisher::connect(broker.config()).await.unwrap();
        assert!(publisher.is_connected());

        let batch = messages(&queue, 3);
        assert!(all_published(&publisher.publish(&batch).await.unwrap()));
        let got = broker.take(&queue, 3).await;
        let ids: Vec<_> = got.iter().map(message_id).collect();
        assert_eq!(ids, batch.iter().map(|m| m.id).collect::<Vec<_>>());
        assert!(got.iter().all(|d| d.exchange.as_str().is_empty()));
        broker.teardown().await;
    }

    /// Persistent messages to a durable queue are acked after the disk write, so acks of
    /// routed messages come after the return and ack of a later unroutable one: the test
    /// checks each return still lands on its own message.
    async fn unroutable_messages_are_permanent_and_spare_the_rest_of_the_batch(
        (_, mut broker) = common::broker()
    ) {
        let exchange = broker.topic_exchange().await;
        let queue = broker.bound_queue(&exchange, "routed.#", true).await;
        let publisher = RabbitPublisher::new(
            broker
                .config()
                .with_routing(Routing::exchange(&exchange))
                .with_max_in_flight(7),
        )
        .unwrap();

        let mut routed_ids = Vec::new();
        for round in 0..3 {
            let batch: Vec<_> = (0..40)
                .map(|i| {
                    let destination = if (i + round) % 3 == 0 {
                        "nowhere.x"
                    } else {
                        "routed.x"
                    };
                    message(destination, format!("{round}/{i}").into_bytes())
                })
                .collect();
            let outcomes = publisher.publish(&batch).await.unwrap();
            assert_eq!(outcomes.len(), batch.len());
            for (m, outcome) in batch.iter().zip(&outcomes) {
                if m.destination == "nowhere.x" {
                    let PublishOutcome::Permanent(reason) = outcome else {
                        panic!("unroutable {} got {outcome:?}", m.id);
                    };
                    assert!(reason.contains("312 NO_ROUTE"), "{reason}");
                    assert!(reason.contains("nowhere.x"), "{reason}");
                } else {
                    assert_eq!(*outcome, PublishOutcome::Published, "routed {}", m.id);
                    routed_ids.push(m.id);
                }
            }
        }
        let got = broker.take(&queue, routed_ids.len()).await;
        assert_eq!(got.iter().map(message_id).collect::<Vec<_>>(), routed_ids);
        broker.teardown().await;
    }

    async fn a_missing_exchange_or_an_unsendable_name_is_permanent_and_spares_the_rest(
        (_, mut broker) = common::broker()
    ) {
        let exchange = broker.topic_exchange().await;
        let queue = broker.bound_queue(&exchange, "routed.#", false).await;
        let publisher =
            RabbitPublisher::new(broker.config().with_routing(Routing::split('/'))).unwrap();

        let missing = common::unique("missing");
        let batch = vec![
            message(&format!("{exchange}/routed.a"), b"1".to_vec()),
            message(&format!("{missing}/routed.a"), b"2".to_vec()),
            message(&format!("{exchange}/{}", "k".repeat(256)), b"3".to_vec()),
            message(&format!("{exchange}/routed.b"), b"4".to_vec()),
        ];
        // Twice: the second time the existing exchange is known, the missing one is not.
        for _ in 0..2 {
            let outcomes = publisher.publish(&batch).await.unwrap();
            assert_eq!(outcomes[0], PublishOutcome::Published);
            assert!(
                matches!(&outcomes[1], PublishOutcome::Permanent(r) if r.contains("does not exist")),
                "{:?}",
                outcomes[1]
            );
            assert!(
                matches!(&outcomes[2], PublishOutcome::Permanent(r) if r.contains("routing key of 256 bytes")),
                "{:?}",
                outcomes[2]
            );
            assert_eq!(outcomes[3], PublishOutcome::Published);
        }
        let got = broker.take(&queue, 4).await;
        let payloads: Vec<_> = got.iter().map(|d| d.data.clone()).collect();
        assert_eq!(
            payloads,
            vec![b"1".to_vec(), b"4".to_vec(), b"1".to_vec(), b"4".to_vec()]
        );

        let refusing = RabbitPublisher::new(broker.config().with_routing(Routing::custom(|m| {
            if m.destination.starts_with("routed.") {
                Route::new(exchange_of(m), m.destination.clone())
            } else {
                Err(format!("no route for {}", m.destination))
            }
        })))
        .unwrap();
        fn exchange_of(m: &outbox_core::Message) -> String {
            m.headers.get("x-exchange").unwrap_or_default().to_owned()
        }
        let mut routed = message("routed.c", b"5".to_vec());
        routed.headers.insert("x-exchange", exchange.clone());
        let outcomes = refusing
            .publish(&[message("elsewhere", Vec::new()), routed])
            .await
            .unwrap();
        assert_eq!(
            outcomes,
            vec![
                PublishOutcome::Permanent("no route for elsewhere".into()),
                PublishOutcome::Published
            ]
        );
        assert_eq!(broker.take(&queue, 1).await[0].data, b"5");
        broker.teardown().await;
    }

    async fn concurrent_publish_calls_from_several_tasks_all_land(
        (_, mut broker) = common::broker()
    ) {
        let exchange = broker.topic_exchange().await;
        let queue = broker.bound_queue(&exchange, "routed.#", false).await;
        let publisher: Arc<dyn Publisher> = Arc::new(
            RabbitPublisher::new(broker.config().with_routing(Routing::exchange(&exchange)))
                .unwrap(),
        );

        let mut tasks = Vec::new();
        let mut sent = HashSet::new();
        for task in 0..8 {
            let batch = messages(&format!("routed.t{task}"), 50);
            sent.extend(batch.iter().map(|m| m.id));
            let publisher = publisher.clone();
            tasks.push(tokio::spawn(async move {
                let mut outcomes = Vec::new();
                for chunk in batch.chunks(10) {
                    outcomes.extend(publisher.publish(chunk).await.unwrap());
                }
                outcomes
            }));
        }
        for task in tasks {
            assert!(all_published(&task.await.unwrap()));
        }
        let got = broker.take(&queue, sent.len()).await;
        let ids: HashSet<_> = got.iter().map(message_id).collect();
        assert_eq!(ids, sent);
        broker.teardown().await;
    }

    async fn a_batch_of_a_thousand_messages((_, mut broker) = common::broker()) {
        let exchange = broker.topic_exchange().await;
        let queue = broker.bound_queue(&exchange, "routed.#", true).await;
        let publisher = RabbitPublisher::new(
            broker
                .config()
                .with_routing(Routing::exchange(&exchange))
                .with_max_in_flight(100),
        )
        .unwrap();

        let batch = messages("routed.bulk", 1_000);
        let outcomes = publisher.publish(&batch).await.unwrap();
        assert_eq!(outcomes.len(), 1_000);
        assert!(all_published(&outcomes));
        let got = broker.take(&queue, 1_000).await;
        assert!(got.iter().map(message_id).eq(batch.iter().map(|m| m.id)));
        broker.teardown().await;
    }

    async fn refused_credentials_fail_connect_and_make_publishes_retryable(
        (url, broker) = common::broker()
    ) {
        let uri: outbox_rabbitmq::lapin::uri::AMQPUri = url.parse().unwrap();
        let wrong = url.replacen(
            &format!(":{}@", uri.authority.userinfo.password),
            ":not-the-password@",
            1,
        );
        assert_ne!(wrong, url, "the test URL must carry a password");
        let config = broker.config();
        let config = outbox_rabbitmq::RabbitPublisherConfig::new(wrong)
            .with_connection_name(config.connection_name());

        let err = RabbitPublisher::connect(config.clone()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{}", err.report());
        assert!(!err.report().to_string().contains("not-the-password"));

        // At run time the message is not at fault: retry it once the credentials work.
        let publisher = RabbitPublisher::new(config).unwrap();
        let outcomes = publisher.publish(&messages("anything", 2)).await.unwrap();
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, PublishOutcome::Retryable(_))),
            "{outcomes:?}"
        );
        broker.teardown().await;
    }
}
