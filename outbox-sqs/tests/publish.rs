//! What the publisher suite does not cover, against the SQS endpoint named by
//! `OUTBOX_SQS_URL` (moto; skipped with a visible line when it is unset): the size
//! check, requests split by size, a key's order on FIFO queues across requests, keys
//! that cannot be groups, a queue deleted and created again, the single-queue routing,
//! an unreachable endpoint.
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-sqs --test publish`

mod common;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use outbox_core::backend::MessageParts;
use outbox_core::{Headers, Message, MessageId, PublishOutcome, Publisher};
use outbox_sqs::aws_sdk_sqs::Client;
use outbox_sqs::{SqsPublisher, SqsPublisherConfig, FIFO_SUFFIX};
use outbox_testkit::wait::within;

fn message(destination: &str, key: Option<&str>, payload: impl Into<Vec<u8>>) -> Message {
    Message::from(MessageParts {
        id: MessageId::new(),
        destination: destination.to_owned(),
        partition_key: key.map(str::to_owned),
        payload: payload.into(),
        content_type: None,
        headers: Headers::new(),
        created_at: SystemTime::now(),
        attempts: 1,
        last_error: None,
    })
}

/// Fresh queues `<prefix><name>` (FIFO when `fifo`), a client, and their URLs.
struct Queues {
    client: Client,
    url: String,
    prefix: String,
    fifo: bool,
    urls: HashMap<String, String>,
}

impl Queues {
    async fn new(what: &str, fifo: bool, names: &[&str]) -> Option<Queues> {
        let url = common::url(what)?;
        let client = common::client(&url);
        let prefix = common::unique_prefix();
        let mut urls = HashMap::new();
        for name in names {
            let queue = format!("{prefix}{name}{}", if fifo { FIFO_SUFFIX } else { "" });
            let queue_url = common::create_queue(&client, &queue)
                .await
                .expect("create a test queue");
            urls.insert((*name).to_owned(), queue_url);
        }
        Some(Queues {
            client,
            url,
            prefix,
            fifo,
            urls,
        })
    }

    fn config(&self) -> SqsPublisherConfig {
        SqsPublisherConfig::new()
            .with_queue_prefix(&self.prefix)
            .with_queue_suffix(if self.fifo { FIFO_SUFFIX } else { "" })
    }

    fn publisher(&self, config: SqsPublisherConfig) -> SqsPublisher {
        SqsPublisher::from_conf(common::sdk_config(&self.url), config).expect("a valid config")
    }

    /// Everything in queue `name`, received and deleted, with the destination a
    /// single-queue publisher sent.
    async fn drain(&self, name: &str) -> Vec<(outbox_testkit::Received, Option<String>)> {
        within(
            "reading the queue back",
            common::drain(&self.client, &self.urls[name]),
        )
        .await
        .expect("drain a test queue")
    }

    async fn teardown(self) {
        for url in self.urls.values() {
            let _ = self.client.delete_queue().queue_url(url).send().await;
        }
    }
}

async fn publish(publisher: &SqsPublisher, batch: &[Message]) -> Vec<PublishOutcome> {
    let outcomes = within("a publish call", publisher.publish(batch))
        .await
        .expect("publish never returns Err");
    assert_eq!(outcomes.len(), batch.len());
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(outbox_service_unset, ignore = "OUTBOX_SQS_URL is not set")]
async fn a_message_over_the_limit_is_permanent_naming_its_size_and_the_limit() {
    let Some(queues) = Queues::new("outbox-sqs size check", false, &["sized"]).await else {
        return;
    };
    let publisher = queues.publisher(queues.config());
    // The body alone is the limit; the attributes push it over.
    let batch = vec![
        message("sized", None, "before"),
        message("sized", None, vec![b'x'; 256 * 1024]),
        message("sized", None, "after"),
    ];
    let outcomes = publish(&publisher, &batch).await;
    assert_eq!(outcomes[0], PublishOutcome::Published);
    assert_eq!(outcomes[2], PublishOutcome::Published);
    match &outcomes[1] {
        PublishOutcome::Permanent(reason) => {
            assert!(
                reason.contains("262144 bytes") && reason.contains(&batch[1].id.to_string()),
                "the reason names the limit and the message: {reason}"
            );
            let size = 256 * 1024 + outbox_sqs::MESSAGE_ID_ATTRIBUTE.len() + "String".len() + 36;
            assert!(reason.contains(&format!("is {size} bytes")), "{reason}");
        }
        other => panic!("an oversize message must be Permanent, got {other:?}"),
    }
    let got: Vec<Vec<u8>> = queues
        .drain("sized")
        .await
        .into_iter()
        .map(|(r, _)| r.payload)
        .collect();
    assert_eq!(got, [b"before".to_vec(), b"after".to_vec()]);
    queues.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(outbox_service_unset, ignore = "OUTBOX_SQS_URL is not set")]
async fn large_messages_are_split_into_requests_by_size_and_all_land() {
    let Some(queues) = Queues::new("outbox-sqs request size", false, &["big"]).await else {
        return;
    };
    let publisher = queues.publisher(queues.config());
    // Twelve messages of 100 KiB: two per request, six requests.
    let batch: Vec<Message> = (0..12u8)
        .map(|i| message("big", None, vec![b'a' + i; 100 * 1024]))
        .collect();
    for (i, outcome) in publish(&publisher, &batch).await.iter().enumerate() {
        assert_eq!(*outcome, PublishOutcome::Published, "message {i}");
    }
    let mut got: Vec<Vec<u8>> = queues
        .drain("big")
        .await
        .into_iter()
        .map(|(r, _)| r.payload)
        .collect();
    got.sort();
    let mut sent: Vec<Vec<u8>> = batch.iter().map(|m| m.payload.clone()).collect();
    sent.sort();
    assert_eq!(got, sent);
    queues.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(outbox_service_unset, ignore = "OUTBOX_SQS_URL is not set")]
async fn a_fifo_queue_keeps_each_keys_order_across_requests() {
    let Some(queues) = Queues::new("outbox-sqs FIFO order", true, &["ordered"]).await else {
        return;
    };
    let publisher = queues.publisher(queues.config());
    // 45 messages over keys a, b, c and none: several requests, each key in all.
    let keys = [Some("a"), Some("b"), None, Some("c"), Some("a")];
    let batch: Vec<Message> = (0..45)
        .map(|i| message("ordered", keys[i % keys.len()], format!("{i}")))
        .collect();
    for outcome in publish(&publisher, &batch).await {
        assert_eq!(outcome, PublishOutcome::Published);
    }
    let got = queues.drain("ordered").await;
    assert_eq!(got.len(), batch.len());
    for key in ["a", "b", "c"] {
        let sent: Vec<&[u8]> = batch
            .iter()
            .filter(|m| m.partition_key.as_deref() == Some(key))
            .map(|m| m.payload.as_slice())
            .collect();
        let received: Vec<&[u8]> = got
            .iter()
            .filter(|(r, _)| r.partition_key.as_deref() == Some(key))
            .map(|(r, _)| r.payload.as_slice())
            .collect();
        assert_eq!(received, sent, "key {key} arrived out of order");
    }
    queues.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(outbox_service_unset, ignore = "OUTBOX_SQS_URL is not set")]
async fn a_key_that_cannot_be_a_fifo_group_is_permanent_alone() {
    let Some(queues) = Queues::new("outbox-sqs FIFO groups", true, &["groups"]).await else {
        return;
    };
    let publisher = queues.publisher(queues.config());
    let batch = vec![
        message("groups", Some("ok-1"), "first"),
        message("groups", Some("has a space"), "refused"),
        message("groups", Some(&"k".repeat(129)), "refused too"),
        message("groups", Some("ok-2"), "last"),
    ];
    let outcomes = publish(&publisher, &batch).await;
    assert_eq!(outcomes[0], PublishOutcome::Published);
    assert_eq!(outcomes[3], PublishOutcome::Published);
    for outcome in &outcomes[1..3] {
        assert!(
            matches!(outcome, PublishOutcome::Permanent(reason) if reason.contains("MessageGroupId")),
            "{outcome:?}"
        );
    }
    assert_eq!(queues.drain("groups").await.len(), 2);
    queues.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(outbox_service_unset, ignore = "OUTBOX_SQS_URL is not set")]
async fn a_deleted_queue_is_permanent_and_found_again_once_created() {
    let Some(queues) = Queues::new("outbox-sqs queue cache", false, &["gone"]).await else {
        return;
    };
    let publisher = queues.publisher(queues.config());
    let one = || vec![message("gone", None, "x")];
    assert_eq!(
        publish(&publisher, &one()).await,
        [PublishOutcome::Published]
    );
    queues
        .client
        .delete_queue()
        .queue_url(&queues.urls["gone"])
        .send()
        .await
        .expect("delete the queue");
    // The cached URL no longer names a queue.
    let outcomes = publish(&publisher, &one()).await;
    assert!(
        matches!(&outcomes[0], PublishOutcome::Permanent(reason) if reason.contains("does not exist")),
        "{outcomes:?}"
    );
    common::create_queue(&queues.client, &format!("{}gone", queues.prefix))
        .await
        .expect("create the queue again");
    assert_eq!(
        publish(&publisher, &one()).await,
        [PublishOutcome::Published]
    );
    assert_eq!(queues.drain("gone").await.len(), 1);
    queues.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(outbox_service_unset, ignore = "OUTBOX_SQS_URL is not set")]
async fn a_single_queue_carries_every_destination() {
    let Some(queues) = Queues::new("outbox-sqs single queue", false, &["all"]).await else {
        return;
    };
    let config = SqsPublisherConfig::new().with_single_queue(&queues.urls["all"]);
    let publisher = queues.publisher(config);
    let batch = vec![
        message("orders.created", None, "1"),
        message("payments/settled", Some("p-1"), "2"),
    ];
    for outcome in publish(&publisher, &batch).await {
        assert_eq!(outcome, PublishOutcome::Published);
    }
    let mut got: Vec<(Vec<u8>, Option<String>)> = queues
        .drain("all")
        .await
        .into_iter()
        .map(|(r, destination)| (r.payload, destination))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (b"1".to_vec(), Some("orders.created".to_owned())),
            (b"2".to_vec(), Some("payments/settled".to_owned())),
        ]
    );
    queues.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_makes_every_message_retryable() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let publisher = SqsPublisher::from_conf(
        common::sdk_config(&format!("http://127.0.0.1:{port}")),
        SqsPublisherConfig::new().with_request_timeout(Duration::from_secs(2)),
    )
    .expect("a valid config");
    let batch = vec![message("a", None, "1"), message("b", None, "2")];
    for outcome in publish(&publisher, &batch).await {
        assert!(
            matches!(&outcome, PublishOutcome::Retryable(reason) if !reason.is_empty()),
            "{outcome:?}"
        );
    }
}
