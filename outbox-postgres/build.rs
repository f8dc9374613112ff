//! Build script: gates the PostgreSQL tests on OUTBOX_PG_URL (see outbox-build).

use outbox_build::Require;

fn main() {
    outbox_build::gate_on_url("OUTBOX_PG_URL", "PostgreSQL", Require::InCi);
}
