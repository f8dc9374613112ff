//! The tables' DDL, rendered from a validated [`QualifiedName`], and the idempotent,
//! versioned installer. The layout and the use with migration tools are described in
//! the crate README; the DDL for the default names is checked in as `sql/outbox.sql`
//! (unordered), `sql/outbox_per_key.sql` (per-key order), `sql/inbox.sql` and
//! `sql/entities.sql` (a unit test keeps them equal to what is rendered here).
//!
//! Each installed table is recorded with its layout version in
//! `"<schema>".outbox_schema_versions`; [`install`] creates what is missing and fails
//! with [`ErrorKind::Schema`] when a table was installed at another version. Concurrent
//! installs are serialised with a transaction-scoped advisory lock per schema.
//!
//! # Indexes follow the configuration
//!
//! The outbox table has the same columns in every configuration, but not the same
//! indexes: `<table>_key` (undelivered keyed rows by `(partition_key, seq)`) is read
//! only by per-key claims, so only a [`KeyOrder::PerKey`] outbox renders and installs
//! it. The layout version does not change with it: the version names the columns and
//! what they mean, which every statement of every release at that version relies on,
//! whereas an index is an access path no statement needs to be correct. Either table
//! serves either configuration (per-key claims without the index are correct, only
//! slow), so producers that enqueue through an unordered outbox and a per-key relay may
//! share one table; a version per index set would make the first to install lock the
//! other out. Instead, [`install_with`] adds the indexes a configuration needs to a
//! table installed at this version, and never drops one.

use sqlx::{Executor, PgPool};

use outbox_core::{Error, ErrorKind, KeyOrder, Result};

use crate::error::from_sqlx;
use crate::ident::QualifiedName;

/// The layout version this crate writes and expects (the
/// [`Schema::layout_version`](outbox_core::schema::Schema::layout_version) of its outbox
/// and inbox stores).
pub const SCHEMA_VERSION: u32 = 1;

/// The table (in each schema used) recording installed layout versions.
pub(crate) const VERSION_TABLE: &str = "outbox_schema_versions";

/// Not dispatched and not dead, as the partial indexes state it. Statements that must
/// use these indexes repeat it verbatim, so the planner can prove the index applies;
/// statements that must reach rows by primary key only write it another way
/// ([`crate::sql`]).
pub(crate) const UNDELIVERED: &str = "dispatched_at IS NULL AND dead_at IS NULL";

/// The complete, idempotent DDL for an outbox table with the indexes `ordering` uses:
/// schema, version table, table, indexes and the version record.
pub(crate) fn outbox_ddl(name: &QualifiedName, ordering: KeyOrder) -> String {
    ddl(name, &outbox_objects(name, ordering))
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

/// The outbox table and the indexes `ordering` uses ([`outbox_indexes`]).
pub(crate) fn outbox_objects(name: &QualifiedName, ordering: KeyOrder) -> String {
    let mut text = format!(
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
"#
    );
    for index in outbox_indexes(name, ordering) {
        text.push_str(&index.ddl);
    }
    text.push_str(&held_registry(name));
    text
}

/// The table of held-lock batches ([`ClaimMode::HeldLock`](outbox_core::ClaimMode)):
/// one row per open batch, keyed by the transaction holding it, listing its message
/// ids, so that a batch whose transaction ended without committing (its relay died)
/// is charged an attempt per message. Created in every mode, so a relay can switch
/// modes without a migration.
pub(crate) fn held_registry(name: &QualifiedName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {held} (\n    xid xid8 PRIMARY KEY,\n    ids uuid[] NOT NULL,\n    \
         held_at timestamptz NOT NULL DEFAULT now()\n);\n",
        held = held_table(name),
    )
}

/// `"schema"."<table>_held"`.
pub(crate) fn held_table(name: &QualifiedName) -> String {
    format!("{}.{}", name.quoted_schema(), name.quoted_derived("held"))
}

/// A secondary index of a table: its name and the idempotent statement creating it.
#[derive(Debug, Clone)]
pub(crate) struct Index {
    /// `"schema"."index"`, as `to_regclass` reads it.
    pub(crate) name: String,
    /// `CREATE INDEX IF NOT EXISTS ...;` and a newline.
    pub(crate) ddl: String,
}

impl Index {
    fn new(table: &QualifiedName, suffix: &str, columns: &str, predicate: &str) -> Index {
        let index = table.quoted_derived(suffix);
        Index {
            name: format!("{}.{index}", table.quoted_schema()),
            ddl: format!(
                "CREATE INDEX IF NOT EXISTS {index} ON {table} ({columns})\n    WHERE {predicate};\n"
            ),
        }
    }
}

/// The outbox table's secondary indexes under `ordering`, all partial:
///
/// - `<table>_due` (undelivered rows by `(available_at, seq)`): every claim.
/// - `<table>_key` (undelivered keyed rows by `(partition_key, seq)`): the head-of-key
///   probe of per-key claims, and nothing else, so only under [`KeyOrder::PerKey`].
/// - `<table>_dispatched` (dispatched rows by `dispatched_at`): purges and counts of
///   kept history, and the dispatched count of `stats` in every configuration. Under
///   `Retention::Delete` no row is ever dispatched, so it stays empty and costs each
///   insert or update only the check of its predicate.
/// - `<table>_dead` (dead letters by `id`): the dead-letter admin statements and
///   `stats`; empty until something is dead-lettered.
pub(crate) fn outbox_indexes(name: &QualifiedName, ordering: KeyOrder) -> Vec<Index> {
    let mut indexes = vec![Index::new(name, "due", "available_at, seq", UNDELIVERED)];
    if ordering == KeyOrder::PerKey {
        indexes.push(Index::new(
            name,
            "key",
            "partition_key, seq",
            &format!("{UNDELIVERED} AND partition_key IS NOT NULL"),
        ));
    }
    indexes.push(Index::new(
        name,
        "dispatched",
        "dispatched_at",
        "dispatched_at IS NOT NULL",
    ));
    indexes.push(Index::new(name, "dead", "id", "dead_at IS NOT NULL"));
    indexes
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
        index = name.quoted_derived("processed_at"),
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

/// Create `name` with `objects` (idempotent DDL, such as [`inbox_objects`]) unless it
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
    install_with(pool, name, objects, &[]).await
}

/// As [`install`], and on a table already installed at this version, create those of
/// `indexes` that are missing (the indexes this configuration reads that another
/// configuration may have installed the table without, see the module docs). Indexes
/// present are found in the catalog and left alone: `CREATE INDEX IF NOT EXISTS` alone
/// would take the table's `SHARE` lock even when the index exists, waiting for every
/// open transaction that wrote to it and holding up enqueues meanwhile. No index is
/// ever dropped.
///
/// A missing index is built inside the install's transaction, holding that lock (no
/// writes to the table) for the build; on a large table, build it beforehand with
/// `CREATE INDEX CONCURRENTLY` (the crate README says how).
///
/// # Errors
/// As [`install`], and [`ErrorKind::Schema`] when one of `indexes` exists but is
/// invalid (left so by a failed `CREATE INDEX CONCURRENTLY`), since creating it again
/// would do nothing.
pub(crate) async fn install_with(
    pool: &PgPool,
    name: &QualifiedName,
    objects: &str,
    indexes: &[Index],
) -> Result<()> {
    let err = |e| from_sqlx("schema install", e);
    // The version column is an `integer`.
    let expected = i32::try_from(SCHEMA_VERSION).map_err(|_| {
        Error::new(
            ErrorKind::Schema,
            format!("layout version {SCHEMA_VERSION} does not fit the version column"),
        )
    })?;
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
        Some(found) if found == expected => {
            for index in indexes {
                // None for a missing index, false for an invalid one.
                let valid: Option<bool> = sqlx::query_scalar(
                    "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)",
                )
                .bind(&index.name)
                .fetch_optional(&mut *tx)
                .await
                .map_err(err)?;
                match valid {
                    Some(true) => {}
                    Some(false) => {
                        return Err(Error::new(
                            ErrorKind::Schema,
                            format!(
                                "index {} of {name} is invalid (a failed CREATE INDEX \
                                 CONCURRENTLY leaves it so): drop it or REINDEX it, then \
                                 install again",
                                index.name
                            ),
                        ))
                    }
                    None => {
                        tx.execute(sqlx::raw_sql(&index.ddl)).await.map_err(err)?;
                    }
                }
            }
        }
        Some(other) => {
            return Err(outbox_core::backend::layout_mismatch(
                &name,
                other.into(),
                SCHEMA_VERSION.into(),
            ))
        }
        None => {
            tx.execute(sqlx::raw_sql(objects)).await.map_err(err)?;
            sqlx::query(&format!(
                "INSERT INTO {versions} (table_name, version) VALUES ($1, $2)"
            ))
            .bind(name.table())
            .bind(expected)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
    }
    tx.commit().await.map_err(err)
}

// The outbox and inbox tables, for tools.
outbox_core::backend::schema_from_inherent!(
    crate::PgOutbox,
    name = |s| s.qualified_name().to_string(),
    version = SCHEMA_VERSION
);
outbox_core::backend::schema_from_inherent!(
    crate::PgDedupStore,
    name = |s| s.config().display_name(),
    version = SCHEMA_VERSION
);

#[cfg(test)]
mod tests {
    use super::*;

    fn name(schema: &str, table: &str) -> QualifiedName {
        QualifiedName::new(schema, table).unwrap()
    }

    #[test]
    fn ddl_quotes_identifiers_and_is_idempotent() {
        for ordering in [KeyOrder::Unordered, KeyOrder::PerKey] {
            let text = outbox_ddl(&name("s1", "t1"), ordering);
            assert!(text.contains("CREATE SCHEMA IF NOT EXISTS \"s1\";"));
            assert!(text.contains("CREATE TABLE IF NOT EXISTS \"s1\".\"outbox_schema_versions\""));
            assert!(text.contains("CREATE TABLE IF NOT EXISTS \"s1\".\"t1\" ("));
            assert!(text.contains("\"t1_due\" ON \"s1\".\"t1\" (available_at, seq)"));
            assert!(text.contains("VALUES ('t1', 1) ON CONFLICT (table_name) DO NOTHING"));
            for line in text.lines().filter(|l| l.starts_with("CREATE")) {
                assert!(line.contains("IF NOT EXISTS"), "{line}");
            }
        }
    }

    fn index_names(text: &str) -> Vec<&str> {
        text.lines()
            .filter_map(|l| l.strip_prefix("CREATE INDEX IF NOT EXISTS "))
            .map(|l| l.split(' ').next().unwrap())
            .collect()
    }

    #[test]
    fn only_per_key_order_gets_the_key_index() {
        let t = name("s", "t");
        let unordered = outbox_ddl(&t, KeyOrder::Unordered);
        let per_key = outbox_ddl(&t, KeyOrder::PerKey);
        assert_eq!(
            index_names(&unordered),
            ["\"t_due\"", "\"t_dispatched\"", "\"t_dead\""]
        );
        assert_eq!(
            index_names(&per_key),
            ["\"t_due\"", "\"t_key\"", "\"t_dispatched\"", "\"t_dead\""]
        );
        assert!(per_key.contains(
            "CREATE INDEX IF NOT EXISTS \"t_key\" ON \"s\".\"t\" (partition_key, seq)\n    \
             WHERE dispatched_at IS NULL AND dead_at IS NULL AND partition_key IS NOT NULL;\n"
        ));
        // The same table either way: only the index differs.
        let without_key: String = per_key
            .split_inclusive('\n')
            .filter(|l| !l.contains("\"t_key\"") && !l.contains("partition_key IS NOT NULL"))
            .collect();
        assert_eq!(without_key, unordered);
        let names: Vec<String> = outbox_indexes(&t, KeyOrder::PerKey)
            .into_iter()
            .map(|i| i.name)
            .collect();
        assert_eq!(
            names,
            [
                "\"s\".\"t_due\"",
                "\"s\".\"t_key\"",
                "\"s\".\"t_dispatched\"",
                "\"s\".\"t_dead\""
            ]
        );
    }

    #[test]
    fn index_names_are_distinct_for_long_tables() {
        let text = outbox_ddl(&name("s", &"t".repeat(63)), KeyOrder::PerKey);
        let names: std::collections::HashSet<&str> = index_names(&text).into_iter().collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(names.iter().all(|n| n.len() <= 63 + 2));
    }

    /// The checked-in files are what the default configs (and the default with per-key
    /// order) render; regenerate them with `PgOutbox::ddl()` / `PgDedupStore::ddl()` /
    /// `PgEntityStore::ddl()` when the layout changes.
    #[test]
    fn checked_in_sql_files_match_the_rendered_ddl() {
        // The files open with `--` comments saying where they come from.
        let statements = outbox_core::backend::ddl_file_statements;
        let outbox = name("outbox", "outbox_messages");
        assert_eq!(
            statements(include_str!("../sql/outbox.sql")),
            outbox_ddl(&outbox, KeyOrder::Unordered)
        );
        assert_eq!(
            statements(include_str!("../sql/outbox_per_key.sql")),
            outbox_ddl(&outbox, KeyOrder::PerKey)
        );
        let inbox = inbox_ddl(&name("outbox", "outbox_inbox"));
        assert_eq!(statements(include_str!("../sql/inbox.sql")), inbox);
        let entities = entity_ddl(&name("outbox", "outbox_entities"));
        assert_eq!(statements(include_str!("../sql/entities.sql")), entities);
    }
}
