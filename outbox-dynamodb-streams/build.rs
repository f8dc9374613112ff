//! Build script: gates the DynamoDB Streams tests on OUTBOX_DYNAMODB_URL (see outbox-build).

use outbox_build::Require;

fn main() {
    outbox_build::gate_on_url("OUTBOX_DYNAMODB_URL", "DynamoDB", Require::InCi);
}
