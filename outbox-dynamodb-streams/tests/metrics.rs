//! The relay's metrics, read from a recorder installed for the whole binary (the
//! relay's readers register their per-shard gauges in their own tasks).

use std::sync::Arc;

use outbox_core::relay::metrics::{DEAD_LETTERED, DISPATCHED};
use outbox_core::NewMessage;
use outbox_dynamodb_streams::{ITERATOR_AGE_SECONDS, RECORDS_READ, SHARDS_OWNED};
use outbox_testkit::{wait_until, RecordingPublisher, TestRecorder};

// Shared with the main suite; this binary uses a part of it.
#[allow(dead_code)]
#[macro_use]
#[path = "streams/common.rs"]
mod common;

streams_test! {
    async fn the_relay_counts_what_it_reads_publishes_and_owns(
        url = common::service_url("stream relay: metrics")
    ) {
        let recorder: &'static TestRecorder = Box::leak(Box::default());
        metrics::set_global_recorder(recorder).unwrap();
        let outbox = common::outbox(&url, "metrics").await;
        let publisher = RecordingPublisher::failing_destination("poison");
        let relay = common::Running::start(
            &outbox,
            common::streams(&url),
            Arc::new(publisher.clone()),
            common::relay_config().with_name("m1"),
        );
        let mut sent: Vec<NewMessage> = (0..9)
            .map(|_| NewMessage::builder("fine").build().unwrap())
            .collect();
        sent.push(NewMessage::builder("poison").build().unwrap());
        outbox.enqueue(Vec::new(), &sent).await.unwrap();
        wait_until("one dead letter", || async {
            recorder.counter(DEAD_LETTERED, "relay=m1") == 1
        })
        .await;
        assert_eq!(recorder.counter(DISPATCHED, "relay=m1"), 9);
        // Ten messages and the dead letter's own item (skipped).
        wait_until("eleven records read", || async {
            recorder.counter(RECORDS_READ, "relay=m1") == 11
        })
        .await;
        assert_eq!(recorder.gauge(SHARDS_OWNED, "relay=m1"), Some(1.0));
        // Caught up: the next empty read sets the shard's age to zero.
        let shard = common::streams(&url)
            .describe_stream()
            .stream_arn(outbox.stream_arn().await.unwrap())
            .send()
            .await
            .unwrap()
            .stream_description
            .unwrap()
            .shards()[0]
            .shard_id()
            .unwrap()
            .to_owned();
        let labels = format!("relay=m1,shard={shard}");
        wait_until("the iterator age to drop to zero", || async {
            recorder.gauge(ITERATOR_AGE_SECONDS, &labels) == Some(0.0)
        })
        .await;
        relay.shutdown().await;
        assert_eq!(recorder.gauge(SHARDS_OWNED, "relay=m1"), Some(0.0));
        outbox.drop_tables().await.unwrap();
    }
}
