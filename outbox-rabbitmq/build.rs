//! Build script: gates the RabbitMQ tests on OUTBOX_AMQP_URL (see outbox-build).

use outbox_build::Require;

fn main() {
    outbox_build::gate_on_url("OUTBOX_AMQP_URL", "RabbitMQ", Require::InCi);
}
