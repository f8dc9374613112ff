//! The outbox-testkit conformance suite against DynamoDB Local: [`DynamoOutbox`] in a
//! table of its own per case.
//!
//! Run: `eval "$(scripts/services.sh)" && cargo test -p outbox-dynamodb --test conformance`

mod common;

async fn harness() -> Option<common::DynamoHarness> {
    let client = common::client("outbox-dynamodb conformance").await?;
    Some(common::DynamoHarness::plain(client))
}

outbox_testkit::conformance_suite!(harness; lacks(row_locks));
