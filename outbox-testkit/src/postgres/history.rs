//! Loading an outbox table with history in one statement each, without letting the
//! server gather statistics: the shapes under which a planner would choose a scan if a
//! statement let it. Every statement takes the table's quoted, schema-qualified name
//! (what the backend's `qualified_name()` gives) and binds its counts as `bigint`s.

use crate::harness::plan::History;

/// Turns autovacuum (and with it autoanalyze) off for `table`, so it keeps no
/// statistics until a test analyzes it.
pub fn disable_autovacuum(table: &str) -> String {
    format!("ALTER TABLE {table} SET (autovacuum_enabled = false)")
}

/// Whether the table `$1` (its name as text, cast to `regclass`) has been analyzed:
/// a plan test that needs a table without statistics asserts this is `false`.
pub const IS_ANALYZED: &str = "SELECT last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL \
     FROM pg_stat_user_tables WHERE relid = $1::regclass";

/// `$1` undelivered rows due a minute ago.
pub fn insert_due(table: &str) -> String {
    format!(
        "INSERT INTO {table} (id, destination, payload, available_at) \
         SELECT gen_random_uuid(), 'history', '\\x00', now() - interval '1 minute' \
         FROM generate_series(1, $1)"
    )
}

/// `$1` rows dispatched a day ago, as months of kept history would look.
pub fn insert_dispatched(table: &str) -> String {
    format!(
        "INSERT INTO {table} (id, destination, payload, available_at, dispatched_at) \
         SELECT gen_random_uuid(), 'history', '\\x00', now(), now() - interval '1 day' \
         FROM generate_series(1, $1)"
    )
}

/// The plan suite's [`History`] in one statement: rows over eight keys, the first
/// dispatched, then dead, then due now, the last due in an hour; `seq` follows the
/// series. Bind [`history_params`] as `$1` to `$4`.
pub fn insert_history(table: &str) -> String {
    format!(
        "INSERT INTO {table} (id, destination, partition_key, payload, available_at, \
             dispatched_at, dead_at) \
         SELECT gen_random_uuid(), 'plans', 'k' || (i % 8), '\\x00', \
             CASE WHEN i > $2 THEN now() + interval '1 hour' \
                 ELSE now() - interval '1 minute' END, \
             CASE WHEN i <= $3 THEN now() END, \
             CASE WHEN i > $3 AND i <= $4 THEN now() END \
         FROM generate_series(1, $1) AS i ORDER BY i"
    )
}

/// The parameters of [`insert_history`]: all rows, the last row due now, the last
/// dispatched row, the last dead row (row numbers from 1).
///
/// # Panics
/// When a count does not fit a `bigint` (a test's history is small).
pub fn history_params(history: &History) -> [i64; 4] {
    let count = |n: usize| i64::try_from(n).expect("a test's history fits a bigint");
    let (settled, dead) = (count(history.dispatched), count(history.dead));
    let due_end = settled + dead + count(history.due);
    [
        due_end + count(history.waiting),
        due_end,
        settled,
        settled + dead,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_rows_are_numbered_dispatched_dead_due_waiting() {
        let history = History {
            dispatched: 10,
            dead: 2,
            due: 5,
            waiting: 3,
        };
        assert_eq!(history_params(&history), [20, 17, 10, 12]);
        let sql = insert_history("\"s\".\"t\"");
        assert!(sql.starts_with("INSERT INTO \"s\".\"t\" ("), "{sql}");
        for param in ["$1", "$2", "$3", "$4"] {
            assert!(sql.contains(param), "{param} in {sql}");
        }
        assert!(insert_due("x").contains("generate_series(1, $1)"));
        assert!(insert_dispatched("x").contains("dispatched_at"));
        assert_eq!(
            disable_autovacuum("x"),
            "ALTER TABLE x SET (autovacuum_enabled = false)"
        );
    }
}
