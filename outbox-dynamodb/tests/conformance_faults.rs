//! The outbox-testkit conformance suite once more, under a seeded mix of AWS's faults
//! injected into the SDK's real requests to DynamoDB Local (`outbox_dynamodb::faults`):
//! 5% of every data-plane attempt throttled (`ThrottlingException` or
//! `ProvisionedThroughputExceededException`, with throttling reasons), one statement of
//! 5% of the batched completes failing with `ThrottlingError`, and 1% of enqueue
//! transactions cancelled for a `TransactionConflict`, all before the request is
//! applied. (No lagging index here: see `fault_mix`.) The client retries as recommended for DynamoDB (standard mode, 10 attempts,
//! 5 to 200 ms backoff); the fixture resends an enqueue that failed retryably, as a
//! caller would. Every guarantee the plain run checks must hold.
//!
//! Each case prints its seed and, when it ends, what was injected into it (shown for a
//! failing case). Replay one with `OUTBOX_FAULT_SEED=<seed>`.
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-dynamodb --test conformance_faults`

mod common;

async fn harness() -> Option<common::DynamoHarness> {
    let what = "outbox-dynamodb conformance under faults";
    let client = common::client(what).await?;
    Some(common::DynamoHarness::under_faults(&client, what))
}

outbox_testkit::conformance_suite!(harness; lacks(row_locks));
