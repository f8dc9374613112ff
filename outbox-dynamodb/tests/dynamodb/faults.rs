//! What AWS does and DynamoDB Local does not, injected into the SDK's real requests
//! (`outbox_dynamodb::faults`): the injector itself, then the store under throttled
//! claim writes, body reads and settles, cancelled transactions and failed batch
//! statements.
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
    store::ClaimRequest, store::ClaimedMessage, store::Disposition, store::Failure,
    store::OutboxStoreExt, ErrorKind, MessageId, NewMessage, OutboxAdmin, OutboxStore,
};
use outbox_dynamodb::faults::{CancelReason, Fault, FaultInjector, Rule};
use outbox_dynamodb::{DynamoOutbox, DynamoOutboxConfig};
use outbox_testkit::poll_for;

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
    outbox_retrying(client, faults, RetryConfig::disabled()).await
}

/// As [`outbox_with`], with the SDK retrying as `retry` says.
async fn outbox_retrying(
    client: &Client,
    faults: &FaultInjector,
    retry: RetryConfig,
) -> DynamoOutbox {
    let plain = common::outbox(client, DynamoOutboxConfig::default())
        .await
        .unwrap();
    DynamoOutbox::new(faulty(client, faults, retry), plain.config().clone()).unwrap()
}

/// Standard retries, three attempts, from a millisecond: enough to absorb two throttles.
fn three_quick_attempts() -> RetryConfig {
    RetryConfig::standard()
        .with_max_attempts(3)
        .with_initial_backoff(Duration::from_millis(1))
}

/// A `dynamo_test!` fixture: a [`common::client`], an injector seeded from
/// `OUTBOX_FAULT_SEED`, and an [`outbox_with`] it.
async fn faulty_outbox(what: &str) -> Option<(Client, FaultInjector, DynamoOutbox)> {
    let client = common::client(what).await?;
    let faults = FaultInjector::seeded_from_env("OUTBOX_FAULT_SEED");
    let outbox = outbox_with(&client, &faults).await;
    Some((client, faults, outbox))
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

/// Claim the one due message of `outbox` and dead-letter it.
async fn dead_letter_next(outbox: &DynamoOutbox) {
    let held = claim(outbox, 1).await.remove(0);
    let dead = Failure::new(held.lease, "poison", Disposition::DeadLetter);
    OutboxStoreExt::fail_one(outbox, dead).await.unwrap();
}

fn ids(claimed: &[ClaimedMessage]) -> HashSet<MessageId> {
    claimed.iter().map(|c| c.message.id).collect()
}

fn text(id: MessageId) -> String {
    id.as_uuid().hyphenated().to_string()
}

dynamo_test! {
    /// A throttle before send answers with the typed exception and its throttling reason,
    /// and writes nothing; one after send answers the same, but the write landed.
    async fn throttles_replace_the_answer_before_or_after_the_write(
        (client, faults, outbox) = faulty_outbox("outbox-dynamodb faults: throttles")
    ) {
        let table = outbox.config().table().to_owned();
        let faulty = outbox.client().clone();
        faults.add(
            Rule::throttle("PutItem", Fault::ProvisionedThroughputExceeded)
                .matching("probe-before"),
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
    async fn the_sdks_retries_absorb_throttles(
        client = common::client("outbox-dynamodb faults: SDK retries")
    ) {
        let faults = FaultInjector::seeded_from_env("OUTBOX_FAULT_SEED");
        let outbox = outbox_retrying(&client, &faults, three_quick_attempts()).await;
        let sent = enqueue(&outbox, 3).await;
        faults.add(
            Rule::throttle("UpdateItem", Fault::Throttling)
                .matching(text(sent[1]))
                .times(2),
        );
        let got = claim(&outbox, 3).await;
        assert_eq!(ids(&got), sent.iter().copied().collect(), "{faults}");
        assert_eq!(faults.count("UpdateItem"), 2, "{faults}");
        assert_eq!(outbox.metrics().claim_errors, 0);
    }

    /// One claim write throttled past the SDK's retries: the claim returns the other
    /// messages instead of failing, counts the error, and the throttled message (its
    /// write never applied) is claimed by the next claim, its attempt counted once.
    async fn a_throttled_claim_write_does_not_abort_the_claim(
        (_, faults, outbox) = faulty_outbox("outbox-dynamodb faults: claim write")
    ) {
        let sent = enqueue(&outbox, 5).await;
        faults.add(
            Rule::throttle("UpdateItem", Fault::ProvisionedThroughputExceeded)
                .matching(text(sent[2]))
                .times(1),
        );
        let first = outbox
            .claim(ClaimRequest::new(5, LEASE).unwrap())
            .await
            .unwrap_or_else(|e| panic!("{faults}: the claim failed whole: {}", e.report()));
        let first = first.into_messages();
        let mut want: HashSet<MessageId> = sent.iter().copied().collect();
        want.remove(&sent[2]);
        assert_eq!(ids(&first), want, "{faults}");
        assert_eq!(outbox.metrics().claim_errors, 1);

        let later = poll_for("the throttled message to be claimed", || {
            let outbox = outbox.clone();
            async move { claim(&outbox, 5).await.pop() }
        })
        .await;
        assert_eq!(later.message.id, sent[2]);
        assert_eq!(
            later.message.attempts, 1,
            "the throttled write applied nothing"
        );
        assert_eq!(faults.total(), 1, "{faults}");
    }

    /// A body read throttled after a successful claim write: the claim returns the other
    /// messages, and releases that one at once (attempt given back) instead of stranding
    /// it under a lease nobody will settle.
    async fn a_throttled_body_read_releases_its_message(
        (_, faults, outbox) = faulty_outbox("outbox-dynamodb faults: body read")
    ) {
        let sent = enqueue(&outbox, 4).await;
        // The body query is the one Query naming the message's partition, `m#<id>`.
        faults.add(
            Rule::throttle("Query", Fault::Throttling)
                .matching(format!("m#{}", text(sent[0])))
                .times(1),
        );
        let first = claim(&outbox, 4).await;
        assert_eq!(ids(&first), sent[1..].iter().copied().collect(), "{faults}");
        assert_eq!(outbox.metrics().claim_errors, 1);

        let again = claim(&outbox, 4).await;
        assert_eq!(ids(&again), HashSet::from([sent[0]]), "released at once");
        assert_eq!(
            again[0].message.attempts, 1,
            "the failed claim's attempt was given back"
        );
        assert_eq!(faults.total(), 1, "{faults}");
    }

    /// One settle of a batch throttled past the SDK's retries: every other lease of the
    /// batch is still applied (the batch is wider than the store's concurrency, so a
    /// settle that stopped at the first error would leave some unstarted), the call
    /// reports the error for the relay to retry, and the retry applies the throttled one
    /// and reports the others lost.
    async fn a_throttled_settle_does_not_stop_the_others(
        (_, faults, outbox) = faulty_outbox("outbox-dynamodb faults: settles")
    ) {
        let sent = enqueue(&outbox, 24).await;
        let got = claim(&outbox, 24).await;
        assert_eq!(got.len(), 24);
        let failures: Vec<Failure> = got
            .iter()
            .map(|c| Failure::new(c.lease, "broker down", Disposition::Retry { after: LEASE }))
            .collect();
        // Settles run in id order: the first one fails.
        let first = *sent.iter().min().unwrap();
        faults.add(
            Rule::throttle("UpdateItem", Fault::Throttling)
                .matching(text(first))
                .times(1),
        );
        let err = outbox.fail(&failures).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Contention, "{}", err.report());
        assert!(err.is_retryable());
        assert_eq!(outbox.metrics().settle_errors, 1);

        let retry = outbox.fail(&failures).await.unwrap();
        assert_eq!(
            (retry.applied, retry.lost.len()),
            (1, 23),
            "{faults}: every other failure was applied by the first call"
        );
        let stats = outbox.stats().await.unwrap();
        assert_eq!((stats.pending, stats.in_flight), (24, 0));
    }

    /// A transaction cancelled for a conflict on one of its actions (as when another
    /// request writes that item): the enqueue is a retryable contention error and writes
    /// nothing; sent again, it commits.
    async fn a_cancelled_enqueue_writes_nothing(
        (_, faults, outbox) = faulty_outbox("outbox-dynamodb faults: cancelled")
    ) {
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
    async fn a_failed_batch_statement_fails_alone(
        (_, faults, outbox) = faulty_outbox("outbox-dynamodb faults: batch statement")
    ) {
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

    /// Throttles are counted per operation, index and reason, the ones the SDK's retries
    /// absorbed included: an enqueue throttled once and a claim's `due` index query
    /// throttled twice both succeed, and the counts say what was throttled and where.
    async fn throttles_are_counted_by_operation_index_and_reason(
        client = common::client("outbox-dynamodb faults: throttle counts")
    ) {
        let faults = FaultInjector::seeded_from_env("OUTBOX_FAULT_SEED");
        let outbox = outbox_retrying(&client, &faults, three_quick_attempts()).await;
        faults.add(
            Rule::throttle("TransactWriteItems", Fault::ProvisionedThroughputExceeded).times(1),
        );
        // The claim's index query names the index; the body reads do not.
        faults.add(
            Rule::throttle("Query", Fault::Throttling)
                .matching("\"IndexName\":\"due\"")
                .times(2),
        );
        let sent = enqueue(&outbox, 2).await;
        let got = claim(&outbox, 2).await;
        assert_eq!(ids(&got), sent.iter().copied().collect(), "{faults}");
        assert_eq!(faults.total(), 3, "{faults}");

        let m = outbox.metrics();
        assert_eq!((m.throttled, m.enqueue_throttled), (3, 1), "{faults}");
        let kinds = outbox.throttled();
        let enqueue = kinds
            .iter()
            .find(|k| k.operation == "TransactWriteItems")
            .unwrap();
        assert_eq!(
            (
                enqueue.code.as_str(),
                enqueue.reason.as_deref(),
                enqueue.index.as_deref(),
                enqueue.count
            ),
            (
                "ProvisionedThroughputExceededException",
                Some("TableWriteProvisionedThroughputExceeded"),
                None,
                1
            )
        );
        let due = kinds.iter().find(|k| k.operation == "Query").unwrap();
        assert_eq!(
            (
                due.code.as_str(),
                due.reason.as_deref(),
                due.index.as_deref(),
                due.count
            ),
            (
                "ThrottlingException",
                Some("IndexReadAccountLimitExceeded"),
                Some("due"),
                2
            )
        );
    }

    /// A lagging `due` index: with every index query answered as an earlier equal one
    /// was, a message completed since is still offered (and not delivered again) and one
    /// enqueued since is not seen; once the index catches up, the new message is claimed.
    async fn a_lagging_index_delays_but_never_duplicates(
        (_, faults, outbox) = faulty_outbox("outbox-dynamodb faults: lagging index")
    ) {
        let first = enqueue(&outbox, 1).await[0];
        faults.add(Rule::stale_index());
        // No earlier answer is kept yet: the index answers as it is.
        let got = claim(&outbox, 5).await;
        assert_eq!(ids(&got), HashSet::from([first]), "{faults}");
        let leases: Vec<_> = got.into_iter().map(|c| c.lease).collect();
        assert_eq!(outbox.complete(&leases).await.unwrap().applied, 1);

        let second = enqueue(&outbox, 1).await[0];
        for _ in 0..3 {
            assert!(
                claim(&outbox, 5).await.is_empty(),
                "{faults}: the lagging index shows the completed message, not the new one"
            );
        }
        assert!(faults.count("Query") >= 3, "{faults}");
        faults.clear();
        let later = poll_for("the index to catch up", || {
            let outbox = outbox.clone();
            async move { claim(&outbox, 5).await.pop() }
        })
        .await;
        assert_eq!(later.message.id, second);
        assert_eq!(outbox.metrics().claimed, 2, "nothing delivered twice");
    }

    /// A dead-lettering whose request fails changes nothing, and once it goes through the
    /// dead letter's body has no time to live: the state write and the body's are one
    /// transaction. (As two writes, a failed body write left the body to expire under
    /// the dead letter: the throttled `UpdateItem` of the body below.)
    async fn a_dead_letter_never_keeps_a_body_that_expires(
        (_, faults, outbox) = faulty_outbox("outbox-dynamodb faults: dead letter body")
    ) {
        let id = enqueue(&outbox, 1).await[0];
        let held = claim(&outbox, 1).await.remove(0);
        faults.add(
            Rule::throttle("UpdateItem", Fault::Throttling)
                .matching("b#000")
                .times(1),
        );
        faults.add(
            Rule::throttle("TransactWriteItems", Fault::Throttling)
                .matching(text(id))
                .times(1),
        );
        let dead = || Failure::new(held.lease, "poison", Disposition::DeadLetter);
        let first = OutboxStoreExt::fail_one(&outbox, dead()).await;
        assert!(
            first.is_err(),
            "{faults}: the throttled dead-lettering fails"
        );
        assert_eq!(outbox.stats().await.unwrap().dead, 0, "nothing written");
        OutboxStoreExt::fail_one(&outbox, dead()).await.unwrap();
        let body = crate::bodies::body(&outbox, id).await;
        assert_eq!(body.len(), 1);
        assert!(
            !body[0].contains_key("ttl"),
            "{faults}: the dead letter's body keeps no time to live"
        );
        assert_eq!(outbox.stats().await.unwrap().dead, 1);
    }

    /// A failed write of the table's shard count, or of its growth, is reported as what it
    /// is (a throttle: retryable contention), not taken for another store's write (a
    /// missing count) or for a refused shrink.
    async fn a_throttled_shard_count_write_is_reported_as_a_throttle(
        (client, faults, outbox) = faulty_outbox("outbox-dynamodb faults: shard count")
    ) {
        // A table whose count item is gone, as one written before the count was kept.
        client
            .delete_item()
            .table_name(outbox.config().table())
            .key("pk", AttributeValue::S("c".into()))
            .key("sk", AttributeValue::S("shards".into()))
            .send()
            .await
            .unwrap();
        faults.add(Rule::throttle("PutItem", Fault::Throttling).times(1));
        let err = outbox.check_shards().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Contention, "{}", err.report());
        assert_eq!(
            outbox.check_shards().await.unwrap(),
            outbox.config().shards(),
            "written on the retry"
        );

        faults.add(Rule::throttle("UpdateItem", Fault::Throttling).times(1));
        let err = outbox.grow_shards(40).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Contention, "{}", err.report());
        assert_eq!(outbox.grow_shards(40).await.unwrap(), 40);
        assert_eq!(faults.total(), 2, "{faults}");
    }

    /// A requeue or a discard whose request fails changes nothing, and once it goes
    /// through the body is as the message needs it: a requeued message's body has a time
    /// to live again, a discarded one's is gone. Each is one transaction with the body
    /// items. (As separate writes, the throttled body `UpdateItem` below left a requeued
    /// message's body without a time to live, kept forever once delivered, and the
    /// throttled body `DeleteItem` left a discarded message's body behind for good.)
    async fn a_requeue_or_discard_never_leaves_a_body_behind(
        (_, faults, outbox) = faulty_outbox("outbox-dynamodb faults: requeue and discard")
    ) {
        let id = enqueue(&outbox, 1).await[0];
        let selection = outbox_core::DeadLetterSelection::Ids(vec![id]);
        let fail_body_and_transaction = |body_operation: &str| {
            faults.add(
                Rule::throttle(body_operation, Fault::Throttling)
                    .matching("b#000")
                    .times(1),
            );
            faults.add(
                Rule::throttle("TransactWriteItems", Fault::Throttling)
                    .matching(text(id))
                    .times(1),
            );
        };

        dead_letter_next(&outbox).await;
        fail_body_and_transaction("UpdateItem");
        assert!(
            outbox.requeue_dead(&selection).await.is_err(),
            "{faults}: the throttled requeue fails"
        );
        assert_eq!(outbox.stats().await.unwrap().dead, 1, "still a dead letter");
        assert_eq!(outbox.requeue_dead(&selection).await.unwrap(), 1);
        let ttls = crate::bodies::body_ttls(&outbox, id).await;
        assert_eq!(
            crate::bodies::body_exp(&outbox, id).await,
            ttls.first().copied(),
            "{faults}: the requeued body has the time to live its state records"
        );
        assert_eq!(
            faults.count("UpdateItem"),
            0,
            "{faults}: the body's time to live went in the transaction, not in a write after it"
        );

        dead_letter_next(&outbox).await;
        fail_body_and_transaction("DeleteItem");
        assert!(
            outbox.discard_dead(&selection).await.is_err(),
            "{faults}: the throttled discard fails"
        );
        assert_eq!(outbox.stats().await.unwrap().dead, 1, "still a dead letter");
        assert_eq!(outbox.discard_dead(&selection).await.unwrap(), 1);
        assert!(
            crate::bodies::body(&outbox, id).await.is_empty(),
            "{faults}: the discarded message's body is gone"
        );
        assert_eq!(outbox.stats().await.unwrap().dead, 0);
    }

    /// A requeue whose transaction is refused on the state item (it stopped being a dead
    /// letter between the read and the write) changes nothing and counts nothing; one
    /// refused only on a body part (the part is missing) goes back with the state write
    /// alone, and the parts that exist get their time to live after it.
    async fn a_refused_requeue_is_decided_by_which_item_refused_it(
        (_, faults, outbox) = faulty_outbox("outbox-dynamodb faults: refused requeue")
    ) {
        let id = enqueue(&outbox, 1).await[0];
        dead_letter_next(&outbox).await;
        let selection = outbox_core::DeadLetterSelection::Ids(vec![id]);

        // The state action (the only one naming `attempts`) refused.
        faults.add(
            Rule::cancel_transaction(CancelReason::ConditionalCheckFailed)
                .matching("attempts")
                .times(1),
        );
        assert_eq!(
            outbox.requeue_dead(&selection).await.unwrap(),
            0,
            "{faults}"
        );
        assert_eq!(outbox.stats().await.unwrap().dead, 1, "still a dead letter");
        assert!(
            !crate::bodies::body(&outbox, id).await[0].contains_key("ttl"),
            "the dead letter's body keeps no time to live"
        );

        // A body action refused: the state goes back alone, then the body's time to live.
        faults.add(
            Rule::cancel_transaction(CancelReason::ConditionalCheckFailed)
                .matching("b#000")
                .times(1),
        );
        assert_eq!(
            outbox.requeue_dead(&selection).await.unwrap(),
            1,
            "{faults}"
        );
        assert_eq!(outbox.stats().await.unwrap().dead, 0);
        let ttls = crate::bodies::body_ttls(&outbox, id).await;
        assert_eq!(
            crate::bodies::body_exp(&outbox, id).await,
            ttls.first().copied()
        );
        assert_eq!(claim(&outbox, 1).await[0].message.id, id);
    }
}
