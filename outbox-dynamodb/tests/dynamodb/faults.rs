//! What AWS does and DynamoDB Local does not, injected into the SDK's real requests
//! (`outbox_dynamodb::faults`): the injector itself, then the store under throttles,
//! cancelled transactions and failed batch statements.
//!
//! Unless a test says otherwise, the SDK's retries are off, so an injected fault
//! reaches the store as it would after AWS kept throttling past every retry.

use std::collections::HashSet;
use std::time::Duration;

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, BatchStatementErrorCodeEnum};
use aws_sdk_dynamodb::Client;
use outbox_core::{
    ClaimRequest, ClaimedMessage, ErrorKind, MessageId, NewMessage, OutboxAdmin, OutboxStore,
};
use outbox_dynamodb::faults::{CancelReason, Fault, FaultInjector, Rule};
use outbox_dynamodb::{DynamoOutbox, DynamoOutboxConfig};

use crate::common;

const LEASE: Duration = Duration::from_secs(30);

/// `client` with `faults` registered and the SDK's retries set to `retry`.
fn faulty(client: &Client, faults: &FaultInjector, retry: RetryConfig) -> Client {
    let client = faults.client(client);
    Client::from_conf(client.config().to_builder().retry_config(retry).build())
}

/// An installed outbox (installed without faults) whose requests go through `faults`,
/// with the SDK's retries off.
async fn outbox_with(client: &Client, faults: &FaultInjector) -> DynamoOutbox {
    let plain = common::outbox(client, DynamoOutboxConfig::default())
        .await
        .unwrap();
    DynamoOutbox::new(
        faulty(client, faults, RetryConfig::disabled()),
        plain.config().clone(),
    )
    .unwrap()
}

async fn enqueue(outbox: &DynamoOutbox, n: usize) -> Vec<MessageId> {
    let messages: Vec<NewMessage> = (0..n)
        .map(|_| NewMessage::builder("faults").build().unwrap())
        .collect();
    common::enqueue_all(outbox, &messages).await.unwrap();
    messages.iter().map(NewMessage::id).collect()
}

async fn claim(outbox: &DynamoOutbox, n: usize) -> Vec<ClaimedMessage> {
    outbox
        .claim(ClaimRequest::new(n, LEASE).unwrap())
        .await
        .unwrap()
        .into_messages()
}

fn ids(claimed: &[ClaimedMessage]) -> HashSet<MessageId> {
    claimed.iter().map(|c| c.message.id).collect()
}

fn text(id: MessageId) -> String {
    id.as_uuid().hyphenated().to_string()
}

/// A throttle before send answers with the typed exception and its throttling reason,
/// and writes nothing; one after send answers the same, but the write landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttles_replace_the_answer_before_or_after_the_write() {
    let Some(client) = common::client("outbox-dynamodb faults: throttles").await else {
        return;
    };
    let faults = FaultInjector::seeded_from_env("OUTBOX_FAULT_SEED");
    let outbox = outbox_with(&client, &faults).await;
    let table = outbox.config().table().to_owned();
    let faulty = outbox.client().clone();
    faults.add(
        Rule::throttle("PutItem", Fault::ProvisionedThroughputExceeded).matching("probe-before"),
    );
    faults.add(
        Rule::throttle("PutItem", Fault::Throttling)
            .matching("probe-after")
            .after_send(),
    );
    let put = |pk: &'static str| {
        faulty
            .put_item()
            .table_name(&table)
            .item("pk", AttributeValue::S(pk.into()))
            .item("sk", AttributeValue::S("-".into()))
            .send()
    };
    let exists = |pk: &'static str| {
        let (client, table) = (client.clone(), table.clone());
        async move {
            client
                .get_item()
                .table_name(table)
                .key("pk", AttributeValue::S(pk.into()))
                .key("sk", AttributeValue::S("-".into()))
                .consistent_read(true)
                .send()
                .await
                .unwrap()
                .item
                .is_some()
        }
    };

    let err = put("probe-before").await.unwrap_err();
    match err.as_service_error() {
        Some(PutItemError::ProvisionedThroughputExceededException(e)) => {
            let reason = &e.throttling_reasons()[0];
            assert_eq!(
                reason.reason(),
                Some("TableWriteProvisionedThroughputExceeded")
            );
            assert!(reason.resource().unwrap().ends_with(&table));
        }
        other => panic!("{faults}: expected a throughput exception, got {other:?}"),
    }
    assert!(
        !exists("probe-before").await,
        "throttled before send: not written"
    );

    let err = put("probe-after").await.unwrap_err();
    assert!(
        matches!(
            err.as_service_error(),
            Some(PutItemError::ThrottlingException(e)) if !e.throttling_reasons().is_empty()
        ),
        "{faults}: {err:?}"
    );
    assert!(exists("probe-after").await, "throttled after send: written");

    put("probe-untouched").await.unwrap();
    assert_eq!(faults.count("PutItem"), 2, "{faults}");
}

/// The SDK's standard retries absorb throttles: two throttled claim writes in a row
/// and the claim still takes every message, with no claim error counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_retries_absorb_throttles() {
    let Some(client) = common::client("outbox-dynamodb faults: SDK retries").await else {
        return;
    };
    let faults = FaultInjector::seeded_from_env("OUTBOX_FAULT_SEED");
    let plain = common::outbox(&client, DynamoOutboxConfig::default())
        .await
        .unwrap();
    let retrying = faulty(
        &client,
        &faults,
        RetryConfig::standard()
            .with_max_attempts(3)
            .with_initial_backoff(Duration::from_millis(1)),
    );
    let outbox = DynamoOutbox::new(retrying, plain.config().clone()).unwrap();
    let sent = enqueue(&outbox, 3).await;
    faults.add(
        Rule::throttle("UpdateItem", Fault::Throttling)
            .matching(text(sent[1]))
            .times(2),
    );
    let got = claim(&outbox, 3).await;
    assert_eq!(ids(&got), sent.iter().copied().collect(), "{faults}");
    assert_eq!(faults.count("UpdateItem"), 2, "{faults}");
}

/// One claim write throttled past the SDK's retries: the claim returns the other
/// messages instead of failing, counts the error, and the throttled message (its
/// A body read throttled after a successful claim write: the claim returns the other
/// messages, and releases that one at once (attempt given back) instead of stranding
/// One settle of a batch throttled past the SDK's retries: every other lease of the
/// batch is still applied (the batch is wider than the store's concurrency, so a
/// settle that stopped at the first error would leave some unstarted), the call
/// reports the error for the relay to retry, and the retry applies the throttled one
/// A transaction cancelled for a conflict on one of its actions (as when another
/// request writes that item): the enqueue is a retryable contention error and writes
/// nothing; sent again, it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_enqueue_writes_nothing() {
    let Some(client) = common::client("outbox-dynamodb faults: cancelled").await else {
        return;
    };
    let faults = FaultInjector::seeded_from_env("OUTBOX_FAULT_SEED");
    let outbox = outbox_with(&client, &faults).await;
    faults.add(Rule::cancel_transaction(CancelReason::TransactionConflict).times(1));
    let messages: Vec<NewMessage> = (0..2)
        .map(|_| NewMessage::builder("cancelled").build().unwrap())
        .collect();
    let err = outbox.enqueue(Vec::new(), &messages).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Contention, "{}", err.report());
    assert!(err.is_retryable());
    assert_eq!(outbox.stats().await.unwrap().pending, 0, "nothing written");
    outbox.enqueue(Vec::new(), &messages).await.unwrap();
    assert_eq!(outbox.stats().await.unwrap().pending, 2);
    assert_eq!(faults.count("TransactWriteItems"), 1, "{faults}");
}

/// Completes travel as a PartiQL batch. A statement throttled inside it is retried
/// alone and applies; a statement refused by its condition is a lost lease, and was
/// not applied (the message stays in flight until its lease is settled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_statement_fails_alone() {
    let Some(client) = common::client("outbox-dynamodb faults: batch statement").await else {
        return;
    };
    let faults = FaultInjector::seeded_from_env("OUTBOX_FAULT_SEED");
    let outbox = outbox_with(&client, &faults).await;
    let sent = enqueue(&outbox, 4).await;
    let got = claim(&outbox, 4).await;
    let lease_of = |id: MessageId| got.iter().find(|c| c.message.id == id).unwrap().lease;
    faults.add(
        Rule::fail_statement(BatchStatementErrorCodeEnum::ThrottlingError)
            .matching(text(sent[1]))
            .times(1),
    );
    faults.add(
        Rule::fail_statement(BatchStatementErrorCodeEnum::ConditionalCheckFailed)
            .matching(text(sent[2]))
            .times(1),
    );
    // Two calls, so each batch meets one rule (the first that fires wins).
    let settled = outbox
        .complete(&[lease_of(sent[0]), lease_of(sent[1])])
        .await
        .unwrap();
    assert_eq!((settled.applied, settled.lost.len()), (2, 0), "{faults}");
    let settled = outbox
        .complete(&[lease_of(sent[2]), lease_of(sent[3])])
        .await
        .unwrap();
    assert_eq!(settled.applied, 1, "{faults}");
    assert_eq!(settled.lost, vec![sent[2]]);
    assert_eq!(faults.count("BatchExecuteStatement"), 2, "{faults}");

    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.in_flight), (0, 1), "not applied");
    let settled = outbox.complete(&[lease_of(sent[2])]).await.unwrap();
    assert_eq!(settled.applied, 1);
}
