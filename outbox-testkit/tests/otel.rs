//! Trace context across the outbox (outbox-core's feature `otel`, which this crate's
//! dev-dependency turns on): a producer span's context reaches a real relay's
//! `outbox.publish` span as a link, and a consumer continues the producer's trace.

use std::sync::Arc;

use opentelemetry::trace::{SpanContext, TraceContextExt, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use outbox_core::otel::{context_of, TRACEPARENT};
use outbox_core::{NewMessage, Relay, RelayConfig};
use outbox_testkit::{MemoryStore, RecordingPublisher};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

fn span_context(span: &tracing::Span) -> SpanContext {
    span.context().span().span_context().clone()
}

#[tokio::test]
async fn relay_links_publish_span_to_producers_and_consumers_continue_their_trace() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-test")));
    // The current-thread test runtime keeps the relay's work on this thread.
    let _guard = tracing::subscriber::set_default(subscriber);

    // Two producers in two traces; one message each, published in one call.
    let store = MemoryStore::new();
    let mut producers = Vec::new();
    for name in ["checkout", "refund"] {
        let span = tracing::info_span!("produce", name);
        let msg = span.in_scope(|| {
            NewMessage::builder("orders")
                .payload(name.as_bytes().to_vec())
                .build()
                .unwrap()
        });
        store.enqueue(std::slice::from_ref(&msg)).unwrap();
        producers.push((msg.id(), span_context(&span)));
    }
    assert_ne!(producers[0].1.trace_id(), producers[1].1.trace_id());

    let publisher = RecordingPublisher::new();
    let relay = Relay::new(
        Arc::new(store.clone()),
        Arc::new(publisher.clone()),
        RelayConfig::default().with_name("otel-test"),
    )
    .unwrap();
    let ids: Vec<_> = producers.iter().map(|(id, _)| *id).collect();
    let report = relay.dispatch_ids(&ids).await.unwrap();
    assert_eq!(report.dispatched, 2);

    let spans = exporter.get_finished_spans().unwrap();
    let publish: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "outbox.publish")
        .collect();
    assert_eq!(publish.len(), 1, "one publish call, one span");
    let publish = publish[0];
    let links = &publish.links.links;
    assert_eq!(links.len(), 2, "{links:?}");
    for (id, producer) in &producers {
        let link = links
            .iter()
            .find(|l| l.span_context.span_id() == producer.span_id())
            .unwrap_or_else(|| panic!("no link to the producer of {id}: {links:?}"));
        assert_eq!(link.span_context.trace_id(), producer.trace_id());
        assert!(link.span_context.is_remote());
        let attribute = link
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == "messaging.message.id")
            .unwrap();
        assert_eq!(attribute.value, Value::from(id.to_string()));
        assert_ne!(
            publish.span_context.trace_id(),
            producer.trace_id(),
            "the publish span is no producer's child: it links to them"
        );
    }

    // The consumer side: what the broker got carries each producer's trace.
    let published = publisher.published();
    assert_eq!(published.len(), 2);
    for message in &published {
        let (_, producer) = producers.iter().find(|(id, _)| *id == message.id).unwrap();
        assert!(message.headers.get(TRACEPARENT).is_some());
        let carried = context_of(message);
        assert_eq!(
            carried.span().span_context().trace_id(),
            producer.trace_id()
        );
        let consume = tracing::info_span!("consume");
        consume.set_parent(carried).unwrap();
        assert_eq!(span_context(&consume).trace_id(), producer.trace_id());
    }
}
