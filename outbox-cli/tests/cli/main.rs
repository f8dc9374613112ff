//! The `outbox` binary, run for real against an SQLite file, the local PostgreSQL,
//! MariaDB and DynamoDB Local:
//! each verb's tables and JSON, what it changed in the database (checked through the
//! library), and the failures (bad URLs, missing tables, unknown ids, a server that is
//! down) with their exit codes, messages and redacted passwords.
//!
//! Run: `eval "$(scripts/services.sh)"; cargo test -p outbox-cli` (without
//! `OUTBOX_PG_URL` / `OUTBOX_DYNAMODB_URL` those cases print SKIPPED).

mod common;
mod dead;
mod failures;

use std::time::Duration;

use outbox_core::{ConsumerName, MessageId};

use common::{cells, Fixture};
use dead::*;

/// Each case on a new SQLite file, in a fresh PostgreSQL schema and in fresh DynamoDB
/// tables; the flag says whether the outbox table is installed first.
macro_rules! on_every_backend {
    ($($case:ident($install:expr)),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $case() {
                    let f = crate::common::Fixture::sqlite($install).await;
                    crate::$case(&f).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $case() {
                    let Some(f) = crate::common::Fixture::postgres($install).await else {
                        return;
                    };
                    crate::$case(&f).await;
                }
            )*
        }
        mod mysql {
            $(
                #[tokio::test]
                async fn $case() {
                    let Some(f) = crate::common::Fixture::mysql($install).await else {
                        return;
                    };
                    crate::$case(&f).await;
                }
            )*
        }
        mod dynamodb {
            $(
                #[tokio::test]
                async fn $case() {
                    let Some(f) = crate::common::Fixture::dynamodb($install).await else {
                        return;
                    };
                    crate::$case(&f).await;
                }
            )*
        }
    };
}

on_every_backend!(
    stats_prints_counts_as_a_table_and_json(true),
    stats_watch_refreshes_a_bounded_number_of_times(true),
    dead_list_pages_either_way_and_filters(true),
    dead_show_prints_one_dead_letter(true),
    unknown_ids_fail_and_change_nothing(true),
    requeue_by_id_asks_first(true),
    requeue_all_for_a_destination_goes_in_batches(true),
    discard_by_id_and_all(true),
    purge_dry_run_counts_and_purge_deletes_in_batches(true),
    schema_print_and_install(false),
    a_missing_table_is_a_schema_error_with_a_hint(false),
    dedup_purge_deletes_expired_records(true),
);

async fn stats_prints_counts_as_a_table_and_json(f: &Fixture) {
    f.seed().await;
    let run = f.run(&["stats"]);
    run.expect(0);
    let rows = cells(&run.stdout);
    let value = |label: &str| -> String {
        rows.iter()
            .find(|r| r.join(" ").starts_with(label))
            .and_then(|r| r.last().cloned())
            .unwrap_or_else(|| panic!("no {label} row in\n{}", run.stdout))
    };
    assert_eq!(value("pending"), "1");
    assert_eq!(value("in flight"), "1");
    assert_eq!(value("dead"), "5");
    assert_eq!(value("dispatched (kept)"), "2");
    assert!(run.stdout.contains("oldest pending"), "{}", run.stdout);
    assert!(run.stderr.is_empty(), "{}", run.stderr);

    let json = f.run(&["stats", "--json"]).expect(0).json();
    assert_eq!(json["pending"], 1);
    assert_eq!(json["in_flight"], 1);
    assert_eq!(json["dead"], 5);
    assert_eq!(json["dispatched"], 2);
    assert!(json["oldest_pending_age_ms"].is_u64(), "{json}");
    assert!(json["at"].as_str().unwrap().ends_with('Z'));
}

async fn stats_watch_refreshes_a_bounded_number_of_times(f: &Fixture) {
    f.seed().await;
    let run = f.run(&["stats", "--watch", "--count", "3", "--interval", "0s"]);
    run.expect(0);
    let rows = cells(&run.stdout);
    assert_eq!(
        rows.len(),
        4,
        "a header and three readings:\n{}",
        run.stdout
    );
    assert_eq!(rows[0][0], "TIME");
    for row in &rows[1..] {
        assert_eq!(&row[1..5], ["1", "1", "5", "2"], "{}", run.stdout);
    }
    let run = f.run(&["stats", "-w", "--count", "2", "--interval", "0s", "--json"]);
    let lines: Vec<serde_json::Value> = run
        .expect(0)
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "one JSON document per reading");
    assert!(lines.iter().all(|j| j["dead"] == 5));
}

async fn purge_dry_run_counts_and_purge_deletes_in_batches(f: &Fixture) {
    let seed = f.seed().await;
    let none = f.run(&["purge", "--older-than", "1h", "--dry-run"]);
    none.expect(0);
    assert!(
        none.stdout
            .starts_with("dry run: would purge 0 dispatched messages completed more than 1h ago"),
        "{}",
        none.stdout
    );
    let dry = f
        .run(&["purge", "--older-than", "0s", "--dry-run", "--json"])
        .expect(0)
        .json();
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["purged"], 2);
    seed.check(&f.stats().await);

    let run = f.run(&["purge", "--older-than", "0s", "--batch", "1"]);
    run.expect(0);
    assert!(
        run.stdout.starts_with("purged 2 dispatched messages"),
        "{}",
        run.stdout
    );
    assert!(
        run.stderr.contains("purged 1 so far (1 batch)"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("purged 2 so far (2 batches)"),
        "{}",
        run.stderr
    );
    let stats = f.stats().await;
    assert_eq!(
        (stats.pending, stats.in_flight, stats.dead, stats.dispatched),
        (1, 1, 5, 0),
        "only dispatched history goes"
    );
    let json = f
        .run(&["purge", "--older-than", "0s", "--json"])
        .expect(0)
        .json();
    assert_eq!(
        (json["purged"].as_u64(), json["batches"].as_u64()),
        (Some(0), Some(1))
    );
    let missing = f.run(&["purge"]);
    missing.expect(2);
    assert!(
        missing.stderr.contains("--older-than"),
        "{}",
        missing.stderr
    );
}

async fn schema_print_and_install(f: &Fixture) {
    let print = f.run(&["schema", "print"]);
    print.expect(0);
    assert_eq!(print.stdout.trim_end(), f.ddl().trim_end());
    let json = f.run(&["schema", "print", "--json"]).expect(0).json();
    assert_eq!(json["ddl"].as_str().unwrap(), f.ddl());
    let inbox = f
        .run(&["schema", "print", "--inbox"])
        .expect(0)
        .stdout
        .clone();
    assert!(inbox.contains(f.inbox_table()), "{inbox}");

    let install = f.run(&["schema", "install"]);
    install.expect(0);
    assert!(
        install.stdout.starts_with("installed "),
        "{}",
        install.stdout
    );
    assert!(
        install
            .stdout
            .contains(&format!("(layout version {})", f.layout_version())),
        "{}",
        install.stdout
    );
    f.run(&["schema", "install"]).expect(0);
    let stats = f.run(&["stats", "--json"]).expect(0).json();
    assert_eq!(stats["pending"], 0);
    let json = f
        .run(&["schema", "install", "--inbox", "--json"])
        .expect(0)
        .json();
    assert_eq!(json["installed"], true);
    let purge = f
        .run(&["dedup", "purge", "--older-than", "1h"])
        .expect(0)
        .stdout
        .clone();
    assert!(
        purge.starts_with("purged 0 dedup records older than 1h from "),
        "{purge}"
    );
}

async fn a_missing_table_is_a_schema_error_with_a_hint(f: &Fixture) {
    for args in [
        &["stats"][..],
        &["dead", "list"],
        &["purge", "--older-than", "1d", "--dry-run"],
        &["dead", "requeue", "--all", "--yes"],
    ] {
        let run = f.run(args);
        run.expect(1);
        assert!(run.stdout.is_empty(), "{args:?}: {}", run.stdout);
        assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
        assert!(
            run.stderr.contains("hint: is the outbox installed there?")
                && run.stderr.contains("`outbox schema install`"),
            "{args:?}: {}",
            run.stderr
        );
    }
    let run = f.run(&["--table", "elsewhere", "stats"]);
    run.expect(1);
    assert!(
        run.stderr.contains("elsewhere"),
        "names the table: {}",
        run.stderr
    );
    let run = f.run(&["dedup", "purge", "--older-than", "7d"]);
    run.expect(1);
    assert!(
        run.stderr.contains("`outbox schema install --inbox`"),
        "{}",
        run.stderr
    );
    let run = f.run(&["--table", "bad name!", "stats"]);
    run.expect(2);
    assert!(run.stderr.contains("bad name!"), "{}", run.stderr);
    // Nothing was created by any of it.
    let print = f.run(&["stats"]);
    print.expect(1);
}

async fn dedup_purge_deletes_expired_records(f: &Fixture) {
    f.run(&["schema", "install", "--inbox"]).expect(0);
    let inbox = f.inbox(Duration::from_secs(3600));
    let consumer = ConsumerName::new("billing").unwrap();
    let ids: Vec<MessageId> = (0..3).map(|_| MessageId::new()).collect();
    for id in &ids {
        let _ = inbox.record(&consumer, *id).await.unwrap();
    }
    let keep = f.run(&["dedup", "purge", "--older-than", "1h"]);
    keep.expect(0);
    assert!(
        keep.stdout.starts_with("purged 0 dedup records"),
        "{}",
        keep.stdout
    );
    for id in &ids {
        assert!(
            inbox.contains(&consumer, *id).await.unwrap(),
            "young records stay"
        );
    }
    // On DynamoDB a record carries the expiry its consumer wrote with it, which
    // `--older-than` does not move: records written with a short retention expire.
    // Elsewhere, starting a process takes longer than a millisecond, so by then every
    // record is older than that.
    let old = if f.expiry_written_with_records() {
        let short = f.inbox(Duration::from_millis(1));
        let old: Vec<MessageId> = (0..3).map(|_| MessageId::new()).collect();
        for id in &old {
            let _ = short.record(&consumer, *id).await.unwrap();
        }
        old
    } else {
        ids.clone()
    };
    let run = f.run(&[
        "dedup",
        "purge",
        "--older-than",
        "1ms",
        "--batch",
        "2",
        "--json",
    ]);
    let json = run.expect(0).json();
    assert_eq!(
        (json["purged"].as_u64(), json["batches"].as_u64()),
        (Some(3), Some(2))
    );
    assert!(
        run.stderr.contains("purged 2 so far (1 batch)"),
        "{}",
        run.stderr
    );
    let fresh = f.inbox(Duration::from_secs(3600));
    for id in &old {
        assert!(!fresh.contains(&consumer, *id).await.unwrap(), "purged");
    }
    let zero = f.run(&["dedup", "purge", "--older-than", "0s"]);
    zero.expect(2);
    assert!(zero.stderr.contains("retention"), "{}", zero.stderr);
}
