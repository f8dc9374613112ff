//! The DynamoDB Streams side of the chaos tests: the stream outbox in a table named
//! like the PostgreSQL schema that holds `published`, enqueued from the test, and the
//! lease table the test reads to find the worker reading the shard.

use outbox_chaos::streams;
use outbox_core::NewMessage;
use outbox_dynamodb::aws_sdk_dynamodb::config::retry::RetryConfig;
use outbox_dynamodb_streams::StreamOutbox;

use super::Worker;

/// The installed outbox of table `table` at `url`.
pub(crate) async fn install(url: &str, table: &str) -> StreamOutbox {
    let client = outbox_chaos::dynamodb::client(url, RetryConfig::standard());
    let outbox =
        StreamOutbox::new(client, streams::outbox_config(table)).expect("a valid outbox config");
    outbox.install().await.expect("install the stream outbox");
    outbox
}

/// Enqueue `messages`, 100 to a transaction, one transaction after another.
/// DynamoDB Local serialises writes to a table with a stream badly: concurrent
/// transactions wait on its lock (and time out, or leave it slow for every later
/// request), while one writer enqueues about 2,000 messages a second.
pub(crate) async fn enqueue_all(outbox: &StreamOutbox, messages: Vec<NewMessage>) {
    for chunk in messages.chunks(100) {
        outbox.enqueue(Vec::new(), chunk).await.expect("enqueue");
    }
}

/// The lease-table ids of the workers holding an unexpired shard lease now.
pub(crate) async fn owners(outbox: &StreamOutbox) -> Vec<String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let out = outbox
        .client()
        .scan()
        .table_name(outbox.config().lease_table())
        .consistent_read(true)
        .send()
        .await
        .expect("read the lease table");
    out.items()
        .iter()
        .filter(|i| {
            i.get("pk")
                .and_then(|v| v.as_s().ok())
                .is_some_and(|pk| pk.starts_with("s#"))
        })
        .filter(|i| {
            i.get("expires_us")
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse::<u128>().ok())
                .is_some_and(|e| e > now)
        })
        .filter_map(|i| i.get("owner").and_then(|v| v.as_s().ok()).cloned())
        .collect()
}

/// The lease-table id `worker` printed at start.
pub(crate) fn owner_id(worker: &Worker) -> Option<String> {
    worker
        .log_lines_with(" lease owner ")
        .first()
        .and_then(|line| line.rsplit(' ').next())
        .map(str::to_owned)
}
