//! Relays over DynamoDB: a relay killed mid-batch, and per-key order with four relays
//! racing over eight shards.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    store::ClaimRequest, KeyOrder, MessageId, NewMessage, OutboxAdmin, OutboxStore, Relay,
    RelayConfig, RetryPolicy,
};
use outbox_dynamodb::{DynamoOutbox, DynamoOutboxConfig};
use outbox_testkit::{wait::DEADLINE, wait_until, RecordingPublisher};

use crate::common;

fn relay_config(name: &str, batch: usize) -> RelayConfig {
    RelayConfig::default()
        .with_name(name)
        .with_batch_size(batch)
        .with_lease(Duration::from_secs(30))
        .with_publish_timeout(Duration::from_secs(10))
        .with_poll_interval(Duration::from_millis(10))
        .with_max_poll_interval(Duration::from_millis(200))
        .with_retry(
            RetryPolicy::new(5)
                .with_initial_delay(Duration::from_millis(10))
                .with_max_delay(Duration::from_millis(50)),
        )
        .with_shutdown_grace(Duration::from_secs(5))
}

fn relay(outbox: &DynamoOutbox, publisher: &RecordingPublisher, config: RelayConfig) -> Relay {
    Relay::new(
        Arc::new(outbox.clone()),
        Arc::new(publisher.clone()),
        config,
    )
    .unwrap()
}

dynamo_test! {
    /// A relay dies after completing part of its claimed batch (its process is gone: no
    /// release, no complete). Nothing is lost: the rest come back when the lease lapses and
    /// another relay publishes them, once each; the completed ones are not published again.
    async fn relay_killed_mid_batch_loses_nothing(
        (_, outbox) = common::client_and_outbox(
            "outbox-dynamodb killed relay",
            DynamoOutboxConfig::default(),
        )
    ) {
        let sent: Vec<NewMessage> = (0..40)
            .map(|i| NewMessage::builder(format!("d{i}")).build().unwrap())
            .collect();
        common::enqueue_all(&outbox, &sent).await.unwrap();
        // The doomed relay: claims 20 with a short lease, completes 8, dies.
        let doomed = outbox
            .claim(ClaimRequest::new(20, Duration::from_millis(800)).unwrap())
            .await
            .unwrap();
        assert_eq!(doomed.len(), 20);
        let leases: Vec<_> = doomed[..8].iter().map(|c| c.lease).collect();
        assert_eq!(outbox.complete(&leases).await.unwrap().applied, 8);
        let completed: Vec<MessageId> = doomed[..8].iter().map(|c| c.message.id).collect();
        drop(doomed);

        let publisher = RecordingPublisher::new();
        let handle = relay(&outbox, &publisher, relay_config("survivor", 10)).spawn();
        publisher.wait_for_unique(32, DEADLINE).await.unwrap();
        wait_until("the outbox to drain", || async {
            let s = outbox.stats().await.unwrap();
            (s.pending, s.in_flight) == (0, 0)
        })
        .await;
        handle.shutdown().await.unwrap();
        assert_eq!(publisher.duplicates(), 0);
        assert_eq!(publisher.published_count(), 32);
        for id in completed {
            assert_eq!(publisher.times_seen(id), 0, "completed before the crash");
        }
        let reclaimed = publisher
            .published()
            .iter()
            .filter(|m| m.attempts == 2)
            .count();
        assert_eq!(
            reclaimed, 12,
            "the dead relay's unfinished messages, claimed again"
        );
    }
}

dynamo_test! {
    flavor = multi_thread(4);

    /// Four relays race over keyed messages spread across eight shards: every key
    /// publishes in enqueue order, and every message once.
    async fn per_key_order_holds_with_four_relays(
        client = common::client("outbox-dynamodb per-key order")
    ) {
        let config = DynamoOutboxConfig::default().with_ordering(KeyOrder::PerKey);
        let outbox = DynamoOutbox::new(
            client.clone(),
            config
                .with_table(common::table_name("order"))
                .with_shards(8),
        )
        .unwrap();
        outbox.install().await.unwrap();
        let keys: Vec<String> = (0..10).map(|k| format!("account-{k}")).collect();
        let mut expected: HashMap<String, Vec<MessageId>> = HashMap::new();
        let mut batch = Vec::new();
        for n in 0..15 {
            for key in &keys {
                let m = NewMessage::builder("ledger")
                    .partition_key(key.clone())
                    .payload(format!("{n}").into_bytes())
                    .build()
                    .unwrap();
                expected.entry(key.clone()).or_default().push(m.id());
                batch.push(m);
            }
        }
        // Unkeyed messages in between: they do not wait for anyone.
        batch.extend((0..20).map(|_| NewMessage::builder("free").build().unwrap()));
        common::enqueue_all(&outbox, &batch).await.unwrap();
        let publisher = RecordingPublisher::new();
        let relays: Vec<_> = (0..4)
            .map(|i| {
                relay(
                    &outbox,
                    &publisher,
                    relay_config(&format!("relay-{i}"), 5)
                        .with_publish_batch_size(5)
                        .with_publish_concurrency(2),
                )
                .spawn()
            })
            .collect();
        publisher.wait_for_unique(170, DEADLINE * 2).await.unwrap();
        for r in relays {
            r.shutdown().await.unwrap();
        }
        assert_eq!(publisher.duplicates(), 0);
        let mut by_key = publisher.first_publish_order_by_key();
        by_key.retain(|k, _| k.starts_with("account-"));
        assert_eq!(by_key, expected);
        let s = outbox.stats().await.unwrap();
        assert_eq!((s.pending, s.in_flight, s.dead), (0, 0, 0));
    }
}
