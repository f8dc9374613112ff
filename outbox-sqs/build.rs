//! Build script: gates the SQS tests on OUTBOX_SQS_URL (see outbox-build).

use outbox_build::Require;

fn main() {
    outbox_build::gate_on_url("OUTBOX_SQS_URL", "an SQS endpoint", Require::InCi);
}
