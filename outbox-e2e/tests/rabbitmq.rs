//! PostgreSQL outbox -> crashing relays -> RabbitMQ -> a consumer with the PostgreSQL
//! inbox, on the live services named by `OUTBOX_PG_URL` and `OUTBOX_AMQP_URL` (skipped
//! with a visible line when either is unset).
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-e2e --test rabbitmq -- --nocapture`

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Connect, Relays, Settle, Story, Tally, MESSAGES};
use futures::StreamExt;
use outbox_core::Publisher;
use outbox_rabbitmq::lapin::message::Delivery;
use outbox_rabbitmq::lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions,
    BasicQosOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use outbox_rabbitmq::lapin::types::{AMQPValue, FieldTable, ShortString};
use outbox_rabbitmq::lapin::{Channel, Connection, ConnectionProperties};
use outbox_rabbitmq::{RabbitPublisher, RabbitPublisherConfig};
use outbox_testkit::wait::{wait_until, within};
use tokio_util::sync::CancellationToken;

/// Consumers on the queue, each on a channel of its own.
const WORKERS: usize = 2;
/// Unacknowledged deliveries per consumer.
const PREFETCH: u16 = 50;
/// A queue a crashed run leaves disappears after this long unused.
const QUEUE_EXPIRES_MS: i64 = 120_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_reaches_the_ledger_once_through_rabbitmq_while_relays_crash() {
    const WHAT: &str = "outbox-e2e through RabbitMQ";
    let Some(pg_url) = common::service_url("OUTBOX_PG_URL", WHAT) else {
        return;
    };
    let Some(amqp_url) = common::service_url("OUTBOX_AMQP_URL", WHAT) else {
        return;
    };
    let started = Instant::now();
    let story = Story::new(&pg_url).await;
    // The destination is the queue's name: the publisher's default mapping sends it to
    // the default exchange with the destination as routing key.
    let queue = story.name.clone();

    let connection = Connection::connect(
        &amqp_url,
        ConnectionProperties::default().with_connection_name(format!("{queue}-test").into()),
    )
    .await
    .expect("connect to OUTBOX_AMQP_URL");
    let admin = connection.create_channel().await.expect("channel");
    let mut arguments = FieldTable::default();
    arguments.insert("x-expires".into(), AMQPValue::LongLongInt(QUEUE_EXPIRES_MS));
    admin
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            arguments,
        )
        .await
        .expect("declare the test queue");

    let tally = Arc::new(Tally::default());
    let stop_workers = CancellationToken::new();
    let mut workers = Vec::new();
    for i in 0..WORKERS {
        let channel = connection.create_channel().await.expect("channel");
        channel
            .basic_qos(PREFETCH, BasicQosOptions::default())
            .await
            .expect("basic.qos");
        workers.push(tokio::spawn(work(
            story.clone(),
            tally.clone(),
            channel,
            queue.clone(),
            format!("{queue}-worker-{i}"),
            stop_workers.clone(),
        )));
    }

    let connect: Connect = {
        let (url, queue) = (amqp_url.clone(), queue.clone());
        Arc::new(move |relay: String| {
            let config = RabbitPublisherConfig::new(url.clone())
                .with_connection_name(format!("{queue}-{relay}"))
                .with_connect_timeout(Duration::from_secs(2))
                .with_publish_timeout(common::BROKER_TIMEOUT);
            Box::pin(async move {
                let publisher = common::ok(
                    "connect a publisher",
                    RabbitPublisher::connect(config).await,
                );
                Arc::new(publisher) as Arc<dyn Publisher>
            })
        })
    };
    let relays = Relays::start(&story.outbox, connect);
    let producer = story.produce(&queue, relays.published.clone(), relays.wakeups.clone());
    let produced = within("the producer", producer).await.expect("producer");
    story.wait_drained(&tally).await;
    let relay_totals = relays.stop().await;

    // No relay publishes any more. Let the consumers empty the queue, then stop them:
    // each cancels its subscription and settles what it was already sent.
    wait_until("the consumers to empty the queue", || {
        let (admin, queue, tally) = (&admin, &queue, &tally);
        async move { depth(admin, queue).await == 0 && tally.in_hand() == 0 }
    })
    .await;
    stop_workers.cancel();
    for worker in workers {
        within("a worker to stop", worker).await.expect("worker");
    }
    // What a nack put back after a consumer's last delivery: take it here.
    let mut drained = 0;
    while let Some(got) = admin
        .basic_get(queue.as_str().into(), BasicGetOptions::default())
        .await
        .expect("basic.get")
    {
        handle(&story, &tally, &got.delivery, false).await;
        drained += 1;
    }
    assert_eq!(depth(&admin, &queue).await, 0, "the queue is empty");
    let ledger = story.verify().await;

    // Each copy in the queue was acknowledged exactly once in the end (a nack puts
    // it back, to be delivered again).
    let copies = tally.acks();
    let repeats = copies.saturating_sub(MESSAGES);
    println!("RabbitMQ end to end ({queue}), {:.1?}", started.elapsed());
    println!("  produced {produced} messages in transactions of 10");
    println!("  relays: {relay_totals}");
    println!(
        "  broker: {copies} copies queued, {repeats} repeats (RabbitMQ keeps no dedup window)"
    );
    println!(
        "  consumer: {} deliveries ({drained} taken after the consumers stopped), {} applied, \
         {} duplicates suppressed by the inbox, {} redeliveries asked for",
        tally.deliveries(),
        tally.applied(),
        tally.duplicates(),
        tally.redeliveries_asked()
    );
    println!("  ledger: {ledger:?}");

    common::assert_story(&ledger, produced, &relay_totals);
    assert!(
        repeats >= common::CRASHES,
        "each crash strands a batch the broker confirmed, so it is queued again: \
         {repeats} repeats"
    );
    assert!(
        repeats <= relay_totals.duplicate_bound(),
        "repeats only from what crashed relays held or failed attempts: {repeats} > {}",
        relay_totals.duplicate_bound()
    );
    assert_eq!(tally.applied(), MESSAGES);
    assert!(
        tally.redeliveries_asked() >= common::REDELIVERIES,
        "every selected message was sent back once"
    );
    assert_eq!(
        tally.duplicates(),
        repeats + tally.redeliveries_asked(),
        "the inbox suppressed every repeat and every redelivery"
    );

    admin
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .expect("delete the test queue");
    let _ = connection.close(200, "done".into()).await;
    story.teardown().await;
}

/// A consumer: apply each delivery through the inbox, then ack it, or, on the first
/// delivery of a selected message, nack it back into the queue. When told to stop, it
/// cancels its subscription and settles what was already sent to it, without nacks.
async fn work(
    story: Story,
    tally: Arc<Tally>,
    channel: Channel,
    queue: String,
    tag: String,
    stop: CancellationToken,
) {
    let tag = ShortString::from(tag);
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            tag.clone(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("basic.consume");
    let mut stopping = false;
    loop {
        let next = if stopping {
            within("the deliveries before basic.cancel-ok", deliveries.next()).await
        } else {
            tokio::select! {
                biased;
                () = stop.cancelled() => {
                    channel
                        .basic_cancel(tag.clone(), BasicCancelOptions::default())
                        .await
                        .expect("basic.cancel");
                    stopping = true;
                    continue;
                }
                next = deliveries.next() => next,
            }
        };
        let Some(delivery) = next else {
            break;
        };
        let delivery = delivery.expect("a delivery");
        handle(&story, &tally, &delivery, !stopping).await;
    }
    let _ = channel.close(200, "done".into()).await;
}

/// Apply `delivery` and settle it; `may_send_back` allows the on-purpose nack.
async fn handle(story: &Story, tally: &Tally, delivery: &Delivery, may_send_back: bool) {
    let id = delivery
        .properties
        .message_id()
        .as_ref()
        .map(ShortString::as_str);
    let first = may_send_back && !delivery.redelivered;
    match common::consume(story, tally, id, &delivery.data, first).await {
        Settle::Ack => {
            delivery
                .ack(BasicAckOptions::default())
                .await
                .expect("basic.ack");
            tally.acked();
        }
        Settle::Redeliver => {
            delivery
                .nack(BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                })
                .await
                .expect("basic.nack");
            tally.sent_back();
        }
    }
}

/// Messages ready in `queue` (not counting those delivered and unacknowledged).
async fn depth(channel: &Channel, queue: &str) -> u32 {
    let options = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), options, FieldTable::default())
        .await
        .expect("passive queue.declare")
        .message_count()
}
