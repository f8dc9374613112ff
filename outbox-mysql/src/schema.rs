//! The tables' DDL, rendered from a validated [`QualifiedName`], and the versioned
//! installer. The DDL for the default names is checked in as `sql/outbox.sql`,
//! `sql/inbox.sql` and `sql/entities.sql` (a unit test keeps them equal).
//!
//! Each installed table is recorded with its layout version in
//! `` `<schema>`.outbox_schema_versions ``; [`install`] creates what is missing and fails
//! with [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when a table was installed
//! at another version. Installs of one schema are serialised with `GET_LOCK` on a
//! connection of their own, closed afterwards (DDL commits on its own in MySQL, so the
//! lock, not a transaction, makes the check and the creation one step). The server
//! features each part needs are in the crate README.

use sqlx::{Connection, Executor, MySqlPool};

use outbox_core::{Error, ErrorKind, Result};

use crate::config::{QualifiedName, MAX_TEXT_BYTES};
use crate::error::from_sqlx;

/// The layout version this crate writes and expects (the
/// [`Schema::layout_version`](outbox_core::schema::Schema::layout_version) of its outbox
/// and inbox stores).
pub const SCHEMA_VERSION: u32 = 1;

/// The table (in each schema used) recording installed layout versions.
const VERSION_TABLE: &str = "outbox_schema_versions";

/// The complete, idempotent DDL of a table whose own statement is `objects`: the
/// database, the version table, the table and its version record.
pub(crate) fn ddl(name: &QualifiedName, objects: &str) -> String {
    prelude(name) + &versioned(name, objects)
}

/// `objects` and the version record (the table name is a validated identifier, so
/// writing it as a literal is safe).
fn versioned(name: &QualifiedName, objects: &str) -> String {
    format!(
        "{objects}INSERT INTO {versions} (table_name, version) VALUES ('{table}', \
         {SCHEMA_VERSION}) ON DUPLICATE KEY UPDATE version = version;\n",
        versions = name.sibling(VERSION_TABLE),
        table = name.table(),
    )
}

/// `CREATE DATABASE` and the version table.
fn prelude(name: &QualifiedName) -> String {
    format!(
        "CREATE DATABASE IF NOT EXISTS {schema};\n\
         CREATE TABLE IF NOT EXISTS {versions} (\n    \
         table_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin PRIMARY KEY,\n    \
         version INT NOT NULL\n) ENGINE = InnoDB;\n",
        schema = name.quoted_schema(),
        versions = name.sibling(VERSION_TABLE),
    )
}

/// The outbox table. The kit's partial indexes become indexes on `STORED` generated
/// columns that are `NULL` where the partial index has no entry:
///
/// - `<table>_due` on `(due_at, seq)`: `due_at` is `available_at` while undelivered;
///   every claim.
/// - `<table>_key` on `(key_head, seq)`: `key_head` is the partition key while
///   undelivered; the head-of-key probe of per-key claims. It is kept in every
///   configuration, so one table serves both.
/// - `<table>_dispatched` on `dispatched_at`: purges and counts of kept history.
/// - `<table>_dead` on `dead_flag` (1 for dead letters), then the primary key: the
///   dead-letter admin statements, in id order.
/// - `<table>_seq` on `seq`: InnoDB's requirement for `AUTO_INCREMENT`.
///
/// Beside it, `<table>_held`: the open batches of held-lock claims, one row each (see
/// [`ClaimMode::HeldLock`](outbox_core::ClaimMode::HeldLock)), created in every mode.
///
/// Destinations and keys are `VARBINARY`, compared byte for byte; times are
/// `DATETIME(6)` holding UTC, microseconds.
pub(crate) fn outbox_objects(name: &QualifiedName) -> String {
    let undelivered = "dispatched_at IS NULL AND dead_at IS NULL";
    let index = |suffix: &str| name.quoted_derived(suffix);
    format!(
        "CREATE TABLE IF NOT EXISTS {name} (
    id BINARY(16) NOT NULL PRIMARY KEY,
    seq BIGINT NOT NULL AUTO_INCREMENT,
    destination VARBINARY({MAX_TEXT_BYTES}) NOT NULL,
    partition_key VARBINARY({MAX_TEXT_BYTES}),
    payload LONGBLOB NOT NULL,
    content_type BLOB,
    headers JSON NOT NULL,
    created_at DATETIME(6) NOT NULL,
    available_at DATETIME(6) NOT NULL,
    attempts INT NOT NULL DEFAULT 0,
    last_error TEXT CHARACTER SET utf8mb4,
    lease_token BINARY(16),
    dispatched_at DATETIME(6),
    dead_at DATETIME(6),
    due_at DATETIME(6) AS (IF({undelivered}, available_at, NULL)) STORED,
    key_head VARBINARY({MAX_TEXT_BYTES}) AS (IF({undelivered}, partition_key, NULL)) STORED,
    dead_flag TINYINT AS (IF(dead_at IS NULL, NULL, 1)) STORED,
    KEY {seq} (seq),
    KEY {due} (due_at, seq),
    KEY {key} (key_head, seq),
    KEY {dispatched} (dispatched_at),
    KEY {dead} (dead_flag)
) ENGINE = InnoDB;
{held}",
        held = crate::held_sql::held_registry(name),
        seq = index("seq"),
        due = index("due"),
        key = index("key"),
        dispatched = index("dispatched"),
        dead = index("dead"),
    )
}

/// The inbox table of processed ids per consumer (names compared byte for byte).
pub(crate) fn inbox_objects(name: &QualifiedName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {name} (
    consumer VARBINARY(255) NOT NULL,
    message_id BINARY(16) NOT NULL,
    processed_at DATETIME(6) NOT NULL,
    PRIMARY KEY (consumer, message_id),
    KEY {index} (processed_at)
) ENGINE = InnoDB;
",
        index = name.quoted_derived("processed_at"),
    )
}

/// The entity table of the decoupled consumer.
pub(crate) fn entity_objects(name: &QualifiedName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {name} (
    entity_key VARBINARY(255) NOT NULL PRIMARY KEY,
    state JSON NOT NULL,
    outbox JSON NOT NULL,
    version BIGINT NOT NULL CHECK (version > 0),
    updated_at DATETIME(6) NOT NULL
) ENGINE = InnoDB;
"
    )
}

/// Create `name` with `objects` unless it is recorded, and record [`SCHEMA_VERSION`];
/// safe from every process at start-up.
///
/// # Errors
/// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table was installed
/// at another layout version; mapped driver errors otherwise.
pub(crate) async fn install(pool: &MySqlPool, name: &QualifiedName, objects: &str) -> Result<()> {
    let err = |e| from_sqlx("schema install", e);
    // A connection of its own, closed at the end: the session's lock goes with it.
    let mut conn = pool.acquire().await.map_err(err)?.detach();
    // `outbox#`, not the `outbox:` of `MySqlDistributedLock`: no lock name maps here.
    let locked: Option<i64> =
        sqlx::query_scalar("SELECT GET_LOCK(CONCAT('outbox#', SHA2(?, 224)), 60)")
            .bind(name.schema())
            .fetch_one(&mut conn)
            .await
            .map_err(err)?;
    if locked != Some(1) {
        let held = format!(
            "another install of {} held its lock for 60 s",
            name.schema()
        );
        return Err(Error::new(ErrorKind::Contention, held));
    }
    conn.execute(sqlx::raw_sql(&prelude(name)))
        .await
        .map_err(err)?;
    let versions = name.sibling(VERSION_TABLE);
    let installed: Option<i32> = sqlx::query_scalar(&format!(
        "SELECT version FROM {versions} WHERE table_name = ?"
    ))
    .bind(name.table())
    .fetch_optional(&mut conn)
    .await
    .map_err(err)?;
    // The version column is an `INT`: compared as `i64`, which holds both.
    if let Some(found) = installed.filter(|v| i64::from(*v) != i64::from(SCHEMA_VERSION)) {
        let (found, expected) = (found.into(), SCHEMA_VERSION.into());
        return Err(outbox_core::backend::layout_mismatch(
            &name, found, expected,
        ));
    }
    if installed.is_none() {
        let create = versioned(name, objects);
        conn.execute(sqlx::raw_sql(&create)).await.map_err(err)?;
    }
    conn.close().await.map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked-in files are what the default configs render; regenerate them with
    /// `MySqlOutbox::ddl()` / `MySqlDedupStore::ddl()` / `MySqlEntityStore::ddl()`.
    #[test]
    fn checked_in_sql_files_match_the_rendered_ddl() {
        let statements = outbox_core::backend::ddl_file_statements;
        let name = |t: &str| QualifiedName::new("outbox", t).unwrap();
        let outbox = name("outbox_messages");
        assert_eq!(
            statements(include_str!("../sql/outbox.sql")),
            ddl(&outbox, &outbox_objects(&outbox))
        );
        let inbox = name("outbox_inbox");
        assert_eq!(
            statements(include_str!("../sql/inbox.sql")),
            ddl(&inbox, &inbox_objects(&inbox))
        );
        let entities = name("outbox_entities");
        assert_eq!(
            statements(include_str!("../sql/entities.sql")),
            ddl(&entities, &entity_objects(&entities))
        );
    }
}
