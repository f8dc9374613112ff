//! DynamoDB outbox -> relays -> an SQS FIFO queue -> consumers with the decoupled dedup
//! store (DynamoDB), on the services named by `OUTBOX_DYNAMODB_URL` (DynamoDB Local) and
//! `OUTBOX_SQS_URL` (moto); skipped with a visible line when either is unset.
//!
//! The story: a producer enqueues deposits to eight accounts (the partition key), in
//! transactions of ten, into a DynamoDB outbox with per-key order. A doomed relay claims
//! the first messages, publishes them and dies before completing them, so they are
//! published again once its lease lapses. Two relays publish everything through one
//! `SqsPublisher` each to `<prefix>ledger.fifo`. Two consumer workers receive, apply each
//! deposit to its account through `DecoupledConsumer` (entity store and dedup store on
//! DynamoDB), and delete; on the first delivery of every 20th deposit they make it
//! visible again instead (a lost delete), so SQS delivers it twice.
//!
//! Exactly-once effects: each account holds every deposit of its own once, in enqueue
//! order, and its balance is their sum, although the queue received some messages more
//! than once and the consumers saw every 20th twice.
//!
//! Run (DynamoDB Local is shared with other suites; serialise its users):
//! `eval "$(scripts/services.sh)" && flock /tmp/dynamo.lock cargo test -p outbox-e2e --test sqs -- --nocapture`

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outbox_core::consumer::{DecoupledConsumer, EntityStore, Handled};
use outbox_core::{
    store::ClaimRequest, ConsumerName, EntityKey, ErrorKind, KeyOrder, NewMessage, OutboxAdmin,
    OutboxStore, Publisher, Relay, RelayConfig, RetryPolicy,
};
use outbox_dynamodb::aws_sdk_dynamodb;
use outbox_dynamodb::{
    DynamoDedupConfig, DynamoDedupStore, DynamoEntityConfig, DynamoEntityStore, DynamoOutbox,
    DynamoOutboxConfig,
};
use outbox_sqs::aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use outbox_sqs::{SqsPublisher, SqsPublisherConfig};
use outbox_testkit::isolation;
use outbox_testkit::wait::within;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

/// Deposits the producer enqueues.
const MESSAGES: u64 = 300;
/// Accounts (partition keys, FIFO groups, consumer entities).
const ACCOUNTS: u64 = 8;
/// Messages per producer transaction.
const PER_TRANSACTION: usize = 10;
/// Messages the doomed relay asks to claim (it gets the head of each key), publishes
/// and never completes.
const DOOMED: usize = 30;
/// The doomed relay's lease: the others publish its messages again once it lapses.
const DOOMED_LEASE: Duration = Duration::from_secs(2);
/// On its first delivery, every deposit whose number is a multiple of this is made
/// visible again after being applied, instead of deleted.
const REDELIVER_EVERY: u64 = 20;
/// The deposits made visible again.
const REDELIVERIES: u64 = MESSAGES / REDELIVER_EVERY;
/// Consumer workers.
const WORKERS: usize = 2;
/// How long the whole story may take.
const STORY_DEADLINE: Duration = Duration::from_secs(240);

/// A consumer's account: the deposits applied, in order, and their sum.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct Account {
    deposits: Vec<u64>,
    balance: u64,
}

/// What the consumers did.
#[derive(Debug, Default)]
struct Tally {
    deliveries: AtomicU64,
    applied: AtomicU64,
    duplicates: AtomicU64,
    conflicts: AtomicU64,
    redeliveries_asked: AtomicU64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

fn dynamo_client(url: &str) -> aws_sdk_dynamodb::Client {
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(url)
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("outbox", "outbox", None, None, "e2e"))
            .build(),
    )
}

/// The SQS client's settings; `sdk_retries` off leaves every retry to the caller.
fn sqs_config(url: &str, sdk_retries: bool) -> outbox_sqs::aws_sdk_sqs::Config {
    use outbox_sqs::aws_sdk_sqs::config::retry::RetryConfig;
    use outbox_sqs::aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
    let retry = if sdk_retries {
        RetryConfig::standard()
    } else {
        RetryConfig::disabled()
    };
    outbox_sqs::aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(url)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("outbox", "outbox", None, None, "e2e"))
        .retry_config(retry)
        .build()
}

fn ok<T>(what: &str, result: outbox_core::Result<T>) -> T {
    result.unwrap_or_else(|e| panic!("{what}: {}", e.report()))
}

/// Poll `check` until it holds, backing off, failing after [`STORY_DEADLINE`] (the
/// testkit's 30 s is too short for DynamoDB Local and moto on two shared cores).
async fn wait_for<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    let mut pause =
        outbox_core::backend::Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
    while !check().await {
        assert!(
            start.elapsed() < STORY_DEADLINE,
            "timed out after {STORY_DEADLINE:?} waiting for {what}"
        );
        pause.wait().await;
    }
}

fn deposit(seq: u64) -> NewMessage {
    NewMessage::builder("ledger")
        .partition_key(format!("acct-{}", seq % ACCOUNTS))
        .content_type("application/json")
        .payload(serde_json::to_vec(&serde_json::json!({ "seq": seq })).expect("json"))
        .build()
        .expect("a valid message")
}

fn relay_config(name: &str) -> RelayConfig {
    RelayConfig::default()
        .with_name(name)
        .with_batch_size(25)
        .with_lease(Duration::from_secs(30))
        .with_publish_timeout(Duration::from_secs(15))
        .with_poll_interval(Duration::from_millis(20))
        .with_max_poll_interval(Duration::from_millis(250))
        .with_retry(
            RetryPolicy::new(10)
                .with_initial_delay(Duration::from_millis(20))
                .with_max_delay(Duration::from_millis(500)),
        )
        .with_shutdown_grace(Duration::from_secs(5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_deposit_is_applied_once_from_dynamodb_through_sqs_fifo() {
    const WHAT: &str = "outbox-e2e through Amazon SQS (FIFO)";
    let Some(dynamo_url) = outbox_testkit::service_url("OUTBOX_DYNAMODB_URL", WHAT) else {
        return;
    };
    let Some(sqs_url) = outbox_testkit::service_url("OUTBOX_SQS_URL", WHAT) else {
        return;
    };
    let started = Instant::now();
    let dynamo = dynamo_client(&dynamo_url);
    let name = isolation::unique_name();

    // The stores, each in a table of its own.
    let outbox = ok(
        "the outbox",
        DynamoOutbox::new(
            dynamo.clone(),
            DynamoOutboxConfig::default()
                .with_table(format!("{name}_outbox"))
                .with_shards(4)
                .with_ordering(KeyOrder::PerKey),
        ),
    );
    ok("install the outbox", outbox.install().await);
    let dedup = ok(
        "the dedup store",
        DynamoDedupStore::new(
            dynamo.clone(),
            DynamoDedupConfig::default()
                .with_table(format!("{name}_dedup"))
                .with_retention(Duration::from_secs(3600)),
        ),
    );
    ok("install the dedup store", dedup.install().await);
    let entities = ok(
        "the entity store",
        DynamoEntityStore::new(
            dynamo.clone(),
            DynamoEntityConfig::default().with_table(format!("{name}_entities")),
        ),
    );
    ok("install the entity store", entities.install().await);

    // The queue: FIFO, dedup on the MessageDeduplicationId the publisher sets.
    let sqs = outbox_sqs::aws_sdk_sqs::Client::from_conf(sqs_config(&sqs_url, true));
    let prefix = format!("obx-{}-{}-", now_secs(), fastrand::u32(..));
    let queue_url = sqs
        .create_queue()
        .queue_name(format!("{prefix}ledger.fifo"))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::ContentBasedDeduplication, "false")
        .send()
        .await
        .expect("create the queue")
        .queue_url()
        .expect("a queue URL")
        .to_owned();
    let publisher_config = SqsPublisherConfig::new()
        .with_queue_prefix(&prefix)
        .with_queue_suffix(".fifo");
    // The relays' SDK retries are off: a request the SDK sent again after moto took it
    // (a timeout under load) would be a second copy no relay counts. So every retry is
    // a relay's, counted in its report and in the duplicate bound below.
    let publisher = || -> Arc<dyn Publisher> {
        Arc::new(ok(
            "a publisher",
            SqsPublisher::from_conf(sqs_config(&sqs_url, false), publisher_config.clone()),
        ))
    };

    // The consumers.
    let consumer = Arc::new(ok(
        "the consumer",
        DecoupledConsumer::<Account>::new(
            ok("consumer name", ConsumerName::new("ledger")),
            Arc::new(entities.clone()),
            Arc::new(dedup.clone()),
            publisher(),
        ),
    ));
    let tally = Arc::new(Tally::default());
    let stop = CancellationToken::new();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            tokio::spawn(work(
                sqs.clone(),
                queue_url.clone(),
                consumer.clone(),
                tally.clone(),
                stop.clone(),
            ))
        })
        .collect();

    // The producer's first transactions, and a relay that dies holding them.
    let all: Vec<NewMessage> = (0..MESSAGES).map(deposit).collect();
    let mut chunks = all.chunks(PER_TRANSACTION);
    for _ in 0..DOOMED.div_ceil(PER_TRANSACTION) {
        let chunk = chunks.next().expect("enough messages");
        ok("enqueue", outbox.enqueue(Vec::new(), chunk).await);
    }
    let doomed = ok(
        "the doomed relay's claim",
        outbox
            .claim(ClaimRequest::new(DOOMED, DOOMED_LEASE).expect("a valid claim"))
            .await,
    );
    // Per-key order lets a claim take only the head of each key.
    assert!(!doomed.is_empty(), "the doomed relay claimed nothing");
    let doomed_batch: Vec<_> = doomed.iter().map(|c| c.message.clone()).collect();
    let doomed_publisher = publisher();
    let outcomes = ok(
        "the doomed relay's publish",
        within(
            "the doomed publish",
            doomed_publisher.publish(&doomed_batch),
        )
        .await,
    );
    assert!(outcomes
        .iter()
        .all(|o| *o == outbox_core::PublishOutcome::Published));
    drop(doomed); // It dies: no complete, no release.

    // The relays, and the rest of the producer while they run.
    let relays: Vec<_> = ["relay-a", "relay-b"]
        .into_iter()
        .map(|relay| {
            ok(
                "a relay",
                Relay::new(Arc::new(outbox.clone()), publisher(), relay_config(relay)),
            )
            .spawn()
        })
        .collect();
    for chunk in chunks {
        ok("enqueue", outbox.enqueue(Vec::new(), chunk).await);
    }

    // Done: every deposit applied, the outbox drained, the queue empty, nothing held.
    wait_for("every deposit applied and every message settled", || {
        let (tally, outbox, sqs, queue_url) = (&tally, &outbox, &sqs, &queue_url);
        async move {
            if tally.applied.load(Ordering::SeqCst) < MESSAGES {
                return false;
            }
            let stats = ok("outbox stats", outbox.stats().await);
            let queue = sqs
                .get_queue_attributes()
                .queue_url(queue_url)
                .attribute_names(QueueAttributeName::All)
                .send()
                .await
                .expect("queue attributes");
            let count = |name: QueueAttributeName| {
                queue
                    .attributes()
                    .and_then(|a| a.get(&name))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(u64::MAX)
            };
            stats.pending == 0
                && stats.in_flight == 0
                && count(QueueAttributeName::ApproximateNumberOfMessages) == 0
                && count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible) == 0
        }
    })
    .await;
    stop.cancel();
    for worker in workers {
        within("a worker to stop", worker).await.expect("a worker");
    }
    let mut reports = Vec::new();
    for relay in relays {
        reports.push(ok("relay shutdown", relay.shutdown().await));
    }
    let stats = ok("outbox stats", outbox.stats().await);

    // The accounts: every deposit of each once, in enqueue order.
    let mut expected: BTreeMap<String, Account> = BTreeMap::new();
    for seq in 0..MESSAGES {
        let account = expected
            .entry(format!("acct-{}", seq % ACCOUNTS))
            .or_default();
        account.deposits.push(seq);
        account.balance += seq;
    }
    for (key, want) in &expected {
        let loaded = ok(
            "load an account",
            entities
                .load(&ok("entity key", EntityKey::new(key.clone())))
                .await,
        )
        .unwrap_or_else(|| panic!("account {key} was never written"));
        let got: Account = serde_json::from_value(loaded.record.state).expect("an account");
        assert_eq!(
            &got, want,
            "account {key}: each deposit once, in enqueue order"
        );
        assert!(
            loaded.record.outbox.is_empty(),
            "account {key} still holds outbox state"
        );
    }

    let published: u64 = reports.iter().map(|r| r.dispatched).sum();
    // Messages a surviving relay handed over again after a failure it could not tell
    // from a refusal (a request timed out after moto took it, a lease lost, a batch
    // released): each may reach the queue twice.
    let retried: u64 = reports
        .iter()
        .map(|r| r.retried + r.leases_lost + r.released)
        .sum();
    let deliveries = tally.deliveries.load(Ordering::SeqCst);
    let applied = tally.applied.load(Ordering::SeqCst);
    let duplicates = tally.duplicates.load(Ordering::SeqCst);
    let asked = tally.redeliveries_asked.load(Ordering::SeqCst);
    println!("SQS FIFO end to end ({name}), {:.1?}", started.elapsed());
    println!(
        "  produced {MESSAGES} deposits to {ACCOUNTS} accounts, transactions of {PER_TRANSACTION}"
    );
    println!(
        "  doomed relay published {} and died; relays dispatched {published} (those \
         again among them), {retried} handed over again after a failure",
        doomed_batch.len()
    );
    println!(
        "  consumers: {deliveries} deliveries, {applied} applied, {duplicates} duplicates \
         suppressed by the dedup store, {} conflicts redelivered, {asked} redeliveries asked for",
        tally.conflicts.load(Ordering::SeqCst)
    );
    println!("  outbox at the end: {stats:?}");

    assert_eq!(applied, MESSAGES, "each deposit applied once");
    assert_eq!(
        asked, REDELIVERIES,
        "one redelivery asked per selected deposit"
    );
    // The repeats the consumers saw: every redelivery they asked for, and at most the
    // dead relay's messages and those a relay handed over again published twice (real
    // SQS drops those within its five-minute dedup interval; moto only while the first
    // copy is still in the queue).
    assert!(
        (REDELIVERIES..=REDELIVERIES + doomed_batch.len() as u64 + retried).contains(&duplicates),
        "duplicates {duplicates}: expected the {REDELIVERIES} redeliveries asked for, plus at \
         most the {} messages of the dead relay and the {retried} handed over again",
        doomed_batch.len()
    );
    assert_eq!(
        published, MESSAGES,
        "the relays published every message once, the doomed relay's again"
    );
    assert_eq!((stats.pending, stats.in_flight, stats.dead), (0, 0, 0));

    let _ = sqs.delete_queue().queue_url(&queue_url).send().await;
    let _ = outbox.drop_table().await;
    let _ = dedup.drop_table().await;
    let _ = entities.drop_table().await;
}

/// A consumer worker: receive, apply through the decoupled consumer, then delete, or,
/// on the first delivery of a selected deposit, make it visible again.
async fn work(
    sqs: outbox_sqs::aws_sdk_sqs::Client,
    queue_url: String,
    consumer: Arc<DecoupledConsumer<Account>>,
    tally: Arc<Tally>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let received = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            received = sqs
                .receive_message()
                .queue_url(&queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .visibility_timeout(30)
                .message_attribute_names("All")
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send() => received,
        };
        let Ok(received) = received else {
            continue;
        };
        for m in received.messages() {
            tally.deliveries.fetch_add(1, Ordering::SeqCst);
            let delivery = outbox_sqs::decode(m)
                .unwrap_or_else(|e| panic!("a delivery does not decode: {}", e.report()));
            let key = delivery.partition_key.clone().expect("a keyed deposit");
            let seq = serde_json::from_slice::<serde_json::Value>(&delivery.payload).expect("json")
                ["seq"]
                .as_u64()
                .expect("a deposit number");
            let first = m
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                .is_some_and(|count| count == "1");
            let entity = EntityKey::new(key).expect("an entity key");
            let handled = consumer
                .handle(&entity, delivery.id, |mut account: Account| async move {
                    account.deposits.push(seq);
                    account.balance += seq;
                    Ok((account, Vec::new()))
                })
                .await;
            let receipt = m.receipt_handle().unwrap_or_default();
            let send_back = match handled {
                Ok(Handled::Applied { .. }) => {
                    tally.applied.fetch_add(1, Ordering::SeqCst);
                    let lost_delete = first && seq.is_multiple_of(REDELIVER_EVERY);
                    if lost_delete {
                        tally.redeliveries_asked.fetch_add(1, Ordering::SeqCst);
                    }
                    lost_delete
                }
                Ok(Handled::Duplicate | Handled::Redispatched { .. }) => {
                    tally.duplicates.fetch_add(1, Ordering::SeqCst);
                    false
                }
                // Nothing stored: deliver it again.
                Err(e) if e.kind() == ErrorKind::Conflict => {
                    tally.conflicts.fetch_add(1, Ordering::SeqCst);
                    true
                }
                Err(e) => panic!("the consumer failed: {}", e.report()),
            };
            if send_back {
                sqs.change_message_visibility()
                    .queue_url(&queue_url)
                    .receipt_handle(receipt)
                    .visibility_timeout(0)
                    .send()
                    .await
                    .expect("make a message visible again");
            } else {
                sqs.delete_message()
                    .queue_url(&queue_url)
                    .receipt_handle(receipt)
                    .send()
                    .await
                    .expect("delete a message");
            }
        }
    }
}
