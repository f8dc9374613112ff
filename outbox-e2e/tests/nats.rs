//! PostgreSQL outbox -> crashing relays -> NATS JetStream -> a consumer with the
//! PostgreSQL inbox, on the live services named by `OUTBOX_PG_URL` and
//! `OUTBOX_NATS_URL` (skipped with a visible line when either is unset).
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-e2e --test nats -- --nocapture`

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Connect, Relays, Settle, Story, Tally, MESSAGES, REDELIVERIES};
use futures::{StreamExt, TryStreamExt};
use outbox_core::Publisher;
use outbox_nats::async_nats::jetstream::consumer::{pull, AckPolicy, PullConsumer};
use outbox_nats::async_nats::jetstream::{self, stream, AckKind};
use outbox_nats::{NatsPublisher, NatsPublisherConfig, MESSAGE_ID_HEADER};
use outbox_testkit::wait::{wait_until, within};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The destination the producer writes to; with the stream's name as the subject
/// prefix it becomes the subject `<name>.orders`.
const DESTINATION: &str = "orders";
/// Pull workers sharing the consumer.
const WORKERS: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_reaches_the_ledger_once_through_jetstream_while_relays_crash() {
    const WHAT: &str = "outbox-e2e through NATS JetStream";
    let Some(pg_url) = common::service_url("OUTBOX_PG_URL", WHAT) else {
        return;
    };
    let Some(nats_url) = common::service_url("OUTBOX_NATS_URL", WHAT) else {
        return;
    };
    let started = Instant::now();
    let story = Story::new(&pg_url).await;
    let name = story.name.clone();

    // The broker: a stream of the test's own on one subject, with JetStream's default
    // two-minute duplicate window.
    let client = outbox_nats::async_nats::connect(&nats_url)
        .await
        .expect("connect to OUTBOX_NATS_URL");
    let js = jetstream::new(client.clone());
    delete_stale_streams(&js).await;
    let subject = format!("{name}.{DESTINATION}");
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::Memory,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .expect("create the test stream");

    // Every publish the server receives on the subject, repeats included (JetStream's
    // dedup happens in the stream, after core delivery), until the end marker.
    let end_marker = format!("{name}.end");
    let mut raw = client
        .subscribe(format!("{name}.>"))
        .await
        .expect("subscribe");
    client.flush().await.expect("flush the subscription");
    let raw_count: JoinHandle<u64> = {
        let end_marker = end_marker.clone();
        tokio::spawn(async move {
            let mut seen = 0;
            while let Some(message) = raw.next().await {
                if message.subject.as_str() == end_marker {
                    break;
                }
                seen += 1;
            }
            seen
        })
    };

    // The consumer: a durable pull consumer, explicit acks, an ack wait longer than the
    // test so the only redeliveries are the ones it asks for.
    let consumer: PullConsumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(name.clone()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_secs(60),
            ..Default::default()
        })
        .await
        .expect("create the consumer");
    let tally = Arc::new(Tally::default());
    let stop_workers = CancellationToken::new();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            tokio::spawn(work(
                story.clone(),
                tally.clone(),
                consumer.clone(),
                stop_workers.clone(),
            ))
        })
        .collect();

    let connect: Connect = {
        let (url, prefix) = (nats_url.clone(), name.clone());
        Arc::new(move |relay: String| {
            let config = NatsPublisherConfig::new(url.clone())
                .with_subject_prefix(prefix.clone())
                .with_ack_timeout(common::BROKER_TIMEOUT)
                .with_client_name(relay);
            Box::pin(async move {
                let publisher =
                    common::ok("connect a publisher", NatsPublisher::connect(config).await);
                Arc::new(publisher) as Arc<dyn Publisher>
            })
        })
    };
    let relays = Relays::start(&story.outbox, connect);
    let producer = story.produce(
        DESTINATION,
        relays.published.clone(),
        relays.wakeups.clone(),
    );
    let produced = within("the producer", producer).await.expect("producer");
    story.wait_drained(&tally).await;
    let relay_totals = relays.stop().await;

    // Every stored message acknowledged, nothing pending redelivery: the consumer is done.
    wait_until("the consumer to acknowledge every stored message", || {
        let (consumer, tally) = (&consumer, &tally);
        async move {
            let info = consumer.get_info().await.expect("consumer info");
            tally.acks() >= MESSAGES
                && tally.in_hand() == 0
                && info.num_pending == 0
                && info.num_ack_pending == 0
        }
    })
    .await;
    stop_workers.cancel();
    for worker in workers {
        within("a worker to stop", worker).await.expect("worker");
    }
    // The relays' publishes were routed before their acks came back, so before this.
    client
        .publish(end_marker, "end".into())
        .await
        .expect("publish the end marker");
    client.flush().await.expect("flush");
    let raw_publishes = within("the raw subscription", raw_count)
        .await
        .expect("counter");
    let stored = stream.get_info().await.expect("stream info").state.messages;
    let ledger = story.verify().await;

    let repeats = raw_publishes.saturating_sub(MESSAGES);
    println!(
        "NATS JetStream end to end ({name}), {:.1?}",
        started.elapsed()
    );
    println!("  produced {produced} messages in transactions of 10");
    println!("  relays: {relay_totals}");
    println!(
        "  broker: {raw_publishes} publishes received, {repeats} repeats, \
         {stored} stored (the duplicate window dropped {})",
        raw_publishes.saturating_sub(stored)
    );
    println!(
        "  consumer: {} deliveries, {} applied, {} duplicates suppressed by the inbox, \
         {} redeliveries asked for",
        tally.deliveries(),
        tally.applied(),
        tally.duplicates(),
        tally.redeliveries_asked()
    );
    println!("  ledger: {ledger:?}");

    common::assert_story(&ledger, produced, &relay_totals);
    assert_eq!(stored, MESSAGES, "JetStream stored each message id once");
    assert!(
        repeats >= common::CRASHES,
        "each crash strands a batch the broker confirmed, so it is published again: \
         {repeats} repeats"
    );
    assert!(
        repeats <= relay_totals.duplicate_bound(),
        "repeats only from what crashed relays held or failed attempts: {repeats} > {}",
        relay_totals.duplicate_bound()
    );
    assert_eq!(tally.applied(), MESSAGES);
    assert_eq!(
        tally.redeliveries_asked(),
        REDELIVERIES,
        "one redelivery asked for per selected message"
    );
    assert_eq!(
        tally.duplicates(),
        tally.redeliveries_asked(),
        "with the stream deduplicated, the inbox saw only the redeliveries the consumer asked for"
    );
    assert_eq!(tally.deliveries(), MESSAGES + REDELIVERIES);

    js.delete_stream(&name)
        .await
        .expect("delete the test stream");
    story.teardown().await;
}

/// A pull worker: apply each message through the inbox, then ack it, or, on the first
/// delivery of a selected message, nak it so JetStream delivers it again.
async fn work(story: Story, tally: Arc<Tally>, consumer: PullConsumer, stop: CancellationToken) {
    let mut messages = consumer.messages().await.expect("pull messages");
    loop {
        let next = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            next = messages.next() => next,
        };
        let message = match next {
            Some(Ok(message)) => message,
            // Missed heartbeats and the like: the stream goes on.
            Some(Err(e)) => {
                eprintln!("pull: {e}");
                continue;
            }
            None => return,
        };
        let id = message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(MESSAGE_ID_HEADER))
            .map(|id| id.as_str());
        let first = message.info().expect("a JetStream message").delivered == 1;
        match common::consume(&story, &tally, id, &message.payload, first).await {
            Settle::Ack => {
                message.ack().await.expect("ack");
                tally.acked();
            }
            Settle::Redeliver => {
                message.ack_with(AckKind::Nak(None)).await.expect("nak");
                tally.sent_back();
            }
        }
    }
}

/// Delete test streams older than an hour (left by failed runs).
async fn delete_stale_streams(js: &jetstream::Context) {
    let names: Vec<String> = js.stream_names().try_collect().await.expect("list streams");
    for name in names.iter().filter(|name| common::is_stale(name)) {
        let _ = js.delete_stream(name).await;
    }
}
