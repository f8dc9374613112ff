//! The tables' DDL, rendered from a validated [`QualifiedName`], and the idempotent,
//! versioned installer. The layout and the use with migration tools are described in
//! the crate README; the DDL for the default names is checked in as `sql/outbox.sql`
//! and `sql/inbox.sql` (a unit test keeps them equal to what is rendered here).
//!
//! Each installed table is recorded with its layout version in
//! `"<schema>".outbox_schema_versions`; [`install`] creates what is missing and fails
//! with [`ErrorKind::Schema`] when a table was installed at another version. Concurrent
//! installs are serialised with a transaction-scoped advisory lock per schema.

use sqlx::{Executor, PgPool};

use outbox_core::{Error, ErrorKind, Result};

use crate::error::from_sqlx;
use crate::ident::QualifiedName;

/// The layout version this crate writes and expects.
pub const SCHEMA_VERSION: i32 = 1;

/// The table (in each schema used) recording installed layout versions.
pub(crate) const VERSION_TABLE: &str = "outbox_schema_versions";

/// Not dispatched and not dead, as the partial indexes state it. Statements that must
/// use these indexes repeat it verbatim, so the planner can prove the index applies;
/// statements that must reach rows by primary key only write it another way
/// ([`crate::sql`]).
pub(crate) const UNDELIVERED: &str = "dispatched_at IS NULL AND dead_at IS NULL";

/// The complete, idempotent DDL for an outbox table: schema, version table, table,
/// indexes and the version record.
pub(crate) fn outbox_ddl(name: &QualifiedName) -> String {
    ddl(name, &outbox_objects(name))
}

/// The complete, idempotent DDL for an inbox (dedup) table.
pub(crate) fn inbox_ddl(name: &QualifiedName) -> String {
    ddl(name, &inbox_objects(name))
}

/// `objects` wrapped in the prelude and followed by the version record. Every
/// statement is idempotent (`IF NOT EXISTS`, `ON CONFLICT DO NOTHING`), so the text can
/// be fed to a migration tool or to `psql` as is.
pub(crate) fn ddl(name: &QualifiedName, objects: &str) -> String {
    let versions = name.sibling(VERSION_TABLE);
    // The table name is a validated identifier ([a-z0-9_]), so writing it as a literal
    // is safe; `install` binds it instead.
    format!(
        "{prelude}{objects}INSERT INTO {versions} (table_name, version) \
         VALUES ('{table}', {SCHEMA_VERSION}) ON CONFLICT (table_name) DO NOTHING;\n",
        prelude = prelude(name),
        table = name.table(),
    )
}

/// The outbox table and its indexes.
pub(crate) fn outbox_objects(name: &QualifiedName) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {name} (
    id uuid PRIMARY KEY,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    destination text NOT NULL,
    partition_key text,
    payload bytea NOT NULL,
    content_type text,
    headers jsonb NOT NULL DEFAULT '{{}}',
    created_at timestamptz NOT NULL DEFAULT now(),
    available_at timestamptz NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    lease_token uuid,
    dispatched_at timestamptz,
    dead_at timestamptz
);
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

/// The complete, idempotent DDL for an entity table of the decoupled consumer.
pub(crate) fn entity_ddl(name: &QualifiedName) -> String {
    ddl(name, &entity_objects(name))
}

/// The entity table: one row per entity, its state and outbox state as `jsonb`, and
/// the version of the optimistic check.
pub(crate) fn entity_objects(name: &QualifiedName) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {name} (
    entity_key text PRIMARY KEY,
    state jsonb NOT NULL,
    outbox jsonb NOT NULL DEFAULT '{{}}',
    version bigint NOT NULL CHECK (version > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
"#
    )
}

/// The inbox table of processed ids and its index.
pub(crate) fn inbox_objects(name: &QualifiedName) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {name} (
    consumer text NOT NULL,
    message_id uuid NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS {index} ON {name} (processed_at);
"#,
        index = name.derived("processed_at"),
    )
}

/// `CREATE SCHEMA` and the version table.
fn prelude(name: &QualifiedName) -> String {
    format!(
        r#"CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {versions} (
    table_name text PRIMARY KEY,
    version integer NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now()
);
"#,
        schema = name.quoted_schema(),
        versions = name.sibling(VERSION_TABLE),
    )
}

/// Create `name` with `objects` (idempotent DDL, such as [`outbox_objects`]) unless it
/// is already recorded, under a per-schema advisory lock, and record
/// [`SCHEMA_VERSION`].
///
/// Safe to call from every process at start-up: installs of the same schema are
/// serialised, and an installed table at this crate's version is left alone.
///
/// # Errors
/// [`ErrorKind::Schema`] when the table was installed at another layout version;
/// mapped driver errors otherwise.
pub(crate) async fn install(pool: &PgPool, name: &QualifiedName, objects: &str) -> Result<()> {
    let err = |e| from_sqlx("schema install", e);
    let versions = name.sibling(VERSION_TABLE);
    let mut tx = pool.begin().await.map_err(err)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("outbox-postgres:install:{}", name.schema()))
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    tx.execute(sqlx::raw_sql(&prelude(name)))
        .await
        .map_err(err)?;
    let installed: Option<i32> = sqlx::query_scalar(&format!(
        "SELECT version FROM {versions} WHERE table_name = $1"
    ))
    .bind(name.table())
    .fetch_optional(&mut *tx)
    .await
    .map_err(err)?;
    match installed {
        Some(SCHEMA_VERSION) => {}
        Some(other) => {
            return Err(Error::new(
                ErrorKind::Schema,
                format!(
                    "table {name} is at layout version {other}, this crate expects \
                     {SCHEMA_VERSION}"
                ),
            ))
        }
        None => {
            tx.execute(sqlx::raw_sql(objects)).await.map_err(err)?;
            sqlx::query(&format!(
                "INSERT INTO {versions} (table_name, version) VALUES ($1, $2)"
            ))
            .bind(name.table())
            .bind(SCHEMA_VERSION)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
    }
    tx.commit().await.map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(schema: &str, table: &str) -> QualifiedName {
        QualifiedName::new(schema, table).unwrap()
    }

    #[test]
    fn ddl_quotes_identifiers_and_is_idempotent() {
        let text = outbox_ddl(&name("s1", "t1"));
        assert!(text.contains("CREATE SCHEMA IF NOT EXISTS \"s1\";"));
        assert!(text.contains("CREATE TABLE IF NOT EXISTS \"s1\".\"outbox_schema_versions\""));
        assert!(text.contains("CREATE TABLE IF NOT EXISTS \"s1\".\"t1\" ("));
        assert!(text.contains("\"t1_due\" ON \"s1\".\"t1\" (available_at, seq)"));
        assert!(text.contains("VALUES ('t1', 1) ON CONFLICT (table_name) DO NOTHING"));
        for line in text.lines().filter(|l| l.starts_with("CREATE")) {
            assert!(line.contains("IF NOT EXISTS"), "{line}");
        }
    }

    #[test]
    fn index_names_are_distinct_for_long_tables() {
        let text = outbox_ddl(&name("s", &"t".repeat(63)));
        let names: std::collections::HashSet<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("CREATE INDEX IF NOT EXISTS "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(names.iter().all(|n| n.len() <= 63 + 2));
    }

    /// The checked-in files are what the default configs render; regenerate them with
    /// `PgOutbox::ddl()` / `PgDedupStore::ddl()` when the layout changes.
    #[test]
    fn checked_in_sql_files_match_the_rendered_ddl() {
        // The files open with `--` comments saying where they come from.
        let statements = |file: &str| -> String {
            file.lines()
                .filter(|l| !l.starts_with("--"))
                .map(|l| format!("{l}\n"))
                .collect()
        };
        let outbox = outbox_ddl(&name("outbox", "outbox_messages"));
        assert_eq!(statements(include_str!("../sql/outbox.sql")), outbox);
        let inbox = inbox_ddl(&name("outbox", "outbox_inbox"));
        assert_eq!(statements(include_str!("../sql/inbox.sql")), inbox);
        let entities = entity_ddl(&name("outbox", "outbox_entities"));
        assert_eq!(statements(include_str!("../sql/entities.sql")), entities);
    }
}
