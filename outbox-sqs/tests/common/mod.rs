//! Shared helpers for the integration tests: the endpoint URL, clients, isolated
//! queues, reading back, and the publisher harness.

#![allow(dead_code, unreachable_pub)]

pub mod private;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use outbox_core::{Error, ErrorKind, Publisher, Result};
use outbox_sqs::aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use outbox_sqs::aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
};
use outbox_sqs::aws_sdk_sqs::{self, Client};
use outbox_sqs::{SqsPublisher, SqsPublisherConfig, FIFO_SUFFIX};
use outbox_testkit::{PublisherHarness, PublisherNamespace, Received, RestartableNamespace};
use private::PrivateMoto;
use tokio::sync::OnceCell;

/// The variable naming the SQS endpoint.
pub const URL_VAR: &str = "OUTBOX_SQS_URL";
/// The region and static credentials the local endpoint is given (moto checks
/// neither; the SDK needs both to sign).
pub const REGION: &str = "us-east-1";
/// How long test queues are kept before a later run deletes them.
const QUEUE_TTL_SECS: u64 = 3600;
/// What every test queue's name starts with.
const QUEUE_PREFIX: &str = "obx-";

/// The endpoint URL, or `None` (after a visible skip line) when it is not set.
pub fn url(what: &str) -> Option<String> {
    outbox_testkit::service_url(URL_VAR, what)
}

/// `service_test!` for the tests that need the endpoint, on a runtime of two workers:
/// ignored, with this reason, when `OUTBOX_SQS_URL` was not set at build time. Each
/// test awaits its fixture first (a future of `Option`: `None` skips it).
#[allow(unused_macros)]
macro_rules! sqs_test {
    ($($tests:tt)*) => {
        outbox_testkit::service_test! {
            ignore = "OUTBOX_SQS_URL is not set";
            flavor = multi_thread(2);
            $($tests)*
        }
    };
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// A fresh queue-name prefix, `obx-<unix seconds>-<random>-`, so stale queues can be
/// deleted.
pub fn unique_prefix() -> String {
    format!(
        "{QUEUE_PREFIX}{}-{:012x}-",
        now_secs(),
        fastrand::u64(..1 << 48)
    )
}

pub fn plumbing(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::new(ErrorKind::Unavailable, format!("test plumbing: {what}")).with_source(e)
}

/// The SDK config for the endpoint at `url`: region and static credentials set.
pub fn sdk_config(url: &str) -> aws_sdk_sqs::Config {
    aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(url)
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new("outbox", "outbox", None, None, "tests"))
        .build()
}

/// A client of the endpoint at `url`.
pub fn client(url: &str) -> Client {
    Client::from_conf(sdk_config(url))
}

/// Create the queue `name` (FIFO when it ends in `.fifo`, without content-based
/// dedup) and return its URL.
pub async fn create_queue(client: &Client, name: &str) -> Result<String> {
    let mut request = client.create_queue().queue_name(name);
    if name.ends_with(FIFO_SUFFIX) {
        request = request
            .attributes(QueueAttributeName::FifoQueue, "true")
            .attributes(QueueAttributeName::ContentBasedDeduplication, "false");
    }
    let output = request
        .send()
        .await
        .map_err(|e| plumbing("create a test queue", e))?;
    Ok(output.queue_url().unwrap_or_default().to_owned())
}

/// [`create_queue`] from synchronous code (the harness's `destination`), on a thread
/// and runtime of its own.
fn create_queue_blocking(url: &str, name: &str) -> Result<String> {
    let (url, name) = (url.to_owned(), name.to_owned());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| plumbing("a runtime to create a queue", e))?;
        runtime.block_on(async { create_queue(&client(&url), &name).await })
    })
    .join()
    .expect("the queue-creating thread panicked")
}

/// Delete test queues older than an hour (left by failed cases), once per test binary.
async fn delete_stale_queues(client: &Client) {
    static ONCE: OnceCell<()> = OnceCell::const_new();
    ONCE.get_or_init(|| async {
        let Ok(listed) = client
            .list_queues()
            .queue_name_prefix(QUEUE_PREFIX)
            .max_results(1000)
            .send()
            .await
        else {
            return;
        };
        let cutoff = now_secs().saturating_sub(QUEUE_TTL_SECS);
        for url in listed.queue_urls() {
            let name = url.rsplit('/').next().unwrap_or_default();
            let secs = name
                .strip_prefix(QUEUE_PREFIX)
                .and_then(|rest| rest.split('-').next())
                .and_then(|secs| secs.parse::<u64>().ok());
            if secs.is_some_and(|secs| secs < cutoff) {
                let _ = client.delete_queue().queue_url(url).send().await;
            }
        }
    })
    .await;
}

/// Receive and delete everything in the queue at `queue_url`, in the order SQS hands it
/// out, decoded back (with the destination a single-queue publisher sent).
pub async fn drain(client: &Client, queue_url: &str) -> Result<Vec<(Received, Option<String>)>> {
    let mut out = Vec::new();
    loop {
        let round = drain_once(client, queue_url).await?;
        if round.is_empty() {
            return Ok(out);
        }
        out.extend(round);
    }
}

/// One `ReceiveMessage` of up to ten messages, decoded and deleted. For a FIFO queue the
/// dedup id is SQS's `MessageDeduplicationId` (checked against `outbox-message-id`);
/// for a standard queue, which has none, `outbox-message-id`.
pub async fn drain_once(
    client: &Client,
    queue_url: &str,
) -> Result<Vec<(Received, Option<String>)>> {
    let fifo = queue_url.ends_with(FIFO_SUFFIX);
    let got = client
        .receive_message()
        .queue_url(queue_url)
        .max_number_of_messages(10)
        .wait_time_seconds(0)
        .visibility_timeout(60)
        .message_attribute_names("All")
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await
        .map_err(|e| plumbing("receive from a test queue", e))?;
    let messages = got.messages();
    let mut out = Vec::with_capacity(messages.len());
    if messages.is_empty() {
        return Ok(out);
    }
    for m in messages {
        let delivery = outbox_sqs::decode(m)
            .unwrap_or_else(|e| panic!("a received message does not decode: {}", e.report()));
        let system = |name| {
            m.attributes()
                .and_then(|a| a.get(&name))
                .map(String::to_owned)
        };
        let dedup = if fifo {
            let dedup = system(MessageSystemAttributeName::MessageDeduplicationId);
            assert_eq!(
                dedup.as_deref(),
                Some(delivery.id.to_string().as_str()),
                "MessageDeduplicationId is the message id"
            );
            let group = system(MessageSystemAttributeName::MessageGroupId);
            let expected = delivery
                .partition_key
                .clone()
                .unwrap_or_else(|| delivery.id.to_string());
            assert_eq!(group.as_deref(), Some(expected.as_str()), "MessageGroupId");
            dedup
        } else {
            Some(delivery.id.to_string())
        };
        out.push((
            Received::new(delivery.payload)
                .with_dedup_id(dedup)
                .with_content_type(delivery.content_type)
                .with_partition_key(delivery.partition_key)
                .with_headers(delivery.headers),
            delivery.destination,
        ));
    }
    let mut delete = client.delete_message_batch().queue_url(queue_url);
    for (i, m) in messages.iter().enumerate() {
        delete = delete.entries(
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(m.receipt_handle().unwrap_or_default())
                .build()
                .map_err(|e| plumbing("a delete entry", e))?,
        );
    }
    let deleted = delete
        .send()
        .await
        .map_err(|e| plumbing("delete received messages", e))?;
    assert!(
        deleted.failed().is_empty(),
        "deleting failed: {:?}",
        deleted.failed()
    );
    Ok(out)
}

/// What was drained so far, per destination, so a case may read more than once.
type Seen = Arc<tokio::sync::Mutex<HashMap<String, Vec<Received>>>>;

/// Runs the publisher suite against the SQS endpoint: a queue-name prefix per case,
/// standard queues or FIFO ones.
#[derive(Debug, Clone)]
pub struct SqsHarness {
    pub url: String,
    pub fifo: bool,
}

#[async_trait]
impl PublisherHarness for SqsHarness {
    async fn namespace(&self) -> Result<Box<dyn PublisherNamespace>> {
        Ok(Box::new(
            SqsNamespace::new(&self.url, self.fifo, None).await,
        ))
    }

    async fn restartable_namespace(&self) -> Result<Box<dyn RestartableNamespace>> {
        let server = PrivateMoto::start().await?;
        let url = server.url();
        Ok(Box::new(
            SqsNamespace::new(&url, self.fifo, Some(server)).await,
        ))
    }
}

/// The queues `<prefix><name>` (`.fifo` on FIFO) of one case, created when the suite
/// asks for a destination; `nowhere` is never created. Reading back receives and
/// deletes, and keeps what it read for the next read of the same destination.
#[derive(Debug)]
pub struct SqsNamespace {
    url: String,
    client: Client,
    prefix: String,
    fifo: bool,
    created: Mutex<HashSet<String>>,
    seen: Seen,
    server: Option<PrivateMoto>,
}

/// How long a publisher on a private server waits for one request: short, so a
/// request the server's death interrupts returns soon.
const PRIVATE_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

impl SqsNamespace {
    async fn new(url: &str, fifo: bool, server: Option<PrivateMoto>) -> Self {
        let client = client(url);
        delete_stale_queues(&client).await;
        SqsNamespace {
            url: url.to_owned(),
            client,
            prefix: unique_prefix(),
            fifo,
            created: Mutex::new(HashSet::new()),
            seen: Seen::default(),
            server,
        }
    }

    pub fn config(&self) -> SqsPublisherConfig {
        let config = SqsPublisherConfig::new()
            .with_queue_prefix(&self.prefix)
            .with_queue_suffix(if self.fifo { FIFO_SUFFIX } else { "" });
        match self.server {
            Some(_) => config.with_request_timeout(PRIVATE_REQUEST_TIMEOUT),
            None => config,
        }
    }

    fn queue_name(&self, destination: &str) -> String {
        let suffix = if self.fifo { FIFO_SUFFIX } else { "" };
        format!("{}{destination}{suffix}", self.prefix)
    }

    fn server(&self) -> Result<&PrivateMoto> {
        self.server
            .as_ref()
            .ok_or_else(|| Error::config("this namespace is on the shared endpoint"))
    }
}

#[async_trait]
impl RestartableNamespace for SqsNamespace {
    async fn stop_broker(&self) -> Result<()> {
        self.server()?.stop()
    }

    async fn start_broker(&self) -> Result<()> {
        self.server()?.start_again().await
    }
}

#[async_trait]
impl PublisherNamespace for SqsNamespace {
    async fn publisher(&self) -> Result<Arc<dyn Publisher>> {
        let publisher = SqsPublisher::from_conf(sdk_config(&self.url), self.config())?;
        Ok(Arc::new(publisher))
    }

    fn destination(&self, name: &str) -> String {
        let queue = self.queue_name(name);
        if self.created.lock().expect("created").insert(queue.clone()) {
            create_queue_blocking(&self.url, &queue)
                .unwrap_or_else(|e| panic!("creating queue {queue}: {}", e.report()));
        }
        name.to_owned()
    }

    fn unroutable_destination(&self) -> String {
        "nowhere".to_owned()
    }

    async fn received(&self, destination: &str) -> Result<Vec<Received>> {
        let url = self
            .client
            .get_queue_url()
            .queue_name(self.queue_name(destination))
            .send()
            .await
            .map_err(|e| plumbing("look up a test queue", e))?
            .queue_url()
            .unwrap_or_default()
            .to_owned();
        let mut seen = self.seen.lock().await;
        let held = seen.entry(destination.to_owned()).or_default();
        held.extend(drain(&self.client, &url).await?.into_iter().map(|(r, _)| r));
        Ok(held.clone())
    }

    async fn teardown(&self) -> Result<()> {
        let queues: Vec<String> = self
            .created
            .lock()
            .expect("created")
            .iter()
            .cloned()
            .collect();
        for queue in queues {
            let url = self
                .client
                .get_queue_url()
                .queue_name(&queue)
                .send()
                .await
                .map_err(|e| plumbing("look up a test queue", e))?;
            self.client
                .delete_queue()
                .queue_url(url.queue_url().unwrap_or_default())
                .send()
                .await
                .map_err(|e| plumbing("delete a test queue", e))?;
        }
        Ok(())
    }
}
