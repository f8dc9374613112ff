//! Offline checks of the lock hints statements must not carry: no range locks anywhere
//! (statements and source), and the dedup and entity inserts without them. The
//! statements are `statement_tests`' list.

use crate::statement_tests::{every_statement, id, name};
use crate::{dedup, entity};

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
