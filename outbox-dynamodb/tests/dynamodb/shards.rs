//! Shard leases: a relay joining takes its share, a relay dying has its shards taken
//! over once its leases lapse, and nothing is lost or published twice.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{store::ClaimRequest, NewMessage, OutboxStore, Relay, RelayConfig, RetryPolicy};
use outbox_dynamodb::{DynamoOutbox, DynamoOutboxConfig};
use outbox_testkit::{wait::DEADLINE, wait_until, RecordingPublisher};

use crate::common;

const SHARDS: u16 = 8;
const SHARD_LEASE: Duration = Duration::from_secs(2);

fn relay_config(name: &str) -> RelayConfig {
    RelayConfig::default()
        .with_name(name)
        .with_batch_size(10)
        .with_lease(Duration::from_secs(30))
        .with_publish_timeout(Duration::from_secs(10))
        .with_poll_interval(Duration::from_millis(10))
        .with_max_poll_interval(Duration::from_millis(100))
        .with_retry(
            RetryPolicy::new(5)
                .with_initial_delay(Duration::from_millis(10))
                .with_max_delay(Duration::from_millis(50)),
        )
        .with_shutdown_grace(Duration::from_secs(5))
}

fn relay(outbox: &DynamoOutbox, publisher: &RecordingPublisher, name: &str) -> Relay {
    Relay::new(
        Arc::new(outbox.clone()),
        Arc::new(publisher.clone()),
        relay_config(name),
    )
    .unwrap()
}

async fn owned(outbox: &DynamoOutbox) -> BTreeSet<u16> {
    outbox.owned_shards().await.into_iter().collect()
}

dynamo_test! {
    flavor = multi_thread(4);

    /// Relay A starts alone and holds every shard; relay B joins and takes half (stolen
    /// from A, which lets go at its next renewal); the two hold disjoint halves. Then B
    /// dies holding claimed messages and its leases: A takes B's shards once they lapse,
    /// publishes everything, B's unfinished messages after their leases lapse, each once.
    async fn a_joining_relay_takes_its_share_and_a_dead_ones_shards_are_taken_over(
        client = common::client("outbox-dynamodb shard leases")
    ) {
        let config = DynamoOutboxConfig::default()
            .with_table(common::table_name("leases"))
            .with_shards(SHARDS)
            .with_shard_leases(Some(SHARD_LEASE));
        let a = DynamoOutbox::new(client.clone(), config.clone()).unwrap();
        a.install().await.unwrap();
        // Another worker on the same table: a store of its own, not a clone.
        let b = DynamoOutbox::new(client.clone(), config).unwrap();
        let publisher = RecordingPublisher::new();
        let all: BTreeSet<u16> = (0..SHARDS).collect();

        let relay_a = relay(&a, &publisher, "a").spawn();
        wait_until("A to hold every shard", || async { owned(&a).await == all }).await;

        let relay_b = relay(&b, &publisher, "b").spawn();
        wait_until("A and B to hold disjoint halves", || async {
            let (mine, theirs) = (owned(&a).await, owned(&b).await);
            mine.len() == 4 && theirs.len() == 4 && mine.is_disjoint(&theirs)
        })
        .await;

        let first: Vec<NewMessage> = (0..100)
            .map(|i| NewMessage::builder(format!("first-{i}")).build().unwrap())
            .collect();
        common::enqueue_all(&a, &first).await.unwrap();
        publisher.wait_for_unique(100, DEADLINE).await.unwrap();

        // B dies: its relay stops, and a last claim of its own is never settled. Its
        // shard leases are neither renewed nor released.
        relay_b.shutdown().await.unwrap();
        let b_shards = owned(&b).await;
        let second: Vec<NewMessage> = (0..100)
            .map(|i| NewMessage::builder(format!("second-{i}")).build().unwrap())
            .collect();
        common::enqueue_all(&a, &second).await.unwrap();
        let stranded = b
            .claim(ClaimRequest::new(5, Duration::from_secs(3)).unwrap())
            .await
            .unwrap();
        assert!(!stranded.is_empty(), "B's shards hold some of the messages");
        drop(stranded);
        drop(b);

        wait_until("A to take over B's shards", || async {
            owned(&a).await == all
        })
        .await;
        assert_eq!(b_shards.len(), 4);
        publisher.wait_for_unique(200, DEADLINE).await.unwrap();
        relay_a.shutdown().await.unwrap();
        assert_eq!(publisher.duplicates(), 0, "nothing published twice");
        assert_eq!(publisher.unique_count(), 200, "nothing lost");
        a.release_shards().await.unwrap();
        assert!(owned(&a).await.is_empty());
    }
}
