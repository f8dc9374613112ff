//! The tables' DDL, rendered from a validated [`TableName`], and the idempotent,
//! versioned installer. The DDL for the default names is checked in under `sql/` (a
//! unit test keeps the files equal to what is rendered here).
//!
//! Every table is `STRICT`: SQLite then refuses a value of the wrong type from any
//! writer (another tool included), so a stored row always has the shape the statements
//! read. Ids and lease tokens are 16-byte blobs (checked), times are integers of
//! microseconds since the Unix epoch, headers and entity state are JSON text.
//!
//! Each installed table is recorded with its layout version in
//! `outbox_schema_versions`; [`install`] creates what is missing and fails with
//! [`ErrorKind::Schema`] when a table was installed at another version. It runs in one
//! immediate transaction, so concurrent installs take turns.

use sqlx::{Executor, SqlitePool};

use outbox_core::Result;

use crate::error::from_sqlx;
use crate::ident::TableName;
use crate::time::now_us;

/// The layout version this crate writes and expects (the
/// [`Schema::layout_version`](outbox_core::schema::Schema::layout_version) of its outbox
/// and inbox stores).
pub const SCHEMA_VERSION: u32 = 1;

/// The table recording installed layout versions.
const VERSION_TABLE: &str = "\"outbox_schema_versions\"";

/// Not dispatched and not dead, as the partial indexes state it. Statements that must
/// use these indexes repeat it verbatim, so the planner can prove the index applies.
pub(crate) const UNDELIVERED: &str = "dispatched_at IS NULL AND dead_at IS NULL";

/// The outbox table and its indexes.
pub(crate) fn outbox_objects(name: &TableName) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {name} (
    seq INTEGER PRIMARY KEY,
    id BLOB NOT NULL UNIQUE CHECK (length(id) = 16),
    destination TEXT NOT NULL,
    partition_key TEXT,
    payload BLOB NOT NULL,
    content_type TEXT,
    headers TEXT NOT NULL DEFAULT '{{}}',
    created_at INTEGER NOT NULL,
    available_at INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    lease_token BLOB CHECK (length(lease_token) = 16),
    dispatched_at INTEGER,
    dead_at INTEGER
) STRICT;
CREATE INDEX IF NOT EXISTS {due} ON {name} (available_at, seq)
    WHERE {UNDELIVERED};
CREATE INDEX IF NOT EXISTS {key} ON {name} (partition_key, seq)
    WHERE {UNDELIVERED} AND partition_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS {dispatched} ON {name} (dispatched_at)
    WHERE dispatched_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {dead} ON {name} (id)
    WHERE dead_at IS NOT NULL;
"#,
        due = name.derived("due"),
        key = name.derived("key"),
        dispatched = name.derived("dispatched"),
        dead = name.derived("dead"),
    )
}

/// The inbox table of processed ids and its index.
pub(crate) fn inbox_objects(name: &TableName) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {name} (
    consumer TEXT NOT NULL,
    message_id BLOB NOT NULL CHECK (length(message_id) = 16),
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {index} ON {name} (processed_at);
"#,
        index = name.derived("processed_at"),
    )
}

/// The entity table of the decoupled consumer: one row per entity, its state and
/// outbox state as JSON text, and the version of the optimistic check.
pub(crate) fn entity_objects(name: &TableName) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {name} (
    entity_key TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    outbox TEXT NOT NULL DEFAULT '{{}}',
    version INTEGER NOT NULL CHECK (version > 0),
    updated_at INTEGER NOT NULL
) STRICT;
"#
    )
}

/// The lock table: one row per held (or lapsed, not yet taken over) lock.
pub(crate) fn lock_objects(name: &TableName) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {name} (
    name TEXT PRIMARY KEY,
    holder BLOB NOT NULL CHECK (length(holder) = 16),
    expires_at INTEGER NOT NULL
) STRICT;
"#
    )
}

/// The version table.
fn prelude() -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (
    table_name TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    installed_at INTEGER NOT NULL
) STRICT;
"#
    )
}

/// The complete, idempotent DDL of one table: the version table, `objects` and the
/// version record, for a migration tool or the `sqlite3` shell.
pub(crate) fn ddl(name: &TableName, objects: &str) -> String {
    // The table name is a validated identifier ([a-z0-9_]), so writing it as a literal
    // is safe; `install` binds it instead.
    format!(
        "{prelude}{objects}INSERT INTO {VERSION_TABLE} (table_name, version, installed_at) \
         VALUES ('{table}', {SCHEMA_VERSION}, \
         CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)) \
         ON CONFLICT (table_name) DO NOTHING;\n",
        prelude = prelude(),
        table = name.as_str(),
    )
}

/// Create `name` with `objects` unless it is already recorded, and record
/// [`SCHEMA_VERSION`], in one immediate transaction.
///
/// # Errors
/// [`ErrorKind::Schema`] when the table was installed at another layout version;
/// mapped driver errors otherwise.
pub(crate) async fn install(pool: &SqlitePool, name: &TableName, objects: &str) -> Result<()> {
    let err = |e| from_sqlx("schema install", e);
    // The version column is an `INTEGER`, read and bound as `i64`.
    let expected = i64::from(SCHEMA_VERSION);
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
    tx.execute(sqlx::raw_sql(&prelude())).await.map_err(err)?;
    let installed: Option<i64> = sqlx::query_scalar(&format!(
        "SELECT version FROM {VERSION_TABLE} WHERE table_name = ?1"
    ))
    .bind(name.as_str())
    .fetch_optional(&mut *tx)
    .await
    .map_err(err)?;
    match installed {
        Some(found) if found == expected => {}
        Some(other) => {
            return Err(outbox_core::backend::layout_mismatch(
                &name, other, expected,
            ))
        }
        None => {
            tx.execute(sqlx::raw_sql(objects)).await.map_err(err)?;
            sqlx::query(&format!(
                "INSERT INTO {VERSION_TABLE} (table_name, version, installed_at) \
                 VALUES (?1, ?2, ?3)"
            ))
            .bind(name.as_str())
            .bind(expected)
            .bind(now_us())
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
    }
    tx.commit().await.map_err(err)
}

// The outbox and inbox tables, for tools.
outbox_core::backend::schema_from_inherent!(
    crate::SqliteOutbox,
    name = |s| s.qualified_name().to_string(),
    version = SCHEMA_VERSION
);
outbox_core::backend::schema_from_inherent!(
    crate::SqliteDedupStore,
    name = |s| s.config().display_name(),
    version = SCHEMA_VERSION
);

#[cfg(test)]
mod tests {
    use super::*;

    fn name(table: &str) -> TableName {
        TableName::new(table).unwrap()
    }

    #[test]
    fn ddl_quotes_identifiers_is_strict_and_idempotent() {
        let text = ddl(&name("t1"), &outbox_objects(&name("t1")));
        assert!(text.contains("CREATE TABLE IF NOT EXISTS \"t1\" ("));
        assert!(text.contains("\"t1_due\" ON \"t1\" (available_at, seq)"));
        assert!(text.contains("VALUES ('t1', 1, "));
        for line in text.lines().filter(|l| l.starts_with("CREATE")) {
            assert!(line.contains("IF NOT EXISTS"), "{line}");
        }
        for objects in [
            outbox_objects(&name("a")),
            inbox_objects(&name("a")),
            entity_objects(&name("a")),
            lock_objects(&name("a")),
            prelude(),
        ] {
            assert!(objects.contains(") STRICT"), "{objects}");
        }
    }

    /// The checked-in files are what the default configs render; regenerate them with
    /// the stores' `ddl()` when the layout changes.
    #[test]
    fn checked_in_sql_files_match_the_rendered_ddl() {
        let statements = outbox_core::backend::ddl_file_statements;
        let cases = [
            (
                include_str!("../sql/outbox.sql"),
                outbox_objects(&name("outbox_messages")),
                "outbox_messages",
            ),
            (
                include_str!("../sql/inbox.sql"),
                inbox_objects(&name("outbox_inbox")),
                "outbox_inbox",
            ),
            (
                include_str!("../sql/entities.sql"),
                entity_objects(&name("outbox_entities")),
                "outbox_entities",
            ),
            (
                include_str!("../sql/locks.sql"),
                lock_objects(&name("outbox_locks")),
                "outbox_locks",
            ),
        ];
        for (file, objects, table) in cases {
            assert_eq!(statements(file), ddl(&name(table), &objects), "{table}");
        }
    }
}
