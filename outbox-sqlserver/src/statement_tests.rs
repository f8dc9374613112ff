//! Offline checks of every statement the crate sends (no server needed): each is
//! parsed by a maintained T-SQL parser (`sqlparser` with `MsSqlDialect`), identifiers
//! are bracket-quoted, values are bound (a quote, a bracket and `--` planted in every
//! value never reach the text), and batches stay within SQL Server's parameter limit.
//! The lock and index hints each statement must (or must not) carry are checked in
//! `hint_tests.rs`, on the same list of statements.

use std::time::Duration;

use outbox_core::{DeadLetterFilter, DeadLetterOrder, KeyOrder, MessageId};
use sqlparser::dialect::MsSqlDialect;
use sqlparser::parser::Parser;

use crate::admin::{self, DeadChange};
use crate::claim;
use crate::ident::QualifiedName;
use crate::session::{check_out, BEGIN, COMMIT, DEFAULT_LOCK_TIMEOUT, IDENTITY, ROLLBACK_IF_OPEN};
use crate::sql::{self, FailRow, NewRow, Param, Settle, Stmt};
use crate::{dedup, entity, install, lock, schema};

/// Planted in every value: a quote, a bracket, a comment opener and a statement end.
const EVIL: &str = "x'y]z--w;\"q";

pub(crate) fn name() -> QualifiedName {
    QualifiedName::new("obx_s", "obx_t").unwrap()
}

pub(crate) fn id(n: u8) -> [u8; 16] {
    let mut id = *MessageId::new().as_uuid().as_bytes();
    id[15] = n;
    id
}

fn evil_row(n: u8) -> NewRow {
    NewRow {
        id: id(n),
        destination: format!("dest-{EVIL}"),
        partition_key: Some(format!("key-{EVIL}")),
        payload: EVIL.as_bytes().to_vec(),
        content_type: Some(format!("ct-{EVIL}")),
        headers: serde_json::json!({ "h": EVIL }).to_string(),
        delay_us: 5,
    }
}

fn evil_filter() -> DeadLetterFilter {
    DeadLetterFilter::default()
        .with_destination(format!("d-{EVIL}"))
        .unwrap()
        .with_dead_for(Duration::from_secs(60))
        .with_ids([MessageId::new(), MessageId::new()])
        .unwrap()
}

/// Every statement builder of the crate, with evil values wherever it takes one.
/// `true` marks builders that bind at least one text value (where EVIL must appear
/// among the parameters).
pub(crate) fn every_statement() -> Vec<(&'static str, bool, Stmt)> {
    let t = name();
    let ids = [id(1), id(2), id(3)];
    let leases = [(id(1), id(9)), (id(2), id(8))];
    let fails = [FailRow {
        id: id(1),
        token: id(2),
        error: format!("boom {EVIL}"),
        dead: false,
        retry_us: 1_000_000,
    }];
    let filter = evil_filter();
    let mut all = vec![
        (
            "claim",
            false,
            claim::claim(&t, KeyOrder::Unordered, 10, 30_000_000, id(7), None),
        ),
        (
            "claim per key",
            false,
            claim::claim(&t, KeyOrder::PerKey, 10, 30_000_000, id(7), None),
        ),
        (
            "claim ids",
            false,
            claim::claim(&t, KeyOrder::Unordered, 3, 30_000_000, id(7), Some(&ids)),
        ),
        (
            "claim ids per key",
            false,
            claim::claim(&t, KeyOrder::PerKey, 3, 30_000_000, id(7), Some(&ids)),
        ),
        (
            "enqueue",
            true,
            sql::enqueue(&t, &[evil_row(1), evil_row(2)]),
        ),
        ("stored ids", false, sql::stored_ids(&t, &ids)),
        ("delete ids", false, sql::delete_ids(&t, &ids)),
        (
            "complete (delete)",
            false,
            sql::settle(&t, Settle::Delete, &leases),
        ),
        (
            "complete (keep)",
            false,
            sql::settle(&t, Settle::Dispatch, &leases),
        ),
        ("release", false, sql::settle(&t, Settle::Release, &leases)),
        ("fail", true, sql::fail(&t, &fails)),
        (
            "dead-letter claimed",
            true,
            sql::dead_letter_claimed(&t, id(7), &[(id(1), format!("poison {EVIL}"))]),
        ),
        ("release claim", false, sql::release_claim(&t, id(7), &ids)),
        (
            "dead letters asc",
            true,
            admin::dead_letters(&t, &filter, DeadLetterOrder::Ascending, 10, None),
        ),
        (
            "dead letters asc after",
            true,
            admin::dead_letters(&t, &filter, DeadLetterOrder::Ascending, 10, Some(id(1))),
        ),
        (
            "dead letters desc after",
            true,
            admin::dead_letters(&t, &filter, DeadLetterOrder::Descending, 10, Some(id(1))),
        ),
        (
            "dead letters unfiltered",
            false,
            admin::dead_letters(
                &t,
                &DeadLetterFilter::default(),
                DeadLetterOrder::Ascending,
                10,
                None,
            ),
        ),
        ("count dead", true, admin::count_dead(&t, &filter)),
        (
            "requeue ids",
            false,
            admin::change_dead_ids(&t, DeadChange::Requeue, &ids),
        ),
        (
            "discard ids",
            false,
            admin::change_dead_ids(&t, DeadChange::Discard, &ids),
        ),
        (
            "requeue matching",
            true,
            admin::change_dead_matching(&t, DeadChange::Requeue, &filter, 100),
        ),
        (
            "discard matching",
            true,
            admin::change_dead_matching(&t, DeadChange::Discard, &filter, 100),
        ),
        (
            "purge dispatched",
            false,
            admin::purge_dispatched(&t, 1_000, 100),
        ),
        (
            "count dispatched",
            false,
            admin::count_dispatched(&t, 1_000),
        ),
        ("stats", false, admin::stats(&t)),
        ("stats by index size", false, admin::stats_by_index_size(&t)),
        ("lock escalation", false, install::lock_escalation(&t)),
        ("install lock", true, install::install_lock(&t)),
        ("installed version", true, install::installed_version(&t)),
        ("record version", true, install::record_version(&t, 2)),
        (
            "dedup record",
            true,
            dedup::record(&t, &format!("c-{EVIL}"), id(1), 1_000_000),
        ),
        (
            "dedup contains",
            true,
            dedup::contains(&t, &format!("c-{EVIL}"), id(1), 1_000_000),
        ),
        ("dedup purge", false, dedup::purge(&t, 1_000_000, 100)),
        ("entity load", true, entity::load(&t, &format!("k-{EVIL}"))),
        (
            "entity create",
            true,
            entity::create(
                &t,
                &format!("k-{EVIL}"),
                serde_json::json!({"s": EVIL}).to_string(),
                "{}".to_owned(),
            ),
        ),
        (
            "entity replace",
            true,
            entity::replace(
                &t,
                &format!("k-{EVIL}"),
                serde_json::json!({"s": EVIL}).to_string(),
                "{}".to_owned(),
                3,
            ),
        ),
        ("lock", true, lock::try_lock(&format!("l-{EVIL}"))),
        ("unlock", true, lock::unlock(&format!("l-{EVIL}"))),
        (
            "pool check-out",
            false,
            Stmt::text(check_out(Some(DEFAULT_LOCK_TIMEOUT), Some("app"))),
        ),
        (
            "pool check-out, no time-out",
            false,
            Stmt::text(check_out(None, None)),
        ),
        ("session identity", false, Stmt::text(IDENTITY)),
        (
            "showplan on",
            false,
            Stmt::text(crate::showplan::SHOWPLAN_ON),
        ),
        ("begin", false, Stmt::text(BEGIN)),
        ("commit", false, Stmt::text(COMMIT)),
        ("rollback if open", false, Stmt::text(ROLLBACK_IF_OPEN)),
        ("install begin", false, Stmt::text(install::INSTALL_BEGIN)),
        ("settings begin", false, Stmt::text(install::SETTINGS_BEGIN)),
    ];
    for (what, ddl) in [
        ("outbox ddl", schema::outbox_ddl(&t)),
        ("inbox ddl", schema::inbox_ddl(&t)),
        ("entity ddl", schema::entity_ddl(&t)),
    ] {
        all.push((what, false, Stmt::text(ddl)));
    }
    all
}

fn parses(sql: &str) -> Result<(), String> {
    Parser::parse_sql(&MsSqlDialect {}, sql)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Statements `sqlparser` 0.64's `MsSqlDialect` cannot parse, with the reason. Each is
/// valid T-SQL; [`unparsed_statements_still_hold_what_they_must`] checks their shape.
const UNPARSED: &[(&str, &str)] = &[
    (
        "complete (delete)",
        "`DELETE alias OUTPUT ... FROM table AS alias JOIN ...` (T-SQL's DELETE with a \
         FROM clause and OUTPUT) is not supported by the parser",
    ),
    (
        "discard ids",
        "`DELETE FROM alias FROM table AS alias ...` (T-SQL's DELETE with a FROM clause) \
         is not supported by the parser",
    ),
    (
        "purge dispatched",
        "`DELETE TOP (n) FROM ...` is not supported by the parser",
    ),
    (
        "dedup purge",
        "`DELETE TOP (n) FROM ...` is not supported by the parser",
    ),
    (
        "pool check-out",
        "the parser does not know `BEGIN TRY ... END TRY BEGIN CATCH END CATCH` with \
         `REVERT` (the `SET`s and the identity read are checked in `hint_tests`)",
    ),
    ("pool check-out, no time-out", "as \"pool check-out\""),
    (
        "dedup record",
        "the parser reads `BEGIN TRY` as a statement of its own that must end with `;`, \
         which T-SQL does not require (each part is parsed on its own instead)",
    ),
];

/// Parts of the outbox DDL the parser does not support, each replaced by what it does
/// support before parsing (and checked to be present): the computed column
/// (`bucket AS ... PERSISTED`, taken out) and the `CLUSTERED` keyword of `CREATE
/// UNIQUE CLUSTERED INDEX`.
const DDL_UNPARSED: &[(&str, &str)] = &[
    (
        "    bucket AS CAST(CAST(SUBSTRING(id, 16, 1) AS int) % 16 AS tinyint) PERSISTED NOT NULL,\n",
        "",
    ),
    ("CREATE UNIQUE CLUSTERED INDEX", "CREATE UNIQUE INDEX"),
];

#[test]
fn every_statement_parses_as_t_sql_except_the_listed_ones() {
    let mut failures = Vec::new();
    for (what, _, stmt) in every_statement() {
        let sql = DDL_UNPARSED
            .iter()
            .fold(stmt.sql.clone(), |sql, (from, to)| sql.replace(from, to));
        let listed = UNPARSED.iter().any(|(name, _)| *name == what);
        match (parses(&sql), listed) {
            (Ok(()), false) => {}
            (Err(e), true) => eprintln!("not parsed, as listed: {what}: {e}"),
            (Ok(()), true) => failures.push(format!("{what} parses now: take it off UNPARSED")),
            (Err(e), false) => failures.push(format!("{what}: {e}\n{}", stmt.sql)),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    for (part, _) in DDL_UNPARSED {
        assert!(schema::outbox_ddl(&name()).contains(part), "{part}");
    }
}

#[test]
fn unparsed_statements_still_hold_what_they_must() {
    let t = name();
    let complete = sql::settle(&t, Settle::Delete, &[(id(1), id(2))]).sql;
    assert!(complete.starts_with("DELETE m OUTPUT DELETED.id FROM [obx_s].[obx_t] AS m WITH (INDEX([obx_t_pk]), FORCESEEK, ROWLOCK) INNER JOIN (VALUES (CAST(@P1 AS binary(16)), CAST(@P2 AS binary(16)))) AS l(id, token) ON m.id = l.id AND m.lease_token = l.token WHERE COALESCE(m.dispatched_at, m.dead_at) IS NULL"), "{complete}");
    // The same statement as an UPDATE parses: the join, fence and OUTPUT are the
    // parser-checked part.
    let keep = sql::settle(&t, Settle::Dispatch, &[(id(1), id(2))]).sql;
    assert_eq!(
        complete.split(" FROM ").nth(1),
        keep.split(" FROM ").nth(1),
        "complete under Delete and Keep share the join"
    );
    for (purge, index) in [
        (admin::purge_dispatched(&t, 5, 10).sql, "dispatched"),
        (dedup::purge(&t, 5, 10).sql, "processed_at"),
    ] {
        // The target is the alias of the FROM occurrence that carries the index hint
        // (SQL Server refuses index hints on a DELETE's target: error 1069).
        assert!(
            purge.starts_with(&format!(
                "DELETE TOP (@P1) x FROM [obx_s].[obx_t] AS x WITH (INDEX([obx_t_{index}]), \
                 FORCESEEK, ROWLOCK, READPAST, READCOMMITTEDLOCK) WHERE x."
            )),
            "{purge}"
        );
        // What follows the TOP clause and the target alias parses as a SELECT.
        let select = purge.replacen("DELETE TOP (@P1) x FROM", "SELECT x.* FROM", 1);
        parses(&select).unwrap_or_else(|e| panic!("{e}: {select}"));
    }
    // The dedup record: the refresh, the insert inside TRY and the CATCH's statement
    // each parse; `hint_tests` checks how they fit together.
    let record = dedup::record(&t, "c", id(1), 1).sql;
    let (refresh, rest) = record.split_once(" BEGIN TRY ").unwrap();
    let (insert, rest) = rest.split_once(" END TRY BEGIN CATCH ").unwrap();
    let caught = rest.strip_suffix(" END CATCH;").unwrap();
    for part in [refresh, insert, caught] {
        parses(part).unwrap_or_else(|e| panic!("{e}: {part}"));
    }
}

#[test]
fn settles_reach_rows_by_primary_key_fenced_by_token() {
    for (what, _, stmt) in every_statement() {
        if ["complete (delete)", "complete (keep)", "release", "fail"].contains(&what) {
            assert!(stmt.sql.contains("ON m.id = l.id AND m.lease_token = l.token WHERE COALESCE(m.dispatched_at, m.dead_at) IS NULL"), "{what}: {}", stmt.sql);
            assert!(stmt.sql.contains("OUTPUT"), "{what}");
            assert!(
                !stmt.sql.contains("dispatched_at IS NULL AND"),
                "no filtered index predicate: {what}"
            );
        }
        if ["dead-letter claimed", "release claim"].contains(&what) {
            assert!(
                stmt.sql
                    .contains("AND m.lease_token = CAST(@P1 AS binary(16));"),
                "{what}: {}",
                stmt.sql
            );
        }
    }
}

#[test]
fn identifiers_are_bracket_quoted_everywhere() {
    for (what, _, stmt) in every_statement() {
        if [
            "pool check-out",
            "pool check-out, no time-out",
            "session identity",
            "showplan on",
            "lock",
            "unlock",
            "install lock",
            "begin",
            "commit",
            "rollback if open",
            "install begin",
            "settings begin",
            // The table's name is a bound value here (OBJECT_ID(@P1)).
            "lock escalation",
        ]
        .contains(&what)
        {
            continue;
        }
        assert!(stmt.sql.contains("[obx_s].["), "{what}: {}", stmt.sql);
        // No unquoted use of the names.
        for bare in [" obx_s.", " obx_t ", "(obx_t"] {
            assert!(!stmt.sql.contains(bare), "{what}: {bare} in {}", stmt.sql);
        }
    }
}

#[test]
fn values_are_bound_never_formatted() {
    for (what, text_bearing, stmt) in every_statement() {
        assert!(
            !stmt.sql.contains(EVIL),
            "{what}: a value reached the text: {}",
            stmt.sql
        );
        assert!(!stmt.sql.contains("x'y"), "{what}");
        assert!(!stmt.sql.contains("z--w"), "{what}");
        if text_bearing {
            let bound = stmt.params.iter().any(|p| match p {
                Param::Text(Some(text)) => {
                    text.contains(EVIL) || text.contains("obx_s") || text.contains("obx_t")
                }
                Param::Bytes(bytes) => bytes.windows(EVIL.len()).any(|w| w == EVIL.as_bytes()),
                _ => false,
            });
            assert!(bound, "{what}: the planted value is among the parameters");
        }
        // Every placeholder in the text has a parameter, and none is left over.
        let highest = (1..=stmt.params.len())
            .rev()
            .find(|n| stmt.sql.contains(&format!("@P{n}")));
        assert_eq!(
            highest,
            (!stmt.params.is_empty()).then_some(stmt.params.len()),
            "{what}"
        );
        assert!(
            !stmt.sql.contains(&format!("@P{}", stmt.params.len() + 1)),
            "{what}"
        );
    }
    // The payload travels as bytes, never as text.
    let enqueue = sql::enqueue(&name(), &[evil_row(1)]);
    assert!(enqueue
        .params
        .contains(&Param::Bytes(EVIL.as_bytes().to_vec())));
}

#[test]
fn batches_are_chunked_under_the_parameter_limit() {
    let t = name();
    let rows: Vec<NewRow> = (0..2000u16)
        .map(|n| evil_row(u8::try_from(n % 250).unwrap()))
        .collect();
    let per_chunk = sql::chunk_rows(sql::ENQUEUE_PARAMS, 0);
    assert_eq!(per_chunk, 285);
    let mut seen = 0;
    for chunk in rows.chunks(per_chunk) {
        let stmt = sql::enqueue(&t, chunk);
        assert!(stmt.params.len() <= sql::PARAM_BUDGET);
        assert!(stmt.params.len() < sql::MAX_PARAMS);
        assert_eq!(stmt.params.len(), chunk.len() * sql::ENQUEUE_PARAMS);
        seen += chunk.len();
    }
    assert_eq!(seen, rows.len());
    let leases: Vec<([u8; 16], [u8; 16])> = (0..5000u16)
        .map(|n| (id(u8::try_from(n % 250).unwrap()), id(0)))
        .collect();
    for chunk in leases.chunks(sql::chunk_rows(sql::LEASE_PARAMS, 0)) {
        let stmt = sql::settle(&t, Settle::Release, chunk);
        assert!(stmt.params.len() < sql::MAX_PARAMS && chunk.len() <= sql::MAX_VALUES_ROWS);
    }
    let fails: Vec<FailRow> = (0..1000)
        .map(|_| FailRow {
            id: id(1),
            token: id(2),
            error: String::new(),
            dead: true,
            retry_us: 0,
        })
        .collect();
    for chunk in fails.chunks(sql::chunk_rows(sql::FAIL_PARAMS, 0)) {
        assert!(sql::fail(&t, chunk).params.len() < sql::MAX_PARAMS);
    }
    let ids: Vec<[u8; 16]> = (0..10_000u16)
        .map(|n| id(u8::try_from(n % 250).unwrap()))
        .collect();
    for chunk in ids.chunks(sql::CLAIM_BATCH) {
        // The ids are one JSON parameter: top, lease, token and the array.
        let stmt = claim::claim(&t, KeyOrder::PerKey, chunk.len(), 1, id(0), Some(chunk));
        assert_eq!(stmt.params.len(), 4);
    }
    // A filter of MAX_ADMIN_BATCH ids binds one parameter, not ten thousand.
    let many = DeadLetterFilter::default()
        .with_ids((0..outbox_core::admin::MAX_ADMIN_BATCH).map(|_| MessageId::new()))
        .unwrap();
    assert_eq!(admin::count_dead(&t, &many).params.len(), 1);
    assert!(
        admin::count_dead(&t, &DeadLetterFilter::default().with_ids([]).unwrap())
            .sql
            .contains("AND 1 = 0")
    );
}

#[test]
fn ids_and_tokens_are_compared_as_binary_16() {
    // tiberius sends bytes as varbinary(8000); every id or token is cast back to the
    // columns' type so that comparisons seek the primary key.
    for (what, _, stmt) in every_statement() {
        for (n, param) in stmt.params.iter().enumerate() {
            if let Param::Bytes(bytes) = param {
                if bytes.len() == 16 {
                    assert!(
                        stmt.sql
                            .contains(&format!("CAST(@P{} AS binary(16))", n + 1)),
                        "{what}: @P{} in {}",
                        n + 1,
                        stmt.sql
                    );
                }
            }
        }
    }
}

/// Locks, not rows: a purged row takes three key locks, a claimed or settled one up to
/// five. The 2,000-row statements rely on `LOCK_ESCALATION = DISABLE` (set when the
/// table is created); where a table escalates, the store sends 900-row statements,
/// whose locks stay below the 5,000 at which SQL Server escalates.
#[test]
fn bounded_statements_take_bounded_locks() {
    let t = name();
    for stmt in [
        admin::purge_dispatched(&t, 1, usize::MAX),
        dedup::purge(&t, 1, usize::MAX),
        admin::change_dead_matching(
            &t,
            DeadChange::Discard,
            &DeadLetterFilter::default(),
            usize::MAX,
        ),
    ] {
        assert!(stmt.sql.contains("TOP (@P1)"));
        let Param::I64(n) = stmt.params[0] else {
            panic!("limit first")
        };
        assert_eq!(n, i64::try_from(sql::DELETE_BATCH).unwrap());
    }
    const {
        assert!(sql::DELETE_BATCH * sql::LOCKS_PER_ROW > sql::ESCALATION_THRESHOLD);
        assert!(sql::ESCALATING_BATCH * sql::LOCKS_PER_ROW < sql::ESCALATION_THRESHOLD);
    };
    // A smaller step is sent as asked (the store passes its batch size as the limit).
    let Param::I64(n) = admin::purge_dispatched(&t, 1, sql::ESCALATING_BATCH).params[0] else {
        panic!("limit first")
    };
    assert_eq!(n, 900);
}

#[test]
fn taking_back_an_enqueue_only_deletes_inside_an_open_transaction() {
    let stmt = sql::delete_ids(&name(), &[id(1)]);
    assert!(
        stmt.sql
            .starts_with("IF XACT_STATE() = 1 DELETE FROM [obx_s].[obx_t] WHERE id IN ("),
        "{}",
        stmt.sql
    );
}
