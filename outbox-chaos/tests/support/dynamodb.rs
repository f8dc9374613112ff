//! The DynamoDB side of the chaos tests: the outbox in a table named like the
//! PostgreSQL schema that holds `published`, enqueued from the test without faults, and
//! the counts the checks read from it.

use outbox_chaos::dynamodb::{self, FaultCounts};
use outbox_core::{ErrorKind, KeyOrder, NewMessage, OutboxAdmin, OutboxStats};
use outbox_dynamodb::aws_sdk_dynamodb::config::retry::RetryConfig;
use outbox_dynamodb::aws_sdk_dynamodb::Client;
use outbox_dynamodb::DynamoOutbox;
use outbox_testkit::isolation;

use super::Worker;

/// The variable the test reads its fault seed from (as the `outbox-dynamodb` suites
/// do); worker process `n` of a run gets the seed plus `n`.
pub(crate) const SEED_VAR: &str = "OUTBOX_FAULT_SEED";

/// Most keyed messages per `enqueue` call: a transaction holds at most 100 actions and
/// a keyed message under per-key order takes three (state, body, order marker).
const CHUNK: usize = 33;

/// The DynamoDB endpoint, or `None` after a visible skip (a failure instead under
/// `OUTBOX_REQUIRE_INTEGRATION=1`).
pub(crate) fn url(what: &str) -> Option<String> {
    outbox_testkit::service_url("OUTBOX_DYNAMODB_URL", what)
}

/// The run's fault seed: [`SEED_VAR`] when it holds a number, otherwise a random one.
pub(crate) fn seed() -> u64 {
    std::env::var(SEED_VAR)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| fastrand::u64(..))
}

/// The installed outbox of table `table` at `url`, configured as the workers
/// configure it, on a client without faults; test tables older than an hour are
/// deleted first.
pub(crate) async fn install(url: &str, table: &str, order: KeyOrder) -> DynamoOutbox {
    let client = dynamodb::client(url, RetryConfig::standard());
    drop_stale_tables(&client).await;
    let outbox = DynamoOutbox::new(client, dynamodb::outbox_config(table, order))
        .expect("a valid outbox config");
    outbox.install().await.expect("install the outbox table");
    outbox
}

/// Delete the tables earlier runs left behind (named like test schemas, older than an
/// hour). Best effort: a failure leaves them to a later run.
async fn drop_stale_tables(client: &Client) {
    let mut start = None;
    loop {
        let Ok(out) = client
            .list_tables()
            .set_exclusive_start_table_name(start.take())
            .send()
            .await
        else {
            return;
        };
        for name in out.table_names() {
            if isolation::is_stale(name) {
                let _ = client.delete_table().table_name(name).send().await;
            }
        }
        match out.last_evaluated_table_name() {
            Some(last) => start = Some(last.to_owned()),
            None => return,
        }
    }
}

/// Enqueue `messages` in order, [`CHUNK`] to a transaction, without faults.
pub(crate) async fn enqueue_all(outbox: &DynamoOutbox, messages: &[NewMessage]) {
    for chunk in messages.chunks(CHUNK) {
        outbox.enqueue(Vec::new(), chunk).await.expect("enqueue");
    }
}

/// Enqueue `messages` in order, one per transaction, into table `table` at `url`
/// through a client under the workers' fault mix (seeded with `seed`), as a service
/// enqueues while the relays drain: throttles past the SDK's retries and transactions
/// cancelled for a conflict wrote nothing and are sent again, as a caller retries; a
/// retry refused because every id is already stored finds the first attempt
/// committed. What the injector injected is returned.
pub(crate) async fn enqueue_under_faults(
    url: &str,
    table: &str,
    order: KeyOrder,
    messages: Vec<NewMessage>,
    seed: u64,
) -> FaultCounts {
    let faults = dynamodb::fault_mix(seed);
    let client = faults.client(&dynamodb::client(url, dynamodb::retries()));
    let outbox = DynamoOutbox::new(client, dynamodb::outbox_config(table, order))
        .expect("a valid outbox config");
    for m in &messages {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match outbox.enqueue(Vec::new(), std::slice::from_ref(m)).await {
                Ok(()) => break,
                Err(e) if e.kind() == ErrorKind::Conflict && e.ids() == [m.id()] => break,
                Err(e) if e.is_retryable() && attempts < 50 => continue,
                Err(e) => panic!("enqueue {} failed after {attempts} attempts: {e}", m.id()),
            }
        }
    }
    FaultCounts::of(&faults)
}

/// The outbox's counts (from its eventually consistent indexes).
pub(crate) async fn stats(outbox: &DynamoOutbox) -> OutboxStats {
    outbox.stats().await.expect("read the outbox stats")
}

/// What `worker` reported its injector had injected, as of its latest fault-count
/// line (printed every second, so at most a second behind).
pub(crate) fn faults_seen(worker: &Worker) -> FaultCounts {
    worker
        .log_lines_with(dynamodb::FAULTS_LINE)
        .iter()
        .rev()
        .find_map(|line| FaultCounts::parse(line))
        .unwrap_or_default()
}

/// Delete the test's table.
pub(crate) async fn drop_table(outbox: &DynamoOutbox) {
    outbox.drop_table().await.expect("drop the test table");
}
