//! Every statement the crate can send is registered with the legality check, and
//! passes it: the list in `statement_tests::every_statement`, the builder each entry
//! comes from, and a scan of the crate's source that fails when a statement builder or
//! a raw send is added without being registered here.

use std::collections::BTreeSet;

use crate::legality::{check, Catalog};
use crate::schema;
use crate::session::{check_out, DEFAULT_LOCK_TIMEOUT};
use crate::statement_tests::{every_statement, name};

/// Each entry of `every_statement` with what renders it: a function returning a
/// `Stmt`, or a text the crate sends as a plain batch (`simple_query`).
const BUILDERS: &[(&str, &str)] = &[
    ("claim", "claim::claim"),
    ("claim per key", "claim::claim"),
    ("claim ids", "claim::claim"),
    ("claim ids per key", "claim::claim"),
    ("enqueue", "sql::enqueue"),
    ("stored ids", "sql::stored_ids"),
    ("delete ids", "sql::delete_ids"),
    ("complete (delete)", "sql::settle"),
    ("complete (keep)", "sql::settle"),
    ("release", "sql::settle"),
    ("fail", "sql::fail"),
    ("dead-letter claimed", "sql::dead_letter_claimed"),
    ("release claim", "sql::release_claim"),
    ("dead letters asc", "admin::dead_letters"),
    ("dead letters asc after", "admin::dead_letters"),
    ("dead letters desc after", "admin::dead_letters"),
    ("dead letters unfiltered", "admin::dead_letters"),
    ("count dead", "admin::count_dead"),
    ("requeue ids", "admin::change_dead_ids"),
    ("discard ids", "admin::change_dead_ids"),
    ("requeue matching", "admin::change_dead_matching"),
    ("discard matching", "admin::change_dead_matching"),
    ("purge dispatched", "admin::purge_dispatched"),
    ("count dispatched", "admin::count_dispatched"),
    ("stats", "admin::stats"),
    ("stats by index size", "admin::stats_by_index_size"),
    ("lock escalation", "install::lock_escalation"),
    ("install lock", "install::install_lock"),
    ("installed version", "install::installed_version"),
    ("record version", "install::record_version"),
    ("dedup record", "dedup::record"),
    ("dedup contains", "dedup::contains"),
    ("dedup purge", "dedup::purge"),
    ("entity load", "entity::load"),
    ("entity create", "entity::create"),
    ("entity replace", "entity::replace"),
    ("lock", "lock::try_lock"),
    ("unlock", "lock::unlock"),
    ("pool check-out", "session::check_out"),
    ("pool check-out, no time-out", "session::check_out"),
    ("session identity", "session::IDENTITY"),
    ("showplan on", "showplan::SHOWPLAN_ON"),
    ("begin", "session::BEGIN"),
    ("commit", "session::COMMIT"),
    ("rollback if open", "session::ROLLBACK_IF_OPEN"),
    ("install begin", "install::INSTALL_BEGIN"),
    ("settings begin", "install::SETTINGS_BEGIN"),
    ("outbox ddl", "schema::outbox_ddl"),
    ("inbox ddl", "schema::inbox_ddl"),
    ("entity ddl", "schema::entity_ddl"),
];

/// The files that send SQL text themselves, with how many `simple_query(` calls each
/// has, and what they send: every other statement goes through `exec.rs` as a `Stmt`.
const RAW_SENDS: &[(&str, usize, &str)] = &[
    (
        "session.rs",
        1,
        "run_batch: BEGIN, COMMIT, ROLLBACK_IF_OPEN, check_out",
    ),
    (
        "showplan.rs",
        1,
        "SHOWPLAN_ON, then the relay's own Stmts (through exec.rs), for the plan tests",
    ),
    (
        "install.rs",
        1,
        "batch: INSTALL_BEGIN, the DDL (prelude, objects), COMMIT, SETTINGS_BEGIN + settings",
    ),
];

fn builder_of(what: &str) -> &'static str {
    BUILDERS
        .iter()
        .find(|(label, _)| *label == what)
        .map(|(_, builder)| *builder)
        .unwrap_or_else(|| panic!("`{what}` is not in BUILDERS"))
}

/// The crate's source files that are not tests, with their text.
fn sources() -> Vec<(String, String)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") || file.ends_with("_tests.rs") {
            continue;
        }
        out.push((file, std::fs::read_to_string(&path).unwrap()));
    }
    out
}

#[test]
fn every_listed_statement_names_its_builder_and_every_builder_is_listed() {
    let listed: BTreeSet<&str> = every_statement().iter().map(|(w, _, _)| *w).collect();
    let registered: BTreeSet<&str> = BUILDERS.iter().map(|(w, _)| *w).collect();
    assert_eq!(
        listed, registered,
        "every_statement and BUILDERS list the same"
    );
    let builders: BTreeSet<&str> = BUILDERS.iter().map(|(_, b)| *b).collect();
    let mut unregistered = Vec::new();
    let mut found = 0;
    for (file, text) in sources() {
        let module = file.trim_end_matches(".rs");
        // `fn name(...) -> Stmt {`, the signature possibly over several lines.
        for (at, _) in text.match_indices("fn ") {
            let signature = &text[at..text[at..].find('{').map_or(text.len(), |e| at + e)];
            if !signature.trim_end().ends_with("-> Stmt") {
                continue;
            }
            let fn_name = &signature[3..signature.find('(').unwrap()];
            found += 1;
            let path = format!("{module}::{fn_name}");
            if !builders.contains(path.as_str()) && fn_name != "text" && fn_name != "finish" {
                unregistered.push(path);
            }
        }
    }
    assert!(found >= 20, "the scan found the builders ({found})");
    assert!(
        unregistered.is_empty(),
        "statement builders not registered with the legality check: {unregistered:?} \
         (add each to every_statement and BUILDERS)"
    );
}

#[test]
fn sql_text_is_sent_only_through_registered_paths() {
    for (file, text) in sources() {
        let calls = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .filter(|l| l.contains(".simple_query("))
            .count();
        let expected = RAW_SENDS
            .iter()
            .find(|(f, _, _)| *f == file)
            .map_or(0, |(_, n, _)| *n);
        assert_eq!(
            calls, expected,
            "{file} sends SQL text with simple_query {calls} times: register what it sends \
             in every_statement, BUILDERS and RAW_SENDS"
        );
        let queries = text.matches("Query::new(").count();
        assert_eq!(
            queries,
            usize::from(file == "exec.rs"),
            "{file}: statements are sent as Stmts through exec.rs"
        );
    }
}

/// The isolation level the pool's check-out sets: what `READPAST` runs under.
fn session_isolation() -> &'static str {
    let sql = check_out(Some(DEFAULT_LOCK_TIMEOUT), None);
    assert!(sql.contains("SET TRANSACTION ISOLATION LEVEL READ COMMITTED;"));
    "READ COMMITTED"
}

#[test]
fn every_statement_the_crate_sends_passes_the_legality_check() {
    let t = name();
    let catalog = |ddl: String| Catalog::from_ddl(&ddl).expect("the DDL tokenizes");
    let outbox = catalog(schema::outbox_ddl(&t));
    let inbox = catalog(schema::inbox_ddl(&t));
    let entities = catalog(schema::entity_ddl(&t));
    assert!(outbox.indexes.len() >= 6, "{outbox:?}");
    assert!(outbox.triggered.is_empty() && inbox.triggered.is_empty());
    let mut failures = Vec::new();
    for (what, _, stmt) in every_statement() {
        let builder = builder_of(what);
        let tables = if builder.starts_with("dedup::") || builder == "schema::inbox_ddl" {
            &inbox
        } else if builder.starts_with("entity::") || builder == "schema::entity_ddl" {
            &entities
        } else {
            &outbox
        };
        for v in check(&stmt.sql, stmt.params.len(), session_isolation(), tables) {
            failures.push(format!("{what} ({builder}): {v}\n  {}", stmt.sql));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
