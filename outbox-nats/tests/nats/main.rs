//! What only NATS can get wrong: the server's max payload, subjects, ack timeouts,
//! connection errors. Against the live server named by `OUTBOX_NATS_URL`.
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-nats --test nats`

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

use std::time::{Duration, SystemTime};

use futures::StreamExt;
use outbox_core::backend::MessageParts;
use outbox_core::{ErrorKind, Headers, Message, MessageId, PublishOutcome, Publisher};
use outbox_nats::{NatsPublisher, NatsPublisherConfig};
use outbox_testkit::within;

fn message(destination: &str, payload: Vec<u8>) -> Message {
    Message::from(MessageParts {
        id: MessageId::new(),
        destination: destination.to_owned(),
        partition_key: None,
        payload,
        content_type: None,
        headers: Headers::new(),
        created_at: SystemTime::now(),
        attempts: 1,
        last_error: None,
    })
}

/// A `nats_test!` fixture: a stream of its own and a publisher prefixed with its name.
async fn setup(
    what: &str,
    config: impl Fn(NatsPublisherConfig) -> NatsPublisherConfig,
) -> Option<(
    outbox_nats::async_nats::jetstream::Context,
    String,
    NatsPublisher,
)> {
    let url = common::url(what)?;
    let js = common::jetstream(&url).await;
    let name = common::unique_name();
    common::create_stream(&js, &name, "ok").await;
    let publisher = NatsPublisher::connect(config(
        NatsPublisherConfig::new(&url).with_subject_prefix(&name),
    ))
    .await
    .expect("connect");
    Some((js, name, publisher))
}

async fn publish(publisher: &NatsPublisher, batch: &[Message]) -> Vec<PublishOutcome> {
    let outcomes = within("publish", publisher.publish(batch))
        .await
        .expect("publish never fails as a whole");
    assert_eq!(outcomes.len(), batch.len());
    outcomes
}

nats_test! {
    async fn a_message_over_the_servers_max_payload_is_permanent_alone(
        (js, name, publisher) = setup("outbox-nats max payload", |c| c)
    ) {
        let max = publisher.client().server_info().max_payload;
        let batch = [
            message("ok.a", b"small".to_vec()),
            message("ok.a", vec![7; max + 1]),
            message("ok.a", b"small too".to_vec()),
        ];
        let outcomes = publish(&publisher, &batch).await;
        assert_eq!(outcomes[0], PublishOutcome::Published);
        match &outcomes[1] {
            PublishOutcome::Permanent(reason) => {
                assert!(reason.contains("max_payload"), "{reason}")
            }
            other => panic!("an oversize message must be Permanent, got {other:?}"),
        }
        assert_eq!(outcomes[2], PublishOutcome::Published);
        let held = common::read_back(&js, &name, &format!("{name}.ok.a"))
            .await
            .unwrap();
        assert_eq!(held.len(), 2);
        js.delete_stream(&name).await.unwrap();
    }

    async fn a_destination_that_is_no_subject_is_permanent_alone(
        (js, name, publisher) = setup("outbox-nats subjects", |c| c)
    ) {
        let batch = [
            message("ok.a", Vec::new()),
            message("ok.has space", Vec::new()),
            message("ok.*", Vec::new()),
            message("ok..a", Vec::new()),
            message("ok.b", Vec::new()),
        ];
        let outcomes = publish(&publisher, &batch).await;
        assert_eq!(outcomes[0], PublishOutcome::Published);
        for outcome in &outcomes[1..4] {
            assert!(
                matches!(outcome, PublishOutcome::Permanent(r) if r.contains("NATS subject")),
                "{outcome:?}"
            );
        }
        assert_eq!(outcomes[4], PublishOutcome::Published);
        js.delete_stream(&name).await.unwrap();
    }

    /// A core subscriber that never answers stands in for a JetStream that took the
    /// message but whose ack never comes: the message is retryable, the publisher goes on.
    async fn a_missing_ack_is_retryable_and_the_publisher_goes_on(
        (js, name, publisher) = setup("outbox-nats ack timeout", |c| {
            c.with_ack_timeout(Duration::from_millis(300))
        })
    ) {
        let silent_subject = format!("{name}.silent.x");
        let mut silent = publisher
            .client()
            .subscribe(silent_subject.clone())
            .await
            .unwrap();
        publisher.client().flush().await.unwrap();

        let batch = [
            message("silent.x", b"lost ack".to_vec()),
            message("ok.a", b"fine".to_vec()),
        ];
        let outcomes = publish(&publisher, &batch).await;
        match &outcomes[0] {
            PublishOutcome::Retryable(reason) => assert!(reason.contains("PubAck"), "{reason}"),
            other => panic!("a missing ack must be Retryable, got {other:?}"),
        }
        assert_eq!(outcomes[1], PublishOutcome::Published);
        let seen = within("the silent subscriber's copy", silent.next())
            .await
            .unwrap();
        assert_eq!(&seen.payload[..], b"lost ack");

        let again = publish(&publisher, &[message("ok.a", b"next".to_vec())]).await;
        assert_eq!(again, [PublishOutcome::Published]);
        js.delete_stream(&name).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_reports_what_to_do_next() {
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let refused = NatsPublisher::connect(
        NatsPublisherConfig::new("nats://127.0.0.1:1").with_connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    assert_eq!(
        refused.kind(),
        ErrorKind::Unavailable,
        "{}",
        refused.report()
    );
    assert!(refused.is_retryable());

    let invalid =
        NatsPublisher::connect(NatsPublisherConfig::new("nats://h").with_max_in_flight(0))
            .await
            .unwrap_err();
    assert_eq!(invalid.kind(), ErrorKind::Config);
}

nats_test! {
    async fn a_publisher_over_an_existing_client_publishes(
        url = common::service_url("outbox-nats from_client")
    ) {
        let js = common::jetstream(&url).await;
        let name = common::unique_name();
        common::create_stream(&js, &name, "ok").await;
        let publisher = NatsPublisher::from_client(
            js.client(),
            NatsPublisherConfig::new("ignored").with_subject_prefix(&name),
        )
        .unwrap();
        let m = message("ok.a", b"x".to_vec());
        assert_eq!(
            publish(&publisher, std::slice::from_ref(&m)).await,
            [PublishOutcome::Published]
        );
        // The same id again: JetStream acks it as a duplicate, which counts as published.
        assert_eq!(publish(&publisher, &[m]).await, [PublishOutcome::Published]);
        let held = common::read_back(&js, &name, &format!("{name}.ok.a"))
            .await
            .unwrap();
        assert_eq!(held.len(), 1);
        js.delete_stream(&name).await.unwrap();
    }
}
