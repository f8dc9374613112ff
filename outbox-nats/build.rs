//! Build script: gates the NATS tests on OUTBOX_NATS_URL (see outbox-build).

use outbox_build::Require;

fn main() {
    outbox_build::gate_on_url("OUTBOX_NATS_URL", "NATS JetStream", Require::InCi);
}
