//! The outbox and its relay on DynamoDB Local (which serves the Streams API): enqueue,
//! publishing, takeover, poison messages, skipped records, a trimmed stream.
//!
//! ```sh
//! eval "$(scripts/services.sh)"
//! cargo test -p outbox-dynamodb-streams
//! ```
//!
//! Each test has its own tables. Without `OUTBOX_DYNAMODB_URL` every test prints that
//! it was skipped (and fails under `OUTBOX_REQUIRE_INTEGRATION=1`).

#[macro_use]
mod common;
mod outbox;
mod relay;
mod trimmed;
