//! Offline checks of the lock and index hints every statement must carry, or must not:
//! no range locks anywhere (statements and source), every claim's reads pinned to an
//! index and its locking read `WITH (UPDLOCK, READPAST, ROWLOCK)`, per-key heads picked
//! before any update lock, `READCOMMITTEDLOCK` where row versions would be wrong, the
//! dedup insert without a range lock, `stats` reading covering indexes past locks, and
//! the session reset on check-out. The statements are `statement_tests`' list.

use std::time::Duration;

use outbox_core::KeyOrder;

use crate::claim::{self, HEAD_PROBE_LOCKS, HEAD_SCAN_LOCKS, UPDATE_LOCKS};
use crate::session::{check_out, DEFAULT_LOCK_TIMEOUT, IDENTITY, SESSION_OPTIONS};
use crate::statement_tests::{every_statement, id, name};
use crate::{admin, dedup, entity, schema, sql::Stmt};

/// The table of `statement_tests::name()`, as statements write it.
const TABLE: &str = "[obx_s].[obx_t]";

/// Hints that take or keep range locks (or hold shared locks to the end of the
/// transaction), spelled so that this file does not contain them.
fn range_lock_hints() -> [String; 3] {
    [
        ["HOLD", "LOCK"].concat(),
        ["SERIAL", "IZABLE"].concat(),
        ["REPEATABLE", "READ"].concat(),
    ]
}

fn claims() -> Vec<(&'static str, Stmt)> {
    let t = name();
    let ids = [id(1), id(2), id(3)];
    vec![
        (
            "unordered",
            claim::claim(&t, KeyOrder::Unordered, 10, 1, id(7), None),
        ),
        (
            "per key",
            claim::claim(&t, KeyOrder::PerKey, 10, 1, id(7), None),
        ),
        (
            "unordered ids",
            claim::claim(&t, KeyOrder::Unordered, 3, 1, id(7), Some(&ids)),
        ),
        (
            "per key ids",
            claim::claim(&t, KeyOrder::PerKey, 3, 1, id(7), Some(&ids)),
        ),
    ]
}

/// What follows each reference to the table in `sql` (up to the next `WHERE`, `ON`,
/// `INNER` or `OUTPUT`): its alias and hints.
fn references(sql: &str) -> Vec<&str> {
    sql.match_indices(TABLE)
        .map(|(at, _)| {
            let rest = &sql[at + TABLE.len()..];
            let end = [" WHERE ", " ON ", " INNER ", " OUTPUT "]
                .iter()
                .filter_map(|stop| rest.find(stop))
                .min()
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

#[test]
fn no_statement_takes_range_locks() {
    for (what, _, stmt) in every_statement() {
        let upper = stmt.sql.to_uppercase();
        for hint in range_lock_hints() {
            assert!(
                !upper.contains(&hint),
                "{what} asks for {hint}: {}",
                stmt.sql
            );
        }
    }
}

/// Every line of the crate's source that is not a comment: no statement text, built
/// anywhere, can ask for a range lock. (Comments may name the hints to explain why
/// they are not used.)
#[test]
fn the_crate_source_never_asks_for_range_locks() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
    let mut files = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            let upper = line.to_uppercase();
            for hint in range_lock_hints() {
                assert!(
                    !upper.contains(&hint),
                    "{}:{}: {line}",
                    path.display(),
                    n + 1
                );
            }
        }
    }
    assert!(files >= 15, "read the crate's source files ({files})");
}

/// The plan suite's promise, by statement shape (no server here to show plans): every
/// statement of the relay path and of purges reaches the outbox table only through a
/// seek on a named index, so no statistics can make it scan history or lock rows it
/// does not change. Settles, fails, dead-lettering, releases and changes by id seek
/// the primary key; purges seek the index of the time they bound.
#[test]
fn every_relay_and_purge_statement_seeks_a_named_index() {
    let by_pk = [
        "complete (delete)",
        "complete (keep)",
        "release",
        "fail",
        "dead-letter claimed",
        "release claim",
        "requeue ids",
        "discard ids",
    ];
    let by_time = [
        ("purge dispatched", "dispatched"),
        ("dedup purge", "processed_at"),
    ];
    let all = every_statement();
    let find = |what: &str| {
        all.iter()
            .find(|(w, _, _)| *w == what)
            .map(|(_, _, stmt)| stmt.sql.clone())
            .or_else(|| (what == "dedup purge").then(|| dedup::purge(&name(), 5, 10).sql))
            .unwrap_or_else(|| panic!("no statement {what}"))
    };
    let pinned = |what: &str, sql: &str, index: &str| {
        let refs = references(sql);
        assert_eq!(refs.len(), 1, "{what} reads the table once: {sql}");
        assert!(
            refs[0].contains(&format!(
                " WITH (INDEX([obx_t_{index}]), FORCESEEK, ROWLOCK"
            )),
            "{what} seeks [obx_t_{index}]: {sql}"
        );
    };
    for what in by_pk {
        let sql = find(what);
        pinned(what, &sql, "pk");
        assert!(
            sql.contains("m.id = l.id") || sql.contains("id IN ("),
            "{what} joins on id"
        );
    }
    for (what, index) in by_time {
        let sql = find(what);
        pinned(what, &sql, index);
        assert!(sql.contains("READPAST"), "{what} skips locked rows");
    }
    for (what, stmt) in claims() {
        for reference in references(&stmt.sql) {
            assert!(reference.contains("]), FORCESEEK, "), "{what}: {reference}");
        }
    }
}

#[test]
fn every_claim_pins_every_read_and_locks_with_the_claim_hints() {
    for (what, stmt) in claims() {
        let refs = references(&stmt.sql);
        assert!(!refs.is_empty(), "{what}");
        for reference in &refs {
            // ` AS c WITH (INDEX([obx_t_due]), FORCESEEK, ...`
            let hints = reference.split_once(" WITH (").map(|(_, h)| h);
            let hints = hints.unwrap_or_else(|| panic!("{what}: unhinted {reference}"));
            assert!(hints.starts_with("INDEX([obx_t_"), "{what}: {reference}");
            assert!(hints.contains("]), FORCESEEK, "), "{what}: {reference}");
        }
        // Exactly one read takes update locks, and it is the claim's.
        assert_eq!(stmt.sql.matches("UPDLOCK").count(), 1, "{what}");
        assert_eq!(
            stmt.sql
                .matches(&format!("FORCESEEK, {UPDATE_LOCKS})"))
                .count(),
            1,
            "{what}: {}",
            stmt.sql
        );
        assert!(stmt.sql.contains("OUTPUT INSERTED.id"), "{what}");
        assert!(stmt.sql.contains("DELETED.available_at"), "{what}");
        assert!(
            stmt.sql.contains("THEN 2147483647 ELSE"),
            "{what}: attempts saturate"
        );
        assert!(
            stmt.sql
                .contains("c.dispatched_at IS NULL AND c.dead_at IS NULL AND c.available_at <= SYSUTCDATETIME()"),
            "{what}: the due index's filter, verbatim"
        );
    }
    assert_eq!(UPDATE_LOCKS, "UPDLOCK, READPAST, ROWLOCK");
}

#[test]
fn unordered_claims_lock_only_the_rows_they_take() {
    let sql = &claims()[0].1.sql;
    assert!(
        sql.starts_with(
            "WITH due AS (SELECT TOP (@P1) c.* FROM [obx_s].[obx_t] AS c \
             WITH (INDEX([obx_t_due]), FORCESEEK, UPDLOCK, READPAST, ROWLOCK) \
             WHERE c.dispatched_at IS NULL AND c.dead_at IS NULL \
             AND c.available_at <= SYSUTCDATETIME() ORDER BY c.available_at, c.seq) \
             UPDATE due SET "
        ),
        "{sql}"
    );
    assert!(!sql.contains("partition_key ="), "no head probe: {sql}");
}

#[test]
fn per_key_heads_are_picked_before_any_update_lock() {
    for (what, stmt) in claims()
        .into_iter()
        .filter(|(w, _)| w.starts_with("per key"))
    {
        let sql = &stmt.sql;
        let (heads, update) = sql
            .split_once(") UPDATE m SET ")
            .unwrap_or_else(|| panic!("{what}: two passes: {sql}"));
        // Pass 1: no update lock; candidates read past locks; the probe waits.
        assert!(
            heads.starts_with("WITH heads AS (SELECT TOP (@P1) c.id FROM "),
            "{what}"
        );
        assert!(!heads.contains("UPDLOCK"), "{what}: {heads}");
        assert!(
            heads.contains(&format!("FORCESEEK, {HEAD_SCAN_LOCKS}) ")),
            "{what}: {heads}"
        );
        let probe = format!(
            "(c.partition_key IS NULL OR c.seq = (SELECT TOP (1) e.seq FROM {TABLE} AS e \
             WITH (INDEX([obx_t_key]), FORCESEEK, {HEAD_PROBE_LOCKS}) \
             WHERE e.partition_key = c.partition_key AND e.dispatched_at IS NULL \
             AND e.dead_at IS NULL AND e.partition_key IS NOT NULL ORDER BY e.seq))"
        );
        assert!(heads.contains(&probe), "{what}: {heads}");
        assert!(heads.ends_with("ORDER BY c.available_at, c.seq"), "{what}");
        // Pass 2: only the heads, by primary key, checked again under the lock.
        assert!(
            update.contains(&format!(
                "FROM {TABLE} AS m WITH (INDEX([obx_t_pk]), FORCESEEK, {UPDATE_LOCKS}) \
                 INNER JOIN heads AS h ON m.id = h.id \
                 WHERE COALESCE(m.dispatched_at, m.dead_at) IS NULL \
                 AND m.available_at <= SYSUTCDATETIME();"
            )),
            "{what}: {update}"
        );
    }
    // A probe that read past locks would skip an uncommitted earlier row of the key.
    assert!(!HEAD_PROBE_LOCKS.contains("READPAST"));
    assert!(HEAD_PROBE_LOCKS.contains("READCOMMITTEDLOCK"));
    assert!(HEAD_SCAN_LOCKS.contains("READCOMMITTEDLOCK"));
    // Without ids the candidates come from the due index; with ids, by primary key.
    let per_key = &claims()[1].1.sql;
    assert!(per_key.contains(&format!(
        "FROM {TABLE} AS c WITH (INDEX([obx_t_due]), FORCESEEK, {HEAD_SCAN_LOCKS}) WHERE"
    )));
    let by_ids = &claims()[3].1.sql;
    assert!(by_ids.contains(&format!(
        "FROM OPENJSON(@P4) AS j INNER JOIN {TABLE} AS c \
         WITH (INDEX([obx_t_pk]), FORCESEEK, {HEAD_SCAN_LOCKS}) \
         ON c.id = CONVERT(binary(16), j.[value], 2) WHERE"
    )));
}

#[test]
fn claims_by_ids_are_one_plan_whatever_their_number() {
    let t = name();
    for ordering in [KeyOrder::Unordered, KeyOrder::PerKey] {
        let one = claim::claim(&t, ordering, 1, 1, id(7), Some(&[id(1)]));
        let many: Vec<[u8; 16]> = (0..2000u16)
            .map(|n| id(u8::try_from(n % 250).unwrap()))
            .collect();
        let more = claim::claim(&t, ordering, many.len(), 1, id(7), Some(&many));
        assert_eq!(
            one.sql, more.sql,
            "{ordering:?}: the text must not grow with the ids"
        );
        assert_eq!(one.params.len(), more.params.len());
        assert!(one.sql.contains("OPENJSON(@P"), "{}", one.sql);
        assert!(!one.sql.contains(" IN ("), "{}", one.sql);
    }
    let unordered = claim::claim(&t, KeyOrder::Unordered, 1, 1, id(7), Some(&[id(1)])).sql;
    assert!(unordered.contains(&format!(
        "FROM {TABLE} AS c WITH (INDEX([obx_t_pk]), FORCESEEK, {UPDATE_LOCKS}) \
         INNER JOIN OPENJSON(@P3) AS j ON c.id = CONVERT(binary(16), j.[value], 2) WHERE"
    )));
}

#[test]
fn dedup_records_without_a_range_lock_and_reports_duplicates_without_raising() {
    let sql = dedup::record(&name(), "c", id(1), 1).sql;
    let (refresh, insert) = sql.split_once("; BEGIN TRY ").unwrap();
    assert!(refresh.starts_with(&format!("UPDATE {TABLE} SET processed_at = ")));
    let (tried, caught) = insert.split_once(" END TRY BEGIN CATCH ").unwrap();
    assert!(tried.starts_with("INSERT INTO "), "{tried}");
    assert!(
        tried.contains(&format!(
            "WHERE NOT EXISTS (SELECT 1 FROM {TABLE} WITH (READCOMMITTEDLOCK) \
             WHERE consumer = @P1 AND message_id = CAST(@P2 AS binary(16)));"
        )),
        "{tried}"
    );
    // The duplicate of a racing insert is swallowed unless the transaction is doomed.
    assert_eq!(
        caught,
        "IF ERROR_NUMBER() NOT IN (2627, 2601) OR XACT_STATE() = -1 THROW; END CATCH;"
    );
    assert_eq!(dedup::DUPLICATE_KEY, [2627, 2601]);
    assert!(!sql.contains("UPDLOCK"), "{sql}");
}

#[test]
fn entity_creates_take_no_range_lock() {
    let sql = entity::create(&name(), "k", "{}".into(), "{}".into()).sql;
    assert!(sql.contains(&format!(
        "WHERE NOT EXISTS (SELECT 1 FROM {TABLE} WITH (READCOMMITTEDLOCK) WHERE entity_key = @P1);"
    )));
    assert!(!sql.contains("UPDLOCK"));
}

#[test]
fn stats_read_covering_indexes_past_locks() {
    let sql = admin::stats(&name()).sql;
    let refs = references(&sql);
    assert_eq!(refs.len(), 3, "{sql}");
    for (reference, index) in refs.iter().zip(["dead", "dispatched", "due"]) {
        assert_eq!(
            *reference,
            format!(" WITH (INDEX([obx_t_{index}]), READCOMMITTEDLOCK, READPAST, ROWLOCK)"),
            "{sql}"
        );
    }
    // What the undelivered count reads is inside `<table>_due` (key or included).
    let ddl = schema::outbox_ddl(&name());
    let due = index_line(&ddl, "due");
    for column in [
        "available_at",
        "lease_token",
        "created_at",
        "dispatched_at",
        "dead_at",
    ] {
        assert!(due.contains(column), "{column}: {due}");
        assert!(sql.contains(column));
    }
    let dead = index_line(&ddl, "dead");
    assert!(dead.contains("INCLUDE (dead_at)"), "{dead}");
}

#[test]
fn the_per_key_first_pass_reads_only_the_due_index() {
    // Everything pass 1 reads from a candidate, so it needs no lookup into the table
    // (where it would lock table rows as well).
    let ddl = schema::outbox_ddl(&name());
    let due = index_line(&ddl, "due");
    for column in [
        "id",
        "partition_key",
        "seq",
        "available_at",
        "dispatched_at",
        "dead_at",
    ] {
        assert!(
            due.contains(&format!("({column},"))
                || due.contains(&format!(" {column},"))
                || due.contains(&format!(" {column})")),
            "{column}: {due}"
        );
    }
}

#[test]
fn admin_changes_by_filter_are_pinned_to_the_dead_letter_index() {
    let filter = outbox_core::DeadLetterFilter::default();
    for change in [admin::DeadChange::Requeue, admin::DeadChange::Discard] {
        let sql = admin::change_dead_matching(&name(), change, &filter, 10).sql;
        assert!(sql.contains(&format!(
            "FROM {TABLE} WITH (INDEX([obx_t_dead]), {UPDATE_LOCKS}) WHERE dead_at IS NOT NULL"
        )));
    }
}

#[test]
fn check_out_resets_the_session() {
    let sql = check_out(Some(DEFAULT_LOCK_TIMEOUT), Some("app]db"));
    assert!(
        sql.starts_with(
            "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION; \
             BEGIN TRY REVERT; REVERT; REVERT; REVERT; END TRY BEGIN CATCH END CATCH; \
             USE [app]]db]; "
        ),
        "{sql}"
    );
    assert!(sql.ends_with(IDENTITY), "{sql}");
    for part in [
        "SET DEADLOCK_PRIORITY NORMAL;",
        "SET CONTEXT_INFO 0x;",
        "SET IMPLICIT_TRANSACTIONS OFF;",
        "SET TRANSACTION ISOLATION LEVEL READ COMMITTED;",
        "SET XACT_ABORT OFF;",
        "SET LOCK_TIMEOUT 10000;",
        // The options an INSERT into a table with filtered indexes needs (error 1934
        // otherwise), at the values it needs.
        "SET ANSI_WARNINGS ON;",
        "SET CONCAT_NULL_YIELDS_NULL ON;",
        "SET ARITHABORT ON;",
        "SET NUMERIC_ROUNDABORT OFF;",
        "SET QUOTED_IDENTIFIER ON;",
        "SET ANSI_NULLS ON;",
        "SET ANSI_PADDING ON;",
        // And those that change what statements return.
        "SET NOCOUNT OFF;",
        "SET ROWCOUNT 0;",
        "SET TEXTSIZE 2147483647;",
    ] {
        assert!(sql.contains(part), "{part} in {sql}");
    }
    assert_eq!(sql.matches("SET ").count(), 6 + SESSION_OPTIONS.len());
    // Restored before anything else runs: impersonation, then the database.
    assert!(sql.find("REVERT").unwrap() < sql.find("USE ").unwrap());
    assert!(sql.find("USE ").unwrap() < sql.find("SET ").unwrap());
    assert!(!check_out(None, None).contains("USE "));
    assert!(check_out(None, None).contains("SET LOCK_TIMEOUT -1;"));
    assert!(check_out(Some(Duration::from_millis(1500)), None).contains("SET LOCK_TIMEOUT 1500;"));
}

/// The `CREATE INDEX` line of the test outbox's index `obx_t_<suffix>` in `ddl`.
fn index_line<'a>(ddl: &'a str, suffix: &str) -> &'a str {
    let create = format!("CREATE INDEX [obx_t_{suffix}]");
    ddl.lines()
        .find(|l| l.contains(&create))
        .unwrap_or_else(|| panic!("no {create} in the DDL"))
}
