//! Build script: the integration tests start a private PostgreSQL cluster, which needs
//! the server binaries (`initdb`, `pg_ctl`). Without them the tests are built as
//! ignored (cfg `outbox_service_unset`), so cargo's summary shows what did not run
//! instead of counting it as passed. Under `OUTBOX_REQUIRE_INTEGRATION=1` missing
//! binaries fail the build. The search is the testkit's (`pg_cluster`): `pg_config
//! --bindir`, else `/usr/lib/postgresql/<version>/bin`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-env-changed=OUTBOX_REQUIRE_INTEGRATION");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-changed=/usr/lib/postgresql");
    if has_server_binaries() {
        return;
    }
    if std::env::var("OUTBOX_REQUIRE_INTEGRATION").is_ok_and(|v| v.trim() == "1") {
        panic!(
            "no PostgreSQL server binaries (initdb, pg_ctl) but OUTBOX_REQUIRE_INTEGRATION=1: \
             install the PostgreSQL server package"
        );
    }
    println!(
        "cargo::warning=no PostgreSQL server binaries (initdb, pg_ctl): the log-tailing \
         relay's integration tests are ignored"
    );
    println!("cargo::rustc-cfg=outbox_service_unset");
}

fn has_server_binaries() -> bool {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if from_pg_config.is_some_and(|d| has_server(Path::new(&d))) {
        return true;
    }
    std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .any(|e| has_server(&e.path().join("bin")))
        })
        .unwrap_or(false)
}
