//! What the publisher suite does not cover, against the SQS endpoint named by
//! `OUTBOX_SQS_URL` (moto; skipped with a visible line when it is unset): the size
//! check, requests split by size (counted by an SDK interceptor), a request refused
//! for one entry, a key's order on FIFO queues across requests, keys that cannot be
//! groups, a queue deleted and created again (its URL looked up again), the
//! single-queue routing, an unreachable endpoint.
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-sqs --test publish`

#[macro_use]
mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use outbox_core::backend::MessageParts;
use outbox_core::{Headers, Message, MessageId, PublishOutcome, Publisher};
use outbox_sqs::aws_sdk_sqs::config::interceptors::BeforeTransmitInterceptorContextMut;
use outbox_sqs::aws_sdk_sqs::config::{ConfigBag, Intercept, RuntimeComponents};
use outbox_sqs::aws_sdk_sqs::error::BoxError;
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

/// An SDK interceptor that records what a publisher sends: each request's operation
/// and each `SendMessageBatch`'s entry count. An entry carrying the message attribute
/// `poison` gets a data type moto refuses, so moto refuses the whole request
/// (`InvalidParameterValue`), as SQS may for one entry's content.
#[derive(Debug, Clone, Default)]
struct Wiretap {
    operations: Arc<Mutex<Vec<String>>>,
    batches: Arc<Mutex<Vec<usize>>>,
}

impl Wiretap {
    fn operations(&self) -> Vec<String> {
        self.operations.lock().unwrap().clone()
    }

    fn batches(&self) -> Vec<usize> {
        self.batches.lock().unwrap().clone()
    }
}

impl Intercept for Wiretap {
    fn name(&self) -> &'static str {
        "Wiretap"
    }

    fn modify_before_transmit(
        &self,
        ctx: &mut BeforeTransmitInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = ctx.request_mut();
        let operation = request.headers().get("x-amz-target").unwrap_or_default();
        let operation = operation.trim_start_matches("AmazonSQS.").to_owned();
        self.operations.lock().unwrap().push(operation.clone());
        if operation != "SendMessageBatch" {
            return Ok(());
        }
        let body = request.body().bytes().ok_or("a streaming body")?;
        let mut json: serde_json::Value = serde_json::from_slice(body)?;
        let entries = json["Entries"].as_array_mut().ok_or("no Entries")?;
        self.batches.lock().unwrap().push(entries.len());
        let mut poisoned = false;
        for entry in entries {
            if let Some(data_type) = entry.pointer_mut("/MessageAttributes/poison/DataType") {
                *data_type = "Bogus".into();
                poisoned = true;
            }
        }
        if poisoned {
            let body = serde_json::to_vec(&json)?;
            request
                .headers_mut()
                .insert("content-length", body.len().to_string());
            *request.body_mut() = body.into();
        }
        Ok(())
    }
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

    /// A publisher whose requests `wiretap` records (and poisons).
    fn tapped(&self, config: SqsPublisherConfig, wiretap: &Wiretap) -> SqsPublisher {
        let conf = common::sdk_config(&self.url)
            .to_builder()
            .interceptor(wiretap.clone())
            .build();
        SqsPublisher::from_conf(conf, config).expect("a valid config")
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

sqs_test! {
    async fn a_message_over_the_limit_is_permanent_naming_its_size_and_the_limit(
        queues = Queues::new("outbox-sqs size check", false, &["sized"])
    ) {
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
                let size =
                    256 * 1024 + outbox_sqs::MESSAGE_ID_ATTRIBUTE.len() + "String".len() + 36;
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

    async fn large_messages_are_split_into_requests_by_size_and_all_land(
        queues = Queues::new("outbox-sqs request size", false, &["big"])
    ) {
        let wiretap = Wiretap::default();
        let publisher = queues.tapped(queues.config(), &wiretap);
        // Twelve messages of 100 KiB: two per request, six requests. (moto would take
        // them in fewer: it sums bodies against 1 MiB, so the count is the proof.)
        let batch: Vec<Message> = (0..12u8)
            .map(|i| message("big", None, vec![b'a' + i; 100 * 1024]))
            .collect();
        for (i, outcome) in publish(&publisher, &batch).await.iter().enumerate() {
            assert_eq!(*outcome, PublishOutcome::Published, "message {i}");
        }
        assert_eq!(wiretap.batches(), [2; 6], "entries per SendMessageBatch");
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

    async fn a_fifo_queue_keeps_each_keys_order_across_requests(
        queues = Queues::new("outbox-sqs FIFO order", true, &["ordered"])
    ) {
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

    async fn a_key_that_cannot_be_a_fifo_group_is_permanent_alone(
        queues = Queues::new("outbox-sqs FIFO groups", true, &["groups"])
    ) {
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

    async fn a_deleted_queue_is_permanent_and_found_again_once_created(
        queues = Queues::new("outbox-sqs queue cache", false, &["gone"])
    ) {
        let wiretap = Wiretap::default();
        let publisher = queues.tapped(queues.config(), &wiretap);
        let one = || vec![message("gone", None, "x")];
        assert_eq!(
            publish(&publisher, &one()).await,
            [PublishOutcome::Published]
        );
        assert_eq!(wiretap.operations(), ["GetQueueUrl", "SendMessageBatch"]);
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
        // moto gives the new queue the old URL, so the publish above would pass with the
        // stale cache too; what shows the cache was dropped is the second lookup (SQS
        // may give a queue created again a URL of its own).
        assert_eq!(
            wiretap.operations(),
            [
                "GetQueueUrl",
                "SendMessageBatch",
                "SendMessageBatch",
                "GetQueueUrl",
                "SendMessageBatch"
            ]
        );
        assert_eq!(queues.drain("gone").await.len(), 1);
        queues.teardown().await;
    }

    async fn a_request_refused_for_one_entry_fails_only_that_entry(
        queues = Queues::new("outbox-sqs per-entry isolation", false, &["iso"])
    ) {
        let wiretap = Wiretap::default();
        let publisher = queues.tapped(queues.config(), &wiretap);
        let mut batch: Vec<Message> = (0..4)
            .map(|i| message("iso", None, format!("{i}")))
            .collect();
        batch[2].headers.insert("poison", "1");
        let outcomes = publish(&publisher, &batch).await;
        for (i, outcome) in outcomes.iter().enumerate() {
            if i == 2 {
                assert!(
                    matches!(outcome, PublishOutcome::Permanent(r) if r.contains("InvalidParameterValue")),
                    "{outcome:?}"
                );
            } else {
                assert_eq!(*outcome, PublishOutcome::Published, "message {i}");
            }
        }
        assert_eq!(
            wiretap.batches(),
            [4, 1, 1, 1, 1],
            "the refused request, then each entry alone"
        );
        let mut got: Vec<Vec<u8>> = queues
            .drain("iso")
            .await
            .into_iter()
            .map(|(r, _)| r.payload)
            .collect();
        got.sort();
        assert_eq!(got, [b"0".to_vec(), b"1".to_vec(), b"3".to_vec()]);
        queues.teardown().await;
    }

    async fn a_single_queue_carries_every_destination(
        queues = Queues::new("outbox-sqs single queue", false, &["all"])
    ) {
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
