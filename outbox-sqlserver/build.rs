//! Build script: gates the SQL Server tests on OUTBOX_TEST_MSSQL_URL; CI runs no SQL Server.

use outbox_build::Require;

fn main() {
    outbox_build::gate_on_url("OUTBOX_TEST_MSSQL_URL", "SQL Server", Require::Never);
}
