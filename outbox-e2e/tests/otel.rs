//! Trace context across real services (outbox-core's feature `otel`): a message built
//! inside a producer's span is enqueued in PostgreSQL, a relay publishes it to NATS
//! JetStream or RabbitMQ, and what a consumer reads back from the broker carries the
//! producer's trace id, so the consumer's span joins the producer's trace.
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-e2e --test otel`

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Story;
use opentelemetry::trace::{SpanContext, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use outbox_core::otel::{context_of_headers, TRACEPARENT};
use outbox_core::{Headers, MessageId, NewMessage, Publisher, Relay, RelayConfig};
use outbox_nats::async_nats::jetstream::{self, stream};
use outbox_nats::{NatsPublisher, NatsPublisherConfig};
use outbox_rabbitmq::lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use outbox_rabbitmq::lapin::types::{AMQPValue, FieldTable};
use outbox_rabbitmq::lapin::{Connection, ConnectionProperties};
use outbox_rabbitmq::{RabbitPublisher, RabbitPublisherConfig, Routing};
use outbox_testkit::wait::poll_for;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

const WHAT: &str = "outbox-e2e trace context through a broker";

fn span_context(span: &tracing::Span) -> SpanContext {
    span.context().span().span_context().clone()
}

/// Traces go nowhere but the spans get real OpenTelemetry contexts; the guard keeps the
/// subscriber for this (current-thread) test.
fn tracing_on() -> tracing::subscriber::DefaultGuard {
    let provider = SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-e2e")));
    tracing::subscriber::set_default(subscriber)
}

/// Build a message to `destination` inside a producer span, enqueue it in the story's
/// outbox and commit; returns its id and the producer's trace id.
async fn produce(story: &Story, destination: &str) -> (MessageId, TraceId) {
    let span = tracing::info_span!("checkout");
    let message = span.in_scope(|| {
        NewMessage::builder(destination)
            .payload(b"order 1".to_vec())
            .build()
            .expect("a valid message")
    });
    assert!(
        message.headers().get(TRACEPARENT).is_some(),
        "the message must capture the producer's trace context when built"
    );
    let mut tx = story.outbox.pool().begin().await.expect("begin");
    common::ok(
        "enqueue",
        story
            .outbox
            .enqueue(&mut tx, std::slice::from_ref(&message))
            .await,
    );
    tx.commit().await.expect("commit");
    (message.id(), span_context(&span).trace_id())
}

/// Dispatch `id` with a relay over the story's outbox and `publisher`.
async fn dispatch(story: &Story, publisher: Arc<dyn Publisher>, id: MessageId) {
    let relay = common::ok(
        "relay",
        Relay::new(
            Arc::new(story.outbox.clone()),
            publisher,
            RelayConfig::default().with_name("otel-e2e"),
        ),
    );
    let report = common::ok("dispatch", relay.dispatch_ids(&[id]).await);
    assert_eq!(report.dispatched, 1, "{report:?}");
}

/// The consumer's side: a span continuing what the broker delivered joins the trace.
fn assert_joins(headers: &Headers, producer: TraceId) {
    let carried = context_of_headers(headers);
    assert_eq!(carried.span().span_context().trace_id(), producer);
    let consume = tracing::info_span!("consume");
    consume
        .set_parent(carried)
        .expect("set the consumer's parent");
    assert_eq!(span_context(&consume).trace_id(), producer);
}

#[tokio::test]
async fn a_consumer_reading_jetstream_continues_the_producers_trace() {
    let Some(pg_url) = common::service_url("OUTBOX_PG_URL", WHAT) else {
        return;
    };
    let Some(nats_url) = common::service_url("OUTBOX_NATS_URL", WHAT) else {
        return;
    };
    let _tracing = tracing_on();
    let story = Story::new(&pg_url).await;
    let js = jetstream::new(
        outbox_nats::async_nats::connect(&nats_url)
            .await
            .expect("connect to OUTBOX_NATS_URL"),
    );
    let stream = js
        .create_stream(stream::Config {
            name: story.name.clone(),
            subjects: vec![format!("{}.>", story.name)],
            storage: stream::StorageType::Memory,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .expect("create the test stream");

    let (id, producer) = produce(&story, "orders").await;
    let config = NatsPublisherConfig::new(&nats_url).with_subject_prefix(&story.name);
    let publisher = common::ok("publisher", NatsPublisher::connect(config).await);
    dispatch(&story, Arc::new(publisher), id).await;

    let stored = stream
        .get_raw_message(1)
        .await
        .expect("read the stored message");
    let mut headers = Headers::new();
    for (name, values) in stored.headers.iter() {
        headers.insert(name.to_string(), values[0].as_str());
    }
    assert_eq!(
        headers.get("Nats-Msg-Id"),
        Some(id.to_string().as_str()),
        "the stored message is the one produced"
    );
    assert_joins(&headers, producer);
    js.delete_stream(&story.name)
        .await
        .expect("delete the stream");
    story.teardown().await;
}

#[tokio::test]
async fn a_consumer_reading_rabbitmq_continues_the_producers_trace() {
    let Some(pg_url) = common::service_url("OUTBOX_PG_URL", WHAT) else {
        return;
    };
    let Some(amqp_url) = common::service_url("OUTBOX_AMQP_URL", WHAT) else {
        return;
    };
    let _tracing = tracing_on();
    let story = Story::new(&pg_url).await;
    let connection = Connection::connect(&amqp_url, ConnectionProperties::default())
        .await
        .expect("connect to OUTBOX_AMQP_URL");
    let channel = connection.create_channel().await.expect("channel");
    // The default exchange routes the destination to the queue of that name.
    let queue = story.name.clone();
    let mut arguments = FieldTable::default();
    arguments.insert("x-expires".into(), AMQPValue::LongLongInt(120_000));
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            arguments,
        )
        .await
        .expect("declare the test queue");

    let (id, producer) = produce(&story, &queue).await;
    let config = RabbitPublisherConfig::new(amqp_url.clone()).with_routing(Routing::default());
    let publisher = common::ok("publisher", RabbitPublisher::connect(config).await);
    dispatch(&story, Arc::new(publisher), id).await;

    let delivery = poll_for("the message in the test queue", || {
        let (channel, queue) = (channel.clone(), queue.clone());
        async move {
            channel
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
                .await
                .expect("basic.get")
        }
    })
    .await
    .delivery;
    assert_eq!(
        delivery
            .properties
            .message_id()
            .as_ref()
            .map(|m| m.as_str()),
        Some(id.to_string().as_str()),
        "the delivered message is the one produced"
    );
    let mut headers = Headers::new();
    for (name, value) in delivery.properties.headers().iter().flat_map(|t| t.inner()) {
        if let AMQPValue::LongString(value) = value {
            headers.insert(name.as_str(), String::from_utf8_lossy(value.as_bytes()));
        }
    }
    assert_joins(&headers, producer);
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .expect("delete the test queue");
    story.teardown().await;
}
