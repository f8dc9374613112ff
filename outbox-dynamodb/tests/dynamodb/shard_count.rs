//! The shard count kept in the table: stores configured with more shards than the
//! table refuse to write, a grown count reaches running relays without a restart (per-key
//! order kept across the growth), and shard leases are kept by their own task while no
//! claim runs.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use outbox_core::{
    store::ClaimRequest, ErrorKind, KeyOrder, MessageId, NewMessage, OutboxAdmin, OutboxStore,
};
use outbox_dynamodb::{DynamoOutbox, DynamoOutboxConfig};
use outbox_testkit::poll_for;
use outbox_testkit::wait::DEADLINE;

use crate::common;

const LEASE: Duration = Duration::from_secs(30);

fn store(
    client: &aws_sdk_dynamodb::Client,
    config: &DynamoOutboxConfig,
    shards: u16,
) -> DynamoOutbox {
    DynamoOutbox::new(client.clone(), config.clone().with_shards(shards)).unwrap()
}

fn keyed(key: &str) -> NewMessage {
    NewMessage::builder("grown")
        .partition_key(key)
        .build()
        .unwrap()
}

/// Claim (and complete) until `order` holds `want` messages, in claim order; fails
/// after ten times the suite's deadline.
async fn drain(outbox: &DynamoOutbox, order: &mut Vec<MessageId>, want: usize) {
    let deadline = Instant::now() + DEADLINE * 10;
    while order.len() < want {
        assert!(
            Instant::now() < deadline,
            "{} of {want} messages claimed in time",
            order.len()
        );
        let claimed = outbox
            .claim(ClaimRequest::new(10, LEASE).unwrap())
            .await
            .unwrap();
        if claimed.is_empty() {
            // Nothing due in the shards held yet: poll again shortly.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let leases: Vec<_> = claimed.iter().map(|c| c.lease).collect();
        order.extend(claimed.iter().map(|c| c.message.id));
        let settled = outbox.complete(&leases).await.unwrap();
        assert_eq!(settled.applied, leases.len());
    }
}

dynamo_test! {
    /// A table installed with 8 shards: a store configured with 16 is refused by install,
    /// claim, enqueue and enqueue_writes, with an error that names both counts; a store
    /// configured with 4 writes to 4 of the 8, which an 8-shard relay reads.
    async fn a_store_with_more_shards_than_the_table_is_refused(
        client = common::client("outbox-dynamodb shard count")
    ) {
        let config = DynamoOutboxConfig::default()
            .with_table(common::table_name("count"))
            .with_shard_leases(None);
        let relay = store(&client, &config, 8);
        relay.install().await.unwrap();
        assert_eq!(relay.check_shards().await.unwrap(), 8);

        let wide = store(&client, &config, 16);
        let unread = wide
            .enqueue_writes(&[NewMessage::builder("x").build().unwrap()])
            .unwrap_err();
        assert_eq!(unread.kind(), ErrorKind::Config);
        assert!(unread.message().contains("check_shards()"), "{unread}");
        let refusals = [
            wide.install().await.unwrap_err(),
            wide.claim(ClaimRequest::new(1, LEASE).unwrap())
                .await
                .unwrap_err(),
            wide.enqueue(Vec::new(), &[NewMessage::builder("x").build().unwrap()])
                .await
                .unwrap_err(),
        ];
        for e in refusals {
            assert_eq!(e.kind(), ErrorKind::Config, "{}", e.report());
            assert!(
                e.message().contains("configured with 16 shards but table")
                    && e.message().contains("has 8"),
                "{e}"
            );
        }
        assert_eq!(
            relay.stats().await.unwrap().pending,
            0,
            "nothing was written"
        );

        let narrow = store(&client, &config, 4);
        assert_eq!(narrow.check_shards().await.unwrap(), 8);
        let messages: Vec<NewMessage> = (0..20)
            .map(|_| NewMessage::builder("narrow").build().unwrap())
            .collect();
        common::enqueue_all(&narrow, &messages).await.unwrap();
        let mut order = Vec::new();
        drain(&relay, &mut order, 20).await;
        let got: BTreeSet<MessageId> = order.into_iter().collect();
        let want: BTreeSet<MessageId> = messages.iter().map(NewMessage::id).collect();
        assert_eq!(got, want);
    }

    /// Growth while a relay runs: the relay (shard leases of one second) holds the table's
    /// 2 shards; the count grows to 8 and a writer on 8 enqueues; the relay takes the new
    /// shards at its next lease round and delivers everything, each key in enqueue order
    /// across the growth (keys' order markers stay in the table's 2 marker partitions).
    /// The count never shrinks, and stays within 1..=256.
    async fn a_grown_count_reaches_a_running_relay_and_keeps_key_order(
        client = common::client("outbox-dynamodb grow shards")
    ) {
        let config = DynamoOutboxConfig::default()
            .with_table(common::table_name("grow"))
            .with_ordering(KeyOrder::PerKey)
            .with_shard_leases(Some(Duration::from_secs(1)));
        let relay = store(&client, &config, 2);
        relay.install().await.unwrap();
        let before: Vec<NewMessage> = (0..10).map(|i| keyed(&format!("k{}", i % 3))).collect();
        common::enqueue_all(&relay, &before).await.unwrap();
        // The relay starts: it holds both shards and delivers the first message.
        let mut order = Vec::new();
        drain(&relay, &mut order, 1).await;
        assert_eq!(relay.owned_shards().await, vec![0, 1]);

        let admin = store(&client, &config, 2);
        assert_eq!(admin.grow_shards(8).await.unwrap(), 8);
        let writer = store(&client, &config, 8);
        let after: Vec<NewMessage> = (0..30).map(|i| keyed(&format!("k{}", i % 3))).collect();
        common::enqueue_all(&writer, &after).await.unwrap();

        let owned = poll_for("the relay to take the new shards", || {
            let relay = relay.clone();
            async move {
                let owned = relay.owned_shards().await;
                (owned.len() == 8).then_some(owned)
            }
        })
        .await;
        assert_eq!(owned, (0..8).collect::<Vec<u16>>());
        drain(&relay, &mut order, 40).await;
        let sent: Vec<&NewMessage> = before.iter().chain(&after).collect();
        assert_eq!(order.len(), 40);
        for key in ["k0", "k1", "k2"] {
            let want: Vec<MessageId> = sent
                .iter()
                .filter(|m| m.partition_key() == Some(key))
                .map(|m| m.id())
                .collect();
            let got: Vec<MessageId> = order
                .iter()
                .copied()
                .filter(|id| want.contains(id))
                .collect();
            assert_eq!(got, want, "key {key} delivered in enqueue order");
        }

        for (to, why) in [(4, "never shrinks"), (0, "outside"), (257, "outside")] {
            let e = admin.grow_shards(to).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(e.message().contains(why), "{to}: {e}");
        }
        assert_eq!(admin.check_shards().await.unwrap(), 8);
        assert_eq!(
            admin.grow_shards(256).await.unwrap(),
            256,
            "the most there is"
        );
    }

    /// Without shard leases a store reads the table's count again when its copy is ten
    /// seconds old, not at every claim: a relay learns of a growth within that, and claims
    /// in between cost no read of the count.
    async fn without_leases_the_count_is_read_again_every_ten_seconds(
        client = common::client("outbox-dynamodb count refresh")
    ) {
        let config = DynamoOutboxConfig::default()
            .with_table(common::table_name("refresh"))
            .with_shard_leases(None);
        let relay = store(&client, &config, 1);
        relay.install().await.unwrap();
        let mut order = Vec::new();
        let first = NewMessage::builder("refresh").build().unwrap();
        common::enqueue_all(&relay, std::slice::from_ref(&first))
            .await
            .unwrap();
        drain(&relay, &mut order, 1).await;
        let upkeep = relay.metrics().upkeep_units;
        for _ in 0..3 {
            let none = relay
                .claim(ClaimRequest::new(1, LEASE).unwrap())
                .await
                .unwrap();
            assert!(none.is_empty());
        }
        assert_eq!(
            relay.metrics().upkeep_units,
            upkeep,
            "claims within ten seconds read no count"
        );

        let admin = DynamoOutbox::new(client.clone(), config.clone()).unwrap();
        assert_eq!(admin.grow_shards(16).await.unwrap(), 16);
        let writer = DynamoOutbox::new(client.clone(), config.clone()).unwrap();
        // Messages on every shard: most of them beyond the relay's one shard.
        let messages: Vec<NewMessage> = (0..32)
            .map(|_| NewMessage::builder("refresh").build().unwrap())
            .collect();
        common::enqueue_all(&writer, &messages).await.unwrap();
        drain(&relay, &mut order, 33).await;
        assert!(relay.metrics().upkeep_units > upkeep, "read again");
    }

    /// Shard leases are kept by their own task: a relay that claims once and then does not
    /// claim for three leases still holds every shard (claims used to renew them); once
    /// the store is dropped, its task ends, its leases lapse and another relay takes them.
    async fn leases_are_kept_while_no_claim_runs_and_lapse_once_the_store_is_gone(
        client = common::client("outbox-dynamodb lease upkeep")
    ) {
        // Renewed every two thirds of a second: room for a round on a loaded machine.
        let lease = Duration::from_secs(2);
        let config = DynamoOutboxConfig::default()
            .with_table(common::table_name("upkeep"))
            .with_shard_leases(Some(lease));
        let a = store(&client, &config, 4);
        a.install().await.unwrap();
        let none = a.claim(ClaimRequest::new(1, LEASE).unwrap()).await.unwrap();
        assert!(none.is_empty());
        assert_eq!(a.owned_shards().await.len(), 4);
        // A relay stuck in slow publishes: no claim for three leases.
        tokio::time::sleep(lease * 3).await;
        assert_eq!(
            a.owned_shards().await.len(),
            4,
            "leases renewed without claims"
        );

        let b = store(&client, &config, 4);
        drop(a);
        poll_for("the dropped store's leases to lapse and be taken", || {
            let b = b.clone();
            async move {
                let none = b.claim(ClaimRequest::new(1, LEASE).unwrap()).await.unwrap();
                assert!(none.is_empty());
                (b.owned_shards().await.len() == 4).then_some(())
            }
        })
        .await;
    }

    /// Stores meeting a table without a count all at once: each writes it only if it is
    /// still missing, the ones that lose read the winner's, and none fails.
    async fn first_stores_racing_agree_on_one_count(
        client = common::client("outbox-dynamodb count race")
    ) {
        let config = DynamoOutboxConfig::default()
            .with_table(common::table_name("race"))
            .with_shard_leases(None);
        let installer = DynamoOutbox::new(client.clone(), config.clone()).unwrap();
        installer.install().await.unwrap();
        for round in 0..3 {
            client
                .delete_item()
                .table_name(config.table())
                .key("pk", aws_sdk_dynamodb::types::AttributeValue::S("c".into()))
                .key(
                    "sk",
                    aws_sdk_dynamodb::types::AttributeValue::S("shards".into()),
                )
                .send()
                .await
                .unwrap();
            let stores: Vec<DynamoOutbox> = (0..8)
                .map(|_| DynamoOutbox::new(client.clone(), config.clone()).unwrap())
                .collect();
            let counts =
                futures::future::join_all(stores.iter().map(DynamoOutbox::check_shards)).await;
            for count in counts {
                assert_eq!(
                    count.unwrap(),
                    outbox_dynamodb::DEFAULT_SHARDS,
                    "round {round}"
                );
            }
        }
    }
}
