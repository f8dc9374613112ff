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
    for url in ["mysql://h/db", "orders.db", "sqlite://", "sqlite::memory:"] {
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

#[test]
fn sql_server_is_not_spoken_yet() {
    let url = format!("mssql://sa:{PASSWORD}@127.0.0.1:1433/orders");
    let run = outbox(&["--url", &url, "stats"], None);
    run.expect(1);
    assert!(
        run.stderr
            .starts_with("error: this outbox CLI does not speak SQL Server yet"),
        "{}",
        run.stderr
    );
    assert!(!run.all().contains(PASSWORD), "{}", run.all());
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
