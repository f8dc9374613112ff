//! [`Publisher`] cases against a live broker: outcomes, what arrives, the dedup id and
//! window, unroutable destinations, concurrency and large batches.

use crate::harness::declared::SEALED;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use outbox_core::backend::MessageParts;
use outbox_core::{Headers, Message, MessageId, PublishOutcome, Publisher};
use tokio::sync::Barrier;

use crate::harness::publisher::{PublisherHarness, PublisherNamespace, Received};
use crate::macros::groups::require;
use crate::wait::{wait_until, within};

/// How many tasks publish at once in the concurrency case, and how many publishers
/// (relay processes) they share.
const TASKS: usize = 8;
const PUBLISHERS: usize = 2;
/// Batches each task publishes, and their size.
const BATCHES_PER_TASK: usize = 3;
const BATCH: usize = 10;
/// The large batch.
const LARGE: usize = 1_000;
/// The batches a relay publishes while its broker restarts.
const RESTART_BATCH: usize = 100;

// Every call into the harness is bounded: a hang fails the case, naming the call.

async fn namespace(h: &dyn PublisherHarness) -> Box<dyn PublisherNamespace> {
    within("making a namespace", h.namespace())
        .await
        .unwrap_or_else(|e| panic!("harness could not make a namespace: {}", e.report()))
}

async fn publisher(ns: &dyn PublisherNamespace) -> Arc<dyn Publisher> {
    within("making a publisher", ns.publisher())
        .await
        .unwrap_or_else(|e| panic!("namespace could not make a publisher: {}", e.report()))
}

async fn received(ns: &dyn PublisherNamespace, destination: &str) -> Vec<Received> {
    within(
        "reading back what the broker holds",
        ns.received(destination),
    )
    .await
    .unwrap_or_else(|e| panic!("reading back {destination:?} failed: {}", e.report()))
}

async fn teardown(ns: Box<dyn PublisherNamespace>) {
    within("the namespace's teardown", ns.teardown())
        .await
        .unwrap_or_else(|e| panic!("namespace teardown failed: {}", e.report()));
}

/// Publish, failing the case on `Err` or a wrong number of outcomes.
async fn publish(publisher: &dyn Publisher, batch: &[Message]) -> Vec<PublishOutcome> {
    let outcomes = within("a publish call", publisher.publish(batch))
        .await
        .unwrap_or_else(|e| panic!("publish failed as a whole: {}", e.report()));
    assert_eq!(
        outcomes.len(),
        batch.len(),
        "publish must return exactly one outcome per message"
    );
    outcomes
}

fn assert_all_published(outcomes: &[PublishOutcome]) {
    for (i, outcome) in outcomes.iter().enumerate() {
        assert_eq!(
            *outcome,
            PublishOutcome::Published,
            "message {i} of the batch was not published"
        );
    }
}

/// A claimed message as a relay hands it over.
fn message(destination: &str, payload: impl Into<Vec<u8>>) -> Message {
    Message::from(MessageParts {
        id: MessageId::new(),
        destination: destination.to_owned(),
        partition_key: None,
        payload: payload.into(),
        content_type: None,
        headers: Headers::new(),
        created_at: SystemTime::now(),
        attempts: 1,
        last_error: None,
    })
}

fn numbered(destination: &str, n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| message(destination, format!("message {i}")))
        .collect()
}

/// The ids the broker holds, each once, failing on a repeat.
fn dedup_ids(received: &[Received]) -> HashSet<String> {
    let mut ids = HashSet::new();
    for r in received {
        let id = r
            .dedup_id
            .clone()
            .expect("the broker holds a message without a dedup id");
        assert!(ids.insert(id.clone()), "the broker holds {id} twice");
    }
    ids
}

fn ids_of(batch: &[Message]) -> HashSet<String> {
    batch.iter().map(|m| m.id.to_string()).collect()
}

/// `publish` returns one outcome per message in the batch's order: with mixed
/// destinations, each unroutable message's outcome sits at its own position.
pub async fn publisher_returns_one_outcome_per_message_in_batch_order(h: &dyn PublisherHarness) {
    let ns = namespace(h).await;
    let publisher = publisher(&*ns).await;
    let routed = ns.destination("ordered");
    if !h.features(SEALED).unroutable_is_permanent {
        let batch = numbered(&routed, 7);
        assert_all_published(&publish(&*publisher, &batch).await);
        assert_eq!(dedup_ids(&received(&*ns, &routed).await), ids_of(&batch));
        teardown(ns).await;
        return;
    }
    let nowhere = ns.unroutable_destination();
    // Unroutable at positions 1, 2 and 5 of 7.
    let unroutable = [false, true, true, false, false, true, false];
    let batch: Vec<Message> = unroutable
        .iter()
        .enumerate()
        .map(|(i, &bad)| message(if bad { &nowhere } else { &routed }, format!("m{i}")))
        .collect();
    let outcomes = publish(&*publisher, &batch).await;
    for (i, (outcome, &bad)) in outcomes.iter().zip(&unroutable).enumerate() {
        match outcome {
            PublishOutcome::Permanent(_) if bad => {}
            PublishOutcome::Published if !bad => {}
            other => panic!(
                "outcome {i} is {other:?}, but message {i} went to {} destination: outcomes \
                 must follow the batch's order",
                if bad { "an unroutable" } else { "a routed" }
            ),
        }
    }
    let expected: HashSet<String> = batch
        .iter()
        .zip(&unroutable)
        .filter(|(_, &bad)| !bad)
        .map(|(m, _)| m.id.to_string())
        .collect();
    assert_eq!(dedup_ids(&received(&*ns, &routed).await), expected);
    teardown(ns).await;
}

/// Every header, the content type, the partition key and every payload byte arrive as
/// given: a message with all of them, an empty payload with none, and binary payloads
/// holding every byte value (NUL, CR LF, invalid UTF-8).
pub async fn publisher_delivers_headers_content_type_key_and_payload(h: &dyn PublisherHarness) {
    let ns = namespace(h).await;
    let publisher = publisher(&*ns).await;

    let mut full = message(
        &ns.destination("full"),
        br#"{"order":42,"note":"caf\u00e9"}"#.to_vec(),
    );
    full.content_type = Some("application/json; charset=utf-8".to_owned());
    full.partition_key = Some("order-42".to_owned());
    full.headers = [
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("tracestate", "vendor=value,other=x"),
        ("x-tenant", "acme corp"),
        ("X-Mixed-Case", "Value With Spaces"),
        ("x-unicode", "héllo wörld ✓ 日本"),
        ("x-tab-inside", "a\tb"),
        ("x-punctuation", "a:b;c=d, \"quoted\" <x> ~!@#$%^&*()"),
        ("x-empty-looking", "-"),
    ]
    .into_iter()
    .collect();

    let empty = message(&ns.destination("empty"), Vec::new());

    let every_byte: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    let mut binary = message(&ns.destination("binary"), every_byte);
    binary.content_type = Some("application/octet-stream".to_owned());
    binary.partition_key = Some("bytes".to_owned());

    let protocol_like = message(
        &ns.destination("protocol"),
        b"\r\n\r\nHPUB x 1 2\r\nNATS/1.0\r\n\r\n\0\xff\xfe".to_vec(),
    );

    let batch = vec![full, empty, binary, protocol_like];
    assert_all_published(&publish(&*publisher, &batch).await);

    for sent in &batch {
        let got = received(&*ns, &sent.destination).await;
        assert_eq!(
            got.len(),
            1,
            "the broker holds {} messages for {:?}, one was published",
            got.len(),
            sent.destination
        );
        let got = &got[0];
        assert_eq!(
            got.payload, sent.payload,
            "the payload to {:?} changed on the way",
            sent.destination
        );
        assert_eq!(got.content_type, sent.content_type, "content type");
        assert_eq!(got.partition_key, sent.partition_key, "partition key");
        assert_eq!(
            got.headers, sent.headers,
            "the headers to {:?} changed on the way",
            sent.destination
        );
    }
    teardown(ns).await;
}

/// The message id reaches the broker as its dedup id (`Nats-Msg-Id`, `message-id`).
pub async fn publisher_sends_the_message_id_as_the_dedup_id(h: &dyn PublisherHarness) {
    let ns = namespace(h).await;
    let publisher = publisher(&*ns).await;
    let destination = ns.destination("ids");
    let batch = numbered(&destination, 5);
    assert_all_published(&publish(&*publisher, &batch).await);
    let got: Vec<Option<String>> = received(&*ns, &destination)
        .await
        .into_iter()
        .map(|r| r.dedup_id)
        .collect();
    let mut got: Vec<String> = got
        .into_iter()
        .map(|id| id.expect("a message arrived without the broker's dedup id"))
        .collect();
    let mut sent: Vec<String> = batch.iter().map(|m| m.id.to_string()).collect();
    got.sort();
    sent.sort();
    assert_eq!(
        got, sent,
        "the dedup ids the broker holds are not the message ids"
    );
    teardown(ns).await;
}

/// A repeat of an id within the broker's dedup window (a relay retrying after a lost
/// ack or a crash) counts as published, and the broker holds the message once: in a
/// later call, in the same batch, and from another publisher.
pub async fn publisher_repeat_of_an_id_is_dropped_within_the_dedup_window(
    h: &dyn PublisherHarness,
) {
    require(h.features(SEALED).dedup_window, "dedup_window");
    let ns = namespace(h).await;
    let first = publisher(&*ns).await;
    let destination = ns.destination("repeats");
    let batch = numbered(&destination, 3);
    assert_all_published(&publish(&*first, &batch).await);

    // The same messages again, then the first one twice in one batch.
    assert_all_published(&publish(&*first, &batch).await);
    let twice = vec![batch[0].clone(), batch[0].clone()];
    assert_all_published(&publish(&*first, &twice).await);
    // From another relay process.
    let second = publisher(&*ns).await;
    assert_all_published(&publish(&*second, &batch).await);

    let got = received(&*ns, &destination).await;
    assert_eq!(
        got.len(),
        batch.len(),
        "the broker holds {} messages; {} distinct ids were published (repeats must be \
         dropped within the dedup window)",
        got.len(),
        batch.len()
    );
    assert_eq!(dedup_ids(&got), ids_of(&batch));
    teardown(ns).await;
}

/// A message to a destination nothing stores is `Permanent`, and the rest of its batch,
/// before and after it, is published.
pub async fn publisher_unroutable_is_permanent_and_spares_the_batch(h: &dyn PublisherHarness) {
    require(
        h.features(SEALED).unroutable_is_permanent,
        "unroutable_is_permanent",
    );
    let ns = namespace(h).await;
    let publisher = publisher(&*ns).await;
    let routed = ns.destination("spared");
    let nowhere = ns.unroutable_destination();
    let batch = vec![
        message(&routed, "before"),
        message(&nowhere, "lost"),
        message(&routed, "after"),
    ];
    let outcomes = publish(&*publisher, &batch).await;
    assert_eq!(outcomes[0], PublishOutcome::Published, "the message before");
    assert!(
        matches!(&outcomes[1], PublishOutcome::Permanent(reason) if !reason.is_empty()),
        "an unroutable message must be Permanent with a reason, got {:?}",
        outcomes[1]
    );
    assert_eq!(outcomes[2], PublishOutcome::Published, "the message after");
    let got = received(&*ns, &routed).await;
    let payloads: Vec<&[u8]> = got.iter().map(|r| r.payload.as_slice()).collect();
    assert_eq!(payloads, [&b"before"[..], &b"after"[..]]);

    // The publisher is not poisoned either: the next call publishes.
    let next = vec![message(&routed, "next")];
    assert_all_published(&publish(&*publisher, &next).await);
    assert_eq!(received(&*ns, &routed).await.len(), 3);
    teardown(ns).await;
}

/// Publish calls from several tasks over several publishers (relay processes) at once
/// all land, each message once.
pub async fn publisher_concurrent_calls_all_land(h: &dyn PublisherHarness) {
    let ns = namespace(h).await;
    let destination = ns.destination("concurrent");
    let mut publishers = Vec::new();
    for _ in 0..PUBLISHERS {
        publishers.push(publisher(&*ns).await);
    }
    let start = Arc::new(Barrier::new(TASKS));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let publisher = publishers[t % PUBLISHERS].clone();
        let (start, destination) = (start.clone(), destination.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let mut sent = Vec::new();
            for _ in 0..BATCHES_PER_TASK {
                let batch = numbered(&destination, BATCH);
                assert_all_published(&publish(&*publisher, &batch).await);
                sent.extend(batch);
            }
            sent
        }));
    }
    let mut sent = Vec::new();
    for task in tasks {
        sent.extend(task.await.expect("a publishing task panicked"));
    }
    let got = received(&*ns, &destination).await;
    assert_eq!(got.len(), TASKS * BATCHES_PER_TASK * BATCH);
    assert_eq!(dedup_ids(&got), ids_of(&sent));
    teardown(ns).await;
}

/// A batch of 1,000 messages gets 1,000 outcomes, all published, and the broker holds
/// each message once with its payload.
pub async fn publisher_large_batch(h: &dyn PublisherHarness) {
    let ns = namespace(h).await;
    let publisher = publisher(&*ns).await;
    let destination = ns.destination("large");
    let batch = numbered(&destination, LARGE);
    assert_all_published(&publish(&*publisher, &batch).await);
    let got = received(&*ns, &destination).await;
    assert_eq!(got.len(), LARGE);
    assert_eq!(dedup_ids(&got), ids_of(&batch));
    let mut payloads: Vec<Vec<u8>> = got.into_iter().map(|r| r.payload).collect();
    let mut sent: Vec<Vec<u8>> = batch.iter().map(|m| m.payload.clone()).collect();
    payloads.sort();
    sent.sort();
    assert_eq!(payloads, sent, "payloads changed on the way");
    teardown(ns).await;
}

/// A broker that stops while a relay publishes batch after batch (once a batch landed)
/// and starts again: every call returns (no hang, no `Err`) with every
/// message `Published` or `Retryable`, never `Permanent`, and some are `Retryable`; a
/// call while the broker is down is `Retryable` for every message; once the broker is
/// back, the same publisher (a relay does not rebuild it) publishes everything that was
/// retryable, and the broker holds every message, once where it drops repeats within a
/// window.
pub async fn publisher_broker_restart_is_retryable_and_the_publisher_recovers(
    h: &dyn PublisherHarness,
) {
    require(h.features(SEALED).broker_restart, "broker_restart");
    let ns = within("starting a private broker", h.restartable_namespace())
        .await
        .unwrap_or_else(|e| panic!("harness could not start a private broker: {}", e.report()));
    let publisher = publisher(&*ns).await;
    let destination = ns.destination("restart");
    let warm = numbered(&destination, BATCH);
    assert_all_published(&publish(&*publisher, &warm).await);

    // A relay publishing batch after batch when the broker dies: stop it once a call
    // came back all published (the broker holds part of the stream). The loop ends
    // with the first call that is not all published, which the stop makes happen.
    // Progress is the loop's own: reading the broker while it publishes could chase a
    // queue that never empties.
    let landed = Arc::new(AtomicUsize::new(0));
    let relay = tokio::spawn({
        let (publisher, landed, destination) = (
            Arc::clone(&publisher),
            Arc::clone(&landed),
            destination.clone(),
        );
        async move {
            let mut sent = Vec::new();
            // Bounded by the `within` that awaits this task below: the broker's stop
            // must end it with a call that is not all published.
            loop {
                let batch = numbered(&destination, RESTART_BATCH);
                let outcomes = publisher.publish(&batch).await;
                let all_published = outcomes
                    .as_ref()
                    .is_ok_and(|outcomes| outcomes.iter().all(|o| *o == PublishOutcome::Published));
                sent.push((batch, outcomes));
                if !all_published {
                    return sent;
                }
                landed.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    wait_until("a batch of the stream to land", || {
        let landed = landed.load(Ordering::SeqCst) > 0;
        async move { landed }
    })
    .await;
    within("stopping the private broker", ns.stop_broker())
        .await
        .unwrap_or_else(|e| panic!("could not stop the private broker: {}", e.report()));
    let calls = within("the publish calls the broker stopped under", relay)
        .await
        .expect("the publishing task panicked");
    let (mut in_flight, mut pending) = (Vec::new(), Vec::new());
    for (batch, outcomes) in calls {
        let outcomes = outcomes
            .unwrap_or_else(|e| panic!("a restart must give outcomes, not Err: {}", e.report()));
        assert_eq!(outcomes.len(), batch.len(), "one outcome per message");
        for (message, outcome) in batch.into_iter().zip(outcomes) {
            match outcome {
                PublishOutcome::Published => {}
                PublishOutcome::Retryable(_) => pending.push(message.clone()),
                PublishOutcome::Permanent(reason) => {
                    panic!("a broker restart must never be Permanent, got {reason:?}")
                }
            }
            in_flight.push(message);
        }
    }
    assert!(
        !pending.is_empty(),
        "the calls running when the broker stopped must leave something Retryable"
    );
    eprintln!(
        "broker restart: {} of {} messages published around the stop were retryable",
        pending.len(),
        in_flight.len()
    );

    let during = numbered(&destination, BATCH);
    for (i, outcome) in publish(&*publisher, &during).await.iter().enumerate() {
        assert!(
            matches!(outcome, PublishOutcome::Retryable(reason) if !reason.is_empty()),
            "message {i} published while the broker was down must be Retryable with a \
             reason, got {outcome:?}"
        );
    }
    pending.extend(during.iter().cloned());

    within("starting the private broker", ns.start_broker())
        .await
        .unwrap_or_else(|e| panic!("could not start the private broker: {}", e.report()));
    within(
        "the same publisher publishing what the restart left",
        async {
            let mut pause = outbox_core::backend::Backoff::new(
                Duration::from_millis(10),
                Duration::from_millis(500),
            );
            // Bounded by the enclosing `within`.
            while !pending.is_empty() {
                let outcomes = publish(&*publisher, &pending).await;
                let mut still = Vec::new();
                for (message, outcome) in pending.drain(..).zip(outcomes) {
                    match outcome {
                        PublishOutcome::Published => {}
                        PublishOutcome::Retryable(_) => still.push(message),
                        PublishOutcome::Permanent(reason) => {
                            panic!("after the restart a message was Permanent: {reason:?}")
                        }
                    }
                }
                pending = still;
                if !pending.is_empty() {
                    pause.wait().await;
                }
            }
        },
    )
    .await;

    let mut sent = ids_of(&warm);
    sent.extend(ids_of(&in_flight));
    sent.extend(ids_of(&during));
    let got = received(&*ns, &destination).await;
    if h.features(SEALED).dedup_window {
        assert_eq!(
            dedup_ids(&got),
            sent,
            "the broker must hold every message once"
        );
    } else {
        let held: HashSet<String> = got.iter().filter_map(|r| r.dedup_id.clone()).collect();
        assert_eq!(
            held, sent,
            "the broker must hold every message, and nothing else"
        );
    }
    teardown(ns).await;
}
