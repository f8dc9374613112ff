//! Build script: gates the MySQL/MariaDB tests on OUTBOX_MYSQL_URL (see outbox-build).

use outbox_build::Require;

fn main() {
    outbox_build::gate_on_url("OUTBOX_MYSQL_URL", "MySQL/MariaDB", Require::InCi);
}
