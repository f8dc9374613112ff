//! W3C trace context carried through the outbox (feature `otel`).
//!
//! A message waits in the outbox for an unknown time and is published by another task,
//! often another process, so the producer's trace does not reach the broker by itself.
//! With this feature the trace rides in the message headers, in the
//! [W3C Trace Context](https://www.w3.org/TR/trace-context/) format every OpenTelemetry
//! SDK reads:
//!
//! 1. **Capture.** [`NewMessageBuilder::build`](crate::NewMessageBuilder::build) asks the
//!    current [`tracing`] span for its OpenTelemetry context
//!    ([`OpenTelemetrySpanExt::context`]) and writes it with opentelemetry's
//!    [`TraceContextPropagator`] as the headers [`TRACEPARENT`] and [`TRACESTATE`].
//!    Every backend's `enqueue` takes built [`NewMessage`](crate::NewMessage)s, so this
//!    one point covers all of them, and it runs in the producer's code, inside the span
//!    of the request or handler that decided to send the message.
//! 2. **Link.** The relay publishes each publish call under a span named
//!    `outbox.publish` (fields `relay`, `count`, `first_id`), one per call to
//!    [`Publisher::publish`](crate::Publisher::publish). That span gets an OpenTelemetry
//!    link to each message's captured context, with the attribute
//!    `messaging.message.id`. The publish span is a root of its own trace (or a child of
//!    whatever span the relay runs in): a batch carries messages from many producers, so
//!    no one of them can be its parent.
//! 3. **Continue.** A consumer reads the context back with [`context_of`] (a stored
//!    [`Message`]) or [`context_of_headers`] (headers as a broker delivered them) and
//!    makes it the parent of its processing span:
//!
//! ```
//! use outbox_core::otel::{context_of_headers, tracing_opentelemetry::OpenTelemetrySpanExt};
//! use outbox_core::Headers;
//!
//! fn handle(delivered: &Headers) {
//!     let span = tracing::info_span!("orders.process");
//!     // Fails only when no OpenTelemetry layer is installed or the span already started.
//!     let _ = span.set_parent(context_of_headers(delivered));
//!     let _entered = span.enter();
//!     // ... apply the message ...
//! }
//! # handle(&Headers::new());
//! ```
//!
//! ## Rules of capture
//!
//! - Nothing is written when the current span has no valid OpenTelemetry context: no
//!   span, no `tracing-opentelemetry` layer installed, or a span the subscriber
//!   disabled. Messages built outside any span carry no trace.
//! - Headers the caller set win: a message that already has a `traceparent` or a
//!   `tracestate` header keeps both as given (they describe one context together, so
//!   neither is mixed with the current span's).
//! - An empty `tracestate` is not written.
//! - The trace headers count against [`MessageLimits`] like any
//!   others: two headers; `traceparent` is always [`TRACEPARENT_LEN`] (55) bytes plus
//!   its 11-byte name; `tracestate` is whatever vendors put there (W3C advises at most
//!   512 bytes) plus its 10-byte name. The caller's message is validated first, so
//!   tracing never makes a build fail: when a header would break a limit (too many
//!   headers, a value longer than `max_header_value_len`) it is left out, `tracestate`
//!   first, and a `debug` event says so.
//! - Capture asks the span for its context, which starts the span's OpenTelemetry side:
//!   call `set_parent` on the span before building messages in it.
//!
//! ## Limitations
//!
//! - The context is the span current at **build** time, not at enqueue: a message built
//!   in one span and enqueued in another carries the first.
//! - Only the W3C format is written, whatever global propagator the service installed;
//!   baggage is not carried.
//! - OpenTelemetry SDKs cap links per span (128 by default in `opentelemetry_sdk`, see
//!   its `SpanLimits`): a publish call of more messages than that drops the excess
//!   links. The default [`publish_batch_size`](crate::RelayConfig::publish_batch_size)
//!   (100) stays under it.
//! - Messages enqueued by other tools keep whatever headers they wrote; a malformed
//!   `traceparent` simply yields no link and an empty context.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::headers::Headers;
use crate::limits::MessageLimits;
use crate::message::Message;

/// The opentelemetry crate this feature was built with, so a service uses the same
/// version for [`Context`] and its SDK setup.
pub use opentelemetry;
/// The tracing-opentelemetry crate this feature was built with (for
/// [`OpenTelemetrySpanExt`] and the subscriber layer).
pub use tracing_opentelemetry;

/// The header holding the W3C `traceparent`: version, trace id, parent span id, flags.
pub const TRACEPARENT: &str = "traceparent";

/// The header holding the W3C `tracestate`: vendor-specific entries.
pub const TRACESTATE: &str = "tracestate";

/// Length in bytes of every `traceparent` value written (version 00:
/// `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`).
pub const TRACEPARENT_LEN: usize = 55;

/// The attribute naming the message on each link of the `outbox.publish` span
/// (OpenTelemetry messaging semantic conventions).
const MESSAGE_ID_ATTRIBUTE: &str = "messaging.message.id";

/// The producer's context captured in `message`'s headers: a remote span context to pass
/// to `set_parent` or to link to. Empty (no valid span) when the message carries no
/// valid `traceparent`.
pub fn context_of(message: &Message) -> Context {
    context_of_headers(&message.headers)
}

/// The context in W3C headers, for consumers that hold the headers a broker delivered
/// rather than a [`Message`]. Empty (no valid span) without a valid `traceparent`.
pub fn context_of_headers(headers: &Headers) -> Context {
    TraceContextPropagator::new().extract(&HeaderReader(headers))
}

/// Write the current span's trace context into `headers`, keeping them valid under
/// `limits`; see the module docs for the rules.
pub(crate) fn capture_current(headers: &mut Headers, limits: &MessageLimits) {
    if headers.get(TRACEPARENT).is_some() || headers.get(TRACESTATE).is_some() {
        return;
    }
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    let mut written = HeaderWriter::default();
    TraceContextPropagator::new().inject_context(&cx, &mut written);
    let Some(traceparent) = written.traceparent else {
        return;
    };
    let mut with_parent = headers.clone();
    with_parent.insert(TRACEPARENT, traceparent);
    if let Err(err) = limits.check_headers(&with_parent) {
        tracing::debug!(error = %err, "trace context not captured: the headers would break the message limits");
        return;
    }
    if let Some(tracestate) = written.tracestate.filter(|s| !s.is_empty()) {
        let mut with_state = with_parent.clone();
        with_state.insert(TRACESTATE, tracestate);
        match limits.check_headers(&with_state) {
            Ok(()) => with_parent = with_state,
            Err(err) => tracing::debug!(
                error = %err,
                "tracestate not captured: the headers would break the message limits"
            ),
        }
    }
    *headers = with_parent;
}

/// Link `span` (an `outbox.publish` span) to the captured context of each message that
/// has one.
pub(crate) fn link_messages(span: &tracing::Span, messages: &[Message]) {
    if span.is_disabled() {
        return;
    }
    let propagator = TraceContextPropagator::new();
    for message in messages {
        let cx = propagator.extract(&HeaderReader(&message.headers));
        let producer = cx.span().span_context().clone();
        if producer.is_valid() {
            let id = KeyValue::new(MESSAGE_ID_ATTRIBUTE, message.id.to_string());
            span.add_link_with_attributes(producer, vec![id]);
        }
    }
}

/// Reads the trace headers of a [`Headers`].
struct HeaderReader<'a>(&'a Headers);

impl Extractor for HeaderReader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name).collect()
    }
}

/// Collects what the propagator writes, so it can be checked before it is kept.
#[derive(Default)]
struct HeaderWriter {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl Injector for HeaderWriter {
    fn set(&mut self, key: &str, value: String) {
        match key {
            TRACEPARENT => self.traceparent = Some(value),
            TRACESTATE => self.tracestate = Some(value),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanContext, SpanId, TraceId, TraceState, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::message::NewMessage;
    use crate::message_parts::MessageParts;

    /// A subscriber exporting OpenTelemetry spans to memory, installed for this thread
    /// while the guard lives.
    fn traced() -> (tracing::subscriber::DefaultGuard, InMemorySpanExporter) {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-test")));
        (tracing::subscriber::set_default(subscriber), exporter)
    }

    fn span_context(span: &tracing::Span) -> SpanContext {
        span.context().span().span_context().clone()
    }

    #[test]
    fn build_captures_the_current_span_as_w3c_headers() {
        let (_guard, _exporter) = traced();
        let span = tracing::info_span!("produce");
        let msg = span.in_scope(|| NewMessage::builder("orders").build().unwrap());
        let producer = span_context(&span);
        let traceparent = msg.headers().get(TRACEPARENT).unwrap();
        assert_eq!(traceparent.len(), TRACEPARENT_LEN);
        assert_eq!(
            traceparent,
            format!("00-{}-{}-01", producer.trace_id(), producer.span_id())
        );
        assert_eq!(
            msg.headers().get(TRACESTATE),
            None,
            "empty tracestate is left out"
        );
        MessageLimits::default().check(&msg).unwrap();
    }

    #[test]
    fn nothing_is_captured_without_a_valid_span_context() {
        let outside = NewMessage::builder("orders").build().unwrap();
        assert!(outside.headers().is_empty(), "no subscriber, no span");
        let span = tracing::info_span!("no otel layer");
        let msg = span.in_scope(|| NewMessage::builder("orders").build().unwrap());
        assert!(msg.headers().is_empty(), "a span without the layer");
        let (_guard, _exporter) = traced();
        let msg = NewMessage::builder("orders").build().unwrap();
        assert!(msg.headers().is_empty(), "the layer but no current span");
    }

    #[test]
    fn headers_set_by_the_caller_are_kept() {
        let (_guard, _exporter) = traced();
        let span = tracing::info_span!("produce");
        let _entered = span.enter();
        let given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let msg = NewMessage::builder("orders")
            .header(TRACEPARENT, given)
            .build()
            .unwrap();
        assert_eq!(msg.headers().get(TRACEPARENT), Some(given));
        assert_eq!(msg.headers().get(TRACESTATE), None);
        let msg = NewMessage::builder("orders")
            .header(TRACESTATE, "vendor=1")
            .build()
            .unwrap();
        assert_eq!(
            msg.headers().get(TRACEPARENT),
            None,
            "the pair stays the caller's"
        );
        assert_eq!(msg.headers().get(TRACESTATE), Some("vendor=1"));
    }

    #[test]
    fn capture_never_breaks_the_message_limits() {
        let (_guard, _exporter) = traced();
        let span = tracing::info_span!("produce");
        let _entered = span.enter();
        let mut limits = MessageLimits {
            max_headers: 2,
            ..MessageLimits::default()
        };
        let full: Headers = [("a", "1"), ("b", "2")].into_iter().collect();
        let msg = NewMessage::builder("orders")
            .headers(full.clone())
            .limits(limits.clone())
            .build()
            .unwrap();
        assert_eq!(msg.headers(), &full, "no room: nothing captured");
        limits.check(&msg).unwrap();

        limits.max_headers = 3;
        let msg = NewMessage::builder("orders")
            .headers(full)
            .limits(limits.clone())
            .build()
            .unwrap();
        assert!(msg.headers().get(TRACEPARENT).is_some(), "room for one");
        limits.check(&msg).unwrap();

        limits.max_header_value_len = TRACEPARENT_LEN - 1;
        let msg = NewMessage::builder("orders")
            .limits(limits.clone())
            .build()
            .unwrap();
        assert!(
            msg.headers().is_empty(),
            "traceparent too long for the limit"
        );
    }

    #[test]
    fn tracestate_is_captured_and_dropped_first_when_it_does_not_fit() {
        let (_guard, _exporter) = traced();
        let remote = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            opentelemetry::trace::TraceFlags::SAMPLED,
            true,
            "vendor=opaque".parse::<TraceState>().unwrap(),
        );
        let span = tracing::info_span!("produce");
        span.set_parent(Context::new().with_remote_span_context(remote))
            .unwrap();
        let _entered = span.enter();
        let msg = NewMessage::builder("orders").build().unwrap();
        assert_eq!(msg.headers().get(TRACESTATE), Some("vendor=opaque"));
        assert!(msg
            .headers()
            .get(TRACEPARENT)
            .unwrap()
            .starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));

        let one_more = MessageLimits {
            max_headers: 1,
            ..MessageLimits::default()
        };
        let msg = NewMessage::builder("orders")
            .limits(one_more)
            .build()
            .unwrap();
        assert!(msg.headers().get(TRACEPARENT).is_some());
        assert_eq!(msg.headers().get(TRACESTATE), None);
    }

    #[test]
    fn consumers_read_the_producer_context_back() {
        let (_guard, _exporter) = traced();
        let span = tracing::info_span!("produce");
        let built = span.in_scope(|| NewMessage::builder("orders").build().unwrap());
        let stored = Message::from(MessageParts {
            id: built.id(),
            destination: built.destination().into(),
            partition_key: None,
            payload: Vec::new(),
            content_type: None,
            headers: built.headers().clone(),
            created_at: std::time::SystemTime::now(),
            attempts: 1,
            last_error: None,
        });
        let producer = span_context(&span);
        let read = context_of(&stored);
        let read = read.span().span_context().clone();
        assert!(read.is_remote());
        assert_eq!(
            (read.trace_id(), read.span_id()),
            (producer.trace_id(), producer.span_id())
        );
        let garbled: Headers = [(TRACEPARENT, "00-nope")].into_iter().collect();
        assert!(!context_of_headers(&garbled)
            .span()
            .span_context()
            .is_valid());
    }
}
