//! Failures before any table is read: URLs, files, servers, passwords.

use crate::common::{fresh_name, outbox, Fixture, PG_URL};

/// A password no message may show.
const PASSWORD: &str = "Zq9-secret-Pw";

#[test]
fn no_url_and_bad_urls_are_usage_errors() {
    let run = outbox(&["stats"], None);
    run.expect(2);
    assert!(
        run.stderr.contains("error: no database URL"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("OUTBOX_URL"), "{}", run.stderr);
    for url in ["oracle://h/db", "orders.db", "sqlite://", "sqlite::memory:"] {
        let run = outbox(&["--url", url, "stats"], None);
        run.expect(2);
        assert!(run.stderr.starts_with("error: "), "{url}: {}", run.stderr);
        assert!(run.stderr.contains("hint: "), "{url}: {}", run.stderr);
    }
    let run = outbox(&["--url", "postgres://u@h:notaport/db", "stats"], None);
    run.expect(2);
    assert!(
        run.stderr.contains("not a valid PostgreSQL URL"),
        "{}",
        run.stderr
    );
    let run = outbox(&["--url", "sqlite://x.db", "bogus"], None);
    run.expect(2);
    let help = outbox(&["--help"], None);
    help.expect(0);
    assert!(help.stdout.contains("dead"), "{}", help.stdout);
}

/// CI runs no SQL Server: what the binary can do without one. `schema print` needs
/// no connection and prints the library's own DDL.
#[test]
fn sql_server_schema_print_needs_no_server() {
    use outbox_core::schema::Schema;
    use outbox_sqlserver::{MssqlConnection, MssqlDedupConfig, MssqlDedupStore};
    use outbox_sqlserver::{MssqlOutbox, MssqlOutboxConfig};

    let url = format!("sqlserver://sa:{PASSWORD}@127.0.0.1:1/orders");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _inside = runtime.enter();
    let pool = MssqlConnection::from_ado_string("Server=tcp:127.0.0.1,1;User Id=sa;Password=x")
        .unwrap()
        .lazy_pool(1);
    let store = MssqlOutbox::new(pool.clone(), MssqlOutboxConfig::default()).unwrap();
    let print = outbox(&["--url", &url, "schema", "print"], None);
    print.expect(0);
    assert_eq!(print.stdout.trim_end(), Schema::ddl(&store).trim_end());
    let inbox = MssqlDedupStore::new(pool, MssqlDedupConfig::default()).unwrap();
    let print = outbox(
        &["--url", &url, "schema", "print", "--inbox", "--json"],
        None,
    );
    let json = print.expect(0).json();
    assert_eq!(json["ddl"].as_str().unwrap(), Schema::ddl(&inbox));
    assert_eq!(json["table"].as_str().unwrap(), Schema::name(&inbox));
    assert!(!print.all().contains(PASSWORD), "{}", print.all());
}

#[test]
fn a_sql_server_that_is_down_is_reported_with_the_password_redacted() {
    let url = format!("mssql://sa:{PASSWORD}@127.0.0.1:1/orders");
    let run = outbox(&["--url", &url, "--connect-timeout", "2s", "stats"], None);
    run.expect(1);
    assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
    assert!(
        run.stderr.contains("mssql://sa:***@127.0.0.1:1/orders"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("hint: check that the server is running"),
        "{}",
        run.stderr
    );
    assert!(!run.all().contains(PASSWORD), "{}", run.all());
    let bad = outbox(&["--url", "sqlserver://sa:pw@host", "stats"], None);
    bad.expect(2);
    assert!(bad.stderr.contains("one database"), "{}", bad.stderr);
}

#[test]
fn a_missing_sqlite_file_is_reported_and_not_created() {
    let dir = std::env::temp_dir().join(format!("outbox-cli-missing-{}", std::process::id()));
    let path = dir.join("nowhere.db");
    let url = format!("sqlite://{}", path.display());
    for args in [
        &["stats"][..],
        &["dead", "list"],
        &["purge", "--older-than", "1d"],
    ] {
        let mut all = vec!["--url", url.as_str()];
        all.extend(args);
        let run = outbox(&all, None);
        run.expect(1);
        assert!(
            run.stderr.contains("error: no SQLite database at "),
            "{}",
            run.stderr
        );
        assert!(
            run.stderr.contains("outbox schema install"),
            "{}",
            run.stderr
        );
    }
    assert!(!path.exists() && !dir.exists(), "nothing was created");
    let run = outbox(&["--url", &url, "--schema", "s", "stats"], None);
    run.expect(2);
    assert!(
        run.stderr.contains("SQLite has no schemas"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_server_that_is_down_is_reported_with_the_password_redacted() {
    let url = format!("postgres://app:{PASSWORD}@127.0.0.1:1/orders");
    for args in [&["stats"][..], &["dead", "requeue", "--all", "--yes"]] {
        let mut all = vec!["--url", url.as_str(), "--connect-timeout", "5s"];
        all.extend(args);
        let run = outbox(&all, None);
        run.expect(1);
        assert!(
            run.stderr
                .starts_with("error: cannot connect to postgres://app:***@127.0.0.1:1/orders: "),
            "{}",
            run.stderr
        );
        assert!(
            run.stderr
                .contains("hint: check that the server is running"),
            "{}",
            run.stderr
        );
        assert!(!run.all().contains(PASSWORD), "{}", run.all());
    }
    // The URL from the environment, password in a query parameter.
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["stats", "--connect-timeout", "5s"])
        .env(
            "OUTBOX_URL",
            format!("postgres://app@127.0.0.1:1/orders?password={PASSWORD}"),
        )
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(1));
    let stderr = String::from_utf8(run.stderr).unwrap();
    assert!(stderr.contains("password=***"), "{stderr}");
    assert!(!stderr.contains(PASSWORD), "{stderr}");
}

#[test]
fn clap_errors_do_not_echo_the_password() {
    let url = format!("postgres://app:{PASSWORD}@127.0.0.1:1/orders");
    let run = outbox(&["--url", &url, "stats", &url], None);
    run.expect(2);
    assert!(!run.all().contains(PASSWORD), "{}", run.all());
}

/// The real server, reached with a password in the URL (which a `trust` login
/// ignores and a password login refuses): every message redacts it.
#[tokio::test]
async fn messages_from_a_live_server_redact_the_password() {
    let Some(url) = outbox_testkit::service_url(PG_URL, "outbox-cli redaction") else {
        return;
    };
    let mut with_password = url::Url::parse(&url).unwrap();
    with_password.set_password(Some(PASSWORD)).unwrap();
    let with_password = with_password.to_string();
    let schema = fresh_name();
    let run = outbox(
        &["--url", &with_password, "--schema", &schema, "stats"],
        None,
    );
    run.expect(1);
    assert!(run.stderr.contains(":***@"), "{}", run.stderr);
    assert!(!run.all().contains(PASSWORD), "{}", run.all());
    // And when it works, the password is not printed either.
    let f = Fixture::postgres(true)
        .await
        .expect("service checked above");
    let mut args = vec!["--url", with_password.as_str()];
    let schema_flag = ["--schema".to_owned(), f.schema().to_owned()];
    args.extend(schema_flag.iter().map(String::as_str));
    args.push("stats");
    let run = outbox(&args, None);
    if run.code == 0 {
        assert!(run.stdout.contains(":***@"), "{}", run.stdout);
    }
    assert!(!run.all().contains(PASSWORD), "{}", run.all());
}
