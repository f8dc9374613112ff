//! Build script: gates the private-cluster tests on the PostgreSQL server binaries.

use outbox_build::Require;

fn main() {
    outbox_build::gate_on_postgres_server(Require::InCi);
}
