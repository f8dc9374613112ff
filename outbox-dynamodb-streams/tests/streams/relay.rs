//! The relay on DynamoDB Local: every message published, large ones whole, skipped
//! records never published, poison messages dead-lettered while later ones flow,
//! takeover after a killed relay and after a graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::NewMessage;
use outbox_dynamodb_streams::aws_sdk_dynamodb::types::AttributeValue;
use outbox_dynamodb_streams::StreamOutbox;
use outbox_testkit::{wait_until, RecordingPublisher};

use crate::common::{self, Running};

fn messages(n: usize, destination: &str) -> Vec<NewMessage> {
    (0..n)
        .map(|i| {
            NewMessage::builder(destination)
                .partition_key(format!("k{}", i % 7))
                .payload(format!("{{\"n\":{i}}}").into_bytes())
                .build()
                .unwrap()
        })
        .collect()
}

async fn enqueue(outbox: &StreamOutbox, messages: &[NewMessage]) {
    for chunk in messages.chunks(25) {
        outbox.enqueue(Vec::new(), chunk).await.unwrap();
    }
}

streams_test! {
    async fn every_message_is_published_whole_and_skipped_records_never_are(
        (url, outbox) = common::url_and_outbox("stream relay: publish", "pub")
    ) {
        let mut sent = messages(60, "orders");
        let large: Vec<u8> = (0..700 * 1024_usize)
            .map(|i| u8::try_from(i % 253).unwrap())
            .collect();
        sent.push(
            NewMessage::builder("orders.large")
                .header("h", "v")
                .payload(large.clone())
                .build()
                .unwrap(),
        );
        enqueue(&outbox, &sent).await;
        // A modification and a removal of a message item: their records are skipped.
        let first = &sent[0];
        let key = |id: outbox_core::MessageId| {
            [
                (
                    "pk".to_owned(),
                    AttributeValue::S(format!("m#{}", id.as_uuid().hyphenated())),
                ),
                ("sk".to_owned(), AttributeValue::S("p#000".into())),
            ]
        };
        outbox
            .client()
            .update_item()
            .table_name(outbox.config().table())
            .set_key(Some(key(first.id()).into()))
            .update_expression("SET touched = :t")
            .expression_attribute_values(":t", AttributeValue::Bool(true))
            .send()
            .await
            .unwrap();
        outbox
            .client()
            .delete_item()
            .table_name(outbox.config().table())
            .set_key(Some(key(sent[1].id()).into()))
            .send()
            .await
            .unwrap();
        let publisher = RecordingPublisher::new();
        let relay = Running::start(
            &outbox,
            common::streams(&url),
            Arc::new(publisher.clone()),
            common::relay_config(),
        );
        publisher
            .wait_for_unique(sent.len(), outbox_testkit::wait::DEADLINE)
            .await
            .unwrap();
        // Written after the relay caught up: published too.
        let later = messages(5, "later");
        enqueue(&outbox, &later).await;
        publisher
            .wait_for_unique(sent.len() + later.len(), outbox_testkit::wait::DEADLINE)
            .await
            .unwrap();
        let report = relay.shutdown().await;
        assert_eq!(publisher.duplicates(), 0);
        assert_eq!(report.published, (sent.len() + later.len()) as u64);
        assert_eq!(report.dead_lettered, 0);
        // 61 messages + 2 extra parts + the modification + the removal + 5 later ones.
        assert_eq!(report.records_read, 61 + 2 + 2 + 5, "{report:?}");
        assert_eq!(report.leases_taken, 1, "DynamoDB Local has one shard");
        let published = publisher.published();
        let big = published
            .iter()
            .find(|m| m.destination == "orders.large")
            .unwrap();
        assert_eq!(big.payload, large);
        assert_eq!(big.headers.get("h"), Some("v"));
        let one = published.iter().find(|m| m.id == sent[5].id()).unwrap();
        assert_eq!(one.partition_key.as_deref(), Some("k5"));
        assert_eq!(one.payload, sent[5].payload());
        assert_eq!(one.attempts, 1);
        // What it cost, as DynamoDB Local reports it: the enqueues (a transaction bills
        // two units per KB of each item), the large message's two later parts read back,
        // and lease writes with at least one checkpoint.
        let m = outbox.metrics();
        assert_eq!(m.enqueued, (sent.len() + later.len()) as u64);
        assert!(m.enqueue_units >= 2.0 * m.enqueued as f64, "{m:?}");
        assert!(m.part_read_units > 0.0, "{m:?}");
        assert!(m.checkpoints >= 1 && m.lease_write_units > 0.0 && m.lease_read_units > 0.0);
        assert_eq!(m.dead_letter_units, 0.0);
        outbox.drop_tables().await.unwrap();
    }

    async fn a_poison_message_is_dead_lettered_while_later_ones_flow(
        (url, outbox) = common::url_and_outbox("stream relay: poison", "poison")
    ) {
        let poison = NewMessage::builder("poison").build().unwrap();
        let mut sent = vec![poison.clone()];
        sent.extend(messages(20, "fine"));
        enqueue(&outbox, &sent).await;
        // An item that looks like a message and is not one (no destination).
        let junk = outbox_core::MessageId::new();
        outbox
            .client()
            .put_item()
            .table_name(outbox.config().table())
            .item(
                "pk",
                AttributeValue::S(format!("m#{}", junk.as_uuid().hyphenated())),
            )
            .item("sk", AttributeValue::S("p#000".into()))
            .item("created_us", AttributeValue::N("1".into()))
            .send()
            .await
            .unwrap();
        let publisher = RecordingPublisher::failing_destination("poison");
        let relay = Running::start(
            &outbox,
            common::streams(&url),
            Arc::new(publisher.clone()),
            common::relay_config(),
        );
        publisher
            .wait_for_unique(20, outbox_testkit::wait::DEADLINE)
            .await
            .unwrap();
        let o = &outbox;
        wait_until("two dead letters", || async move {
            o.dead_letters(10).await.unwrap().len() == 2
        })
        .await;
        let report = relay.shutdown().await;
        let dead = outbox.dead_letters(10).await.unwrap();
        let by_id = |id| dead.iter().find(|d| d.id == id).unwrap();
        let p = by_id(poison.id());
        assert_eq!((p.attempts, p.destination.as_str()), (3, "poison"));
        assert!(
            p.reason.contains("gave up after 3 attempts"),
            "{}",
            p.reason
        );
        assert!(!p.shard.is_empty() && !p.sequence_number.is_empty());
        let j = by_id(junk);
        assert!(j.reason.contains("destination"), "{}", j.reason);
        assert_eq!(j.attempts, 0);
        assert_eq!(report.dead_lettered, 2);
        assert_eq!(report.retried, 3, "{report:?}");
        // Offered three times, published never.
        assert_eq!(publisher.times_seen(poison.id()), 3);
        assert!(publisher.published().iter().all(|m| m.id != poison.id()));
        outbox.drop_tables().await.unwrap();
    }

    async fn a_killed_relays_shard_is_taken_over_at_its_checkpoint(
        (url, outbox) = common::url_and_outbox("stream relay: takeover", "takeover")
    ) {
        let first = messages(100, "a");
        enqueue(&outbox, &first).await;
        // Reads of 10 records: a killed relay republishes at most one read.
        let config = common::relay_config().with_records_per_read(10);
        let publisher = RecordingPublisher::new();
        let killed = Running::start(
            &outbox,
            common::streams(&url),
            Arc::new(publisher.clone()),
            config.clone(),
        );
        publisher
            .wait_for_unique(first.len(), outbox_testkit::wait::DEADLINE)
            .await
            .unwrap();
        // Killed: no shutdown, no release; its heartbeat and lease lapse.
        killed.task.abort();
        let _ = killed.task.await;
        let second = messages(50, "b");
        enqueue(&outbox, &second).await;
        let before = publisher.published_count();
        let next = Running::start(
            &outbox,
            common::streams(&url),
            Arc::new(publisher.clone()),
            config,
        );
        publisher
            .wait_for_unique(first.len() + second.len(), outbox_testkit::wait::DEADLINE)
            .await
            .unwrap();
        let report = next.shutdown().await;
        assert_eq!(report.leases_taken, 1);
        // The new owner started at the checkpoint: it published the second batch and at
        // most one read of the first again.
        let republished = usize::try_from(report.published).unwrap() - second.len();
        assert!(republished <= 10, "{republished} republished: {report:?}");
        assert_eq!(
            publisher.published_count() - before,
            usize::try_from(report.published).unwrap()
        );
        assert!(publisher.duplicates() <= 10);
        outbox.drop_tables().await.unwrap();
    }

    async fn a_standby_takes_over_at_once_after_a_graceful_shutdown(
        (url, outbox) = common::url_and_outbox("stream relay: standby", "standby")
    ) {
        let publisher = RecordingPublisher::new();
        // A long lease: only a released lease can be taken within the test's deadline.
        let config = common::relay_config().with_lease(Duration::from_secs(60));
        let first = Running::start(
            &outbox,
            common::streams(&url),
            Arc::new(publisher.clone()),
            config.clone(),
        );
        enqueue(&outbox, &messages(10, "a")).await;
        publisher
            .wait_for_unique(10, outbox_testkit::wait::DEADLINE)
            .await
            .unwrap();
        // The standby waits while the first holds the only shard.
        let standby_pub = RecordingPublisher::new();
        let standby = Running::start(
            &outbox,
            common::streams(&url),
            Arc::new(standby_pub.clone()),
            config.with_lease(Duration::from_secs(3)),
        );
        let report = first.shutdown().await;
        assert_eq!((report.published, report.leases_taken), (10, 1));
        enqueue(&outbox, &messages(10, "b")).await;
        standby_pub
            .wait_for_unique(10, outbox_testkit::wait::DEADLINE)
            .await
            .unwrap();
        let report = standby.shutdown().await;
        // It started at the first relay's checkpoint: nothing of the first ten again.
        assert_eq!(report.published, 10, "{report:?}");
        assert!(standby_pub.published().iter().all(|m| m.destination == "b"));
        outbox.drop_tables().await.unwrap();
    }
}

/// The shard lease items of `outbox`'s lease table.
async fn shard_leases(
    outbox: &StreamOutbox,
) -> Vec<std::collections::HashMap<String, AttributeValue>> {
    outbox
        .client()
        .scan()
        .table_name(outbox.config().lease_table())
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .items()
        .iter()
        .filter(|i| i["pk"].as_s().is_ok_and(|pk| pk.starts_with("s#")))
        .cloned()
        .collect()
}

streams_test! {
    async fn a_lease_lost_mid_batch_moves_no_checkpoint(
        (url, outbox) = common::url_and_outbox("stream relay: lease lost mid-batch", "lost")
    ) {
        let (publisher, gate) = RecordingPublisher::new().hold_destination("held");
        let relay = Running::start(
            &outbox,
            common::streams(&url),
            Arc::new(publisher.clone()),
            common::relay_config().with_lease(Duration::from_secs(30)),
        );
        enqueue(&outbox, &messages(5, "held")).await;
        publisher
            .wait_for_calls(1, outbox_testkit::wait::DEADLINE)
            .await
            .unwrap();
        // Another worker takes the lease while the publish is in flight.
        let lease = shard_leases(&outbox).await.remove(0);
        outbox
            .client()
            .update_item()
            .table_name(outbox.config().lease_table())
            .key("pk", lease["pk"].clone())
            .update_expression("SET #o = :thief, #e = :far ADD #c :one")
            .expression_attribute_names("#o", "owner")
            .expression_attribute_names("#e", "expires_us")
            .expression_attribute_names("#c", "counter")
            .expression_attribute_values(":thief", AttributeValue::S("thief".into()))
            .expression_attribute_values(":far", AttributeValue::N(u64::MAX.to_string()))
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .send()
            .await
            .unwrap();
        gate.open();
        publisher
            .wait_for_unique(5, outbox_testkit::wait::DEADLINE)
            .await
            .unwrap();
        // The publish done, the reader checkpoints before it looks at anything else: the
        // write is refused (the lease is the thief's), so it stops reading the shard and
        // the thief's lease keeps no checkpoint: the thief starts where the lost owner's
        // last checkpoint was.
        let report = relay.shutdown().await;
        assert_eq!(report.leases_lost, 1, "{report:?}");
        let lease = shard_leases(&outbox).await.remove(0);
        assert_eq!(lease["owner"].as_s().unwrap(), "thief");
        assert!(!lease.contains_key("checkpoint"), "{lease:?}");
        outbox.drop_tables().await.unwrap();
    }

    /// DynamoDB Local answers `TrimmedDataAccessException` to the iterators it handed out
    /// for an empty shard once records arrive: the relay opens a fresh iterator at its
    /// position before it concludes the stream lost records (a fresh one answered so
    /// stops it, see `trimmed.rs`).
    async fn a_relay_started_on_an_empty_stream_publishes_what_comes_later(
        (url, outbox) = common::url_and_outbox("stream relay: empty stream", "empty")
    ) {
        let publisher = RecordingPublisher::new();
        let relay = Running::start(
            &outbox,
            common::streams(&url),
            Arc::new(publisher.clone()),
            common::relay_config().with_discovery_interval(Duration::from_secs(10)),
        );
        // Several empty reads first, so the reader's iterator is one carried over.
        let o = &outbox;
        wait_until("the relay to hold the shard", || async move {
            shard_leases(o)
                .await
                .first()
                .is_some_and(|l| l.contains_key("owner"))
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        enqueue(&outbox, &messages(10, "late")).await;
        publisher
            .wait_for_unique(10, outbox_testkit::wait::DEADLINE)
            .await
            .unwrap();
        let report = relay.shutdown().await;
        assert_eq!((report.published, report.leases_taken), (10, 1));
        outbox.drop_tables().await.unwrap();
    }
}
