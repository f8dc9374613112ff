//! The tables' DDL, rendered from a validated [`QualifiedName`]. The DDL for the
//! default names is checked in as `sql/outbox.sql`, `sql/inbox.sql` and
//! `sql/entities.sql` (a unit test keeps them equal to what is rendered here); the
//! versioned installer that runs it is in `install.rs`.
//!
//! Each table has a [`Layout`]: the objects that make it (columns, keys, indexes), its
//! settings (table and index options that change how it performs, not what it holds),
//! and the layout version of the objects. Settings are applied by the DDL text and by
//! every install, so a table created before them, or on a server that has since been
//! upgraded, gets them without a new layout version.
//!
//! # The outbox table's layout (version 2)
//!
//! - `id binary(16)` is the **nonclustered** primary key. `uniqueidentifier` would not
//!   do: SQL Server orders it by its last six bytes first, not like
//!   [`MessageId`](outbox_core::MessageId), and dead-letter paging relies on id order.
//! - The **clustered** key is `(bucket, seq)`, where `bucket` is a persisted computed
//!   column, the id's last byte modulo 16 (random bits in a UUIDv7). Clustering on
//!   `id` (time-ordered UUIDv7) or on `seq` (an identity) would send every insert to
//!   the last page of the clustered index; with the bucket first, the clustered index
//!   takes inserts at 16 points, each append-only.
//! - That does not remove last-page contention: the primary key on the time-ordered
//!   `id` and `<table>_due` (keyed by the due time) still take every insert, and
//!   `<table>_due` every lease a claim writes, at their last page. Their
//!   `OPTIMIZE_FOR_SEQUENTIAL_KEY` is set where the server has it (SQL Server 2019 and
//!   later, Azure SQL): it paces the threads entering that page so the latch convoy
//!   does not collapse throughput; it does not spread the inserts. On SQL Server 2016
//!   and 2017 the option does not exist and those pages stay the hot spot.
//! - Text columns that are compared (`destination`, `partition_key`) use the binary
//!   collation `Latin1_General_100_BIN2`, so `=` is exact whatever the database's
//!   (usually case-insensitive) default is, as the contract's filters require.
//! - Filtered indexes give the contract's partial indexes, over undelivered rows:
//!   `<table>_due` on `(available_at, seq)`, including every column a per-key claim's
//!   first pass and `stats` read (`id`, `partition_key`, `lease_token`, `created_at`),
//!   so both run inside the index without key lookups; `<table>_key` on
//!   `(partition_key, seq)`, the per-key head probe. `<table>_dispatched` and
//!   `<table>_dead` serve purges, dead-letter pages and counts. Each includes the
//!   columns of its own filter: the optimizer is known to add a key lookup for a
//!   query's `col IS NULL` even when an index filter states the same, unless the column
//!   is in the index.
//! - `LOCK_ESCALATION = DISABLE`, set when the table is created (never again: a DBA's
//!   later choice stands): a statement holding many row locks on the table is never
//!   turned into a table lock that would block every enqueue. A claimed or purged row
//!   takes three to five key locks (the clustered key and each nonclustered index the
//!   statement changes), so a 2,000-row statement holds 6,000 to 10,000 locks, past the
//!   5,000 at which SQL Server escalates: only this setting keeps such statements at
//!   row level. The installer reads the setting back, and a store whose table escalates
//!   sends statements of at most 900 rows instead (see `sql::ESCALATING_BATCH`).
//!
//! Layout 1 (the first layout this crate shipped) lacked the includes of `<table>_due` and
//! `<table>_dead`; the installer refuses it with the way to upgrade (see the crate
//! README).
//!
//! The inbox and entity tables are at layout 1. The inbox's primary key (one
//! consumer's ids are time-ordered) and `<table>_processed_at` get
//! `OPTIMIZE_FOR_SEQUENTIAL_KEY` as settings where the server has it.

use crate::ident::{literal, quote, QualifiedName};
use crate::sql::UNDELIVERED;

/// The layout version of the outbox table this crate writes and expects (the
/// [`Schema::layout_version`](outbox_core::schema::Schema::layout_version) of its outbox
/// store).
pub const SCHEMA_VERSION: u32 = 2;

/// The layout version of the inbox (dedup) table.
pub(crate) const INBOX_VERSION: u32 = 1;

/// The layout version of the entity table.
pub(crate) const ENTITY_VERSION: u32 = 1;

/// The SET options filtered indexes need (the pool's check-out sets them; the DDL text
/// states them for other tools).
pub(crate) const SET_OPTIONS: &str = "SET ANSI_NULLS ON;\nSET QUOTED_IDENTIFIER ON;\n";

/// The table (in each schema used) recording installed layout versions.
pub(crate) const VERSION_TABLE: &str = "outbox_schema_versions";

/// Index name suffixes (`<table>_<suffix>`, see [`QualifiedName::derived`]); the
/// primary key's index is named after its constraint.
pub(crate) mod index {
    /// The primary key.
    pub(crate) const PK: &str = "pk";
    /// The outbox's clustered index.
    pub(crate) const CLUSTERED: &str = "clustered";
    /// Undelivered rows by due time.
    pub(crate) const DUE: &str = "due";
    /// Undelivered keyed rows by key and `seq`.
    pub(crate) const KEY: &str = "key";
    /// Dispatched rows by dispatch time.
    pub(crate) const DISPATCHED: &str = "dispatched";
    /// Dead letters by id.
    pub(crate) const DEAD: &str = "dead";
    /// Inbox records by time.
    pub(crate) const PROCESSED_AT: &str = "processed_at";
}

/// `INDEX([<table>_<suffix>])`, the table hint that pins a statement to that index.
pub(crate) fn index_hint(name: &QualifiedName, suffix: &str) -> String {
    format!("INDEX({})", quote(&name.derived(suffix)))
}

/// A table's objects, settings and layout version.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// The layout version the objects make.
    pub(crate) version: u32,
    /// Creates what is missing (table, indexes).
    pub(crate) objects: String,
    /// Applies the table's options where they are not set yet (idempotent, cheap when
    /// nothing changes).
    pub(crate) settings: String,
}

/// The outbox table's layout.
pub(crate) fn outbox_layout(name: &QualifiedName) -> Layout {
    Layout {
        version: SCHEMA_VERSION,
        objects: outbox_objects(name),
        settings: sequential_keys(name, &[index::PK, index::DUE, index::DISPATCHED]),
    }
}

/// The inbox table's layout.
pub(crate) fn inbox_layout(name: &QualifiedName) -> Layout {
    Layout {
        version: INBOX_VERSION,
        objects: inbox_objects(name),
        settings: sequential_keys(name, &[index::PK, index::PROCESSED_AT]),
    }
}

/// The entity table's layout.
pub(crate) fn entity_layout(name: &QualifiedName) -> Layout {
    Layout {
        version: ENTITY_VERSION,
        objects: entity_objects(name),
        settings: String::new(),
    }
}

/// The complete, idempotent DDL for an outbox table.
pub(crate) fn outbox_ddl(name: &QualifiedName) -> String {
    ddl(name, &outbox_layout(name))
}

/// The complete, idempotent DDL for an inbox (dedup) table.
pub(crate) fn inbox_ddl(name: &QualifiedName) -> String {
    ddl(name, &inbox_layout(name))
}

/// The complete, idempotent DDL for an entity table.
pub(crate) fn entity_ddl(name: &QualifiedName) -> String {
    ddl(name, &entity_layout(name))
}

/// `layout` wrapped in the prelude and followed by the version record. Every
/// statement checks the catalog first, so the text can be run again as is (one batch:
/// no `GO` needed).
pub(crate) fn ddl(name: &QualifiedName, layout: &Layout) -> String {
    let versions = name.sibling(VERSION_TABLE);
    format!(
        "{SET_OPTIONS}{prelude}{objects}{settings}\
         IF NOT EXISTS (SELECT 1 FROM {versions} WHERE table_name = {table})\n    \
         INSERT INTO {versions} (table_name, version) VALUES ({table}, {version});\n",
        prelude = prelude(name),
        objects = layout.objects,
        settings = layout.settings,
        table = literal(name.table()),
        version = layout.version,
    )
}

/// `IF <index missing> CREATE ...`.
fn index(name: &QualifiedName, suffix: &str, create: &str) -> String {
    let index = name.derived(suffix);
    format!(
        "IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID({table}) \
         AND name = {index_literal})\n    {create_kw} {quoted} ON {name} {create};\n",
        table = literal(&name.to_string()),
        index_literal = literal(&index),
        quoted = quote(&index),
        create_kw = if suffix == index::CLUSTERED {
            "CREATE UNIQUE CLUSTERED INDEX"
        } else {
            "CREATE INDEX"
        },
    )
}

/// `IF <table missing> CREATE TABLE name (columns)`.
fn table(name: &QualifiedName, columns: &str) -> String {
    format!(
        "IF OBJECT_ID({literal}, N'U') IS NULL\nCREATE TABLE {name} (\n{columns}\n);\n",
        literal = literal(&name.to_string()),
    )
}

/// Whether the server has `OPTIMIZE_FOR_SEQUENTIAL_KEY`: SQL Server 2019 (major
/// version 15) and later, Azure SQL Database (engine edition 5) and Managed Instance
/// (8), which report an older major version.
pub(crate) const HAS_SEQUENTIAL_KEY: &str =
    "CAST(SERVERPROPERTY('ProductMajorVersion') AS int) >= 15 \
     OR CAST(SERVERPROPERTY('EngineEdition') AS int) IN (5, 8)";

/// Set `OPTIMIZE_FOR_SEQUENTIAL_KEY = ON` on the named indexes where the server has the
/// option and it is off. Older servers refuse the option, and the catalog column
/// `sys.indexes.optimize_for_sequential_key`, when the batch is compiled, so both are
/// in dynamic SQL that only a server with the option runs.
fn sequential_keys(name: &QualifiedName, suffixes: &[&str]) -> String {
    let inner: String = suffixes
        .iter()
        .map(|suffix| {
            let index = name.derived(suffix);
            format!(
                "IF EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID({table}) \
                 AND name = {index_literal} AND optimize_for_sequential_key = 0) \
                 ALTER INDEX {quoted} ON {name} SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON); ",
                table = literal(&name.to_string()),
                index_literal = literal(&index),
                quoted = quote(&index),
            )
        })
        .collect();
    format!(
        "IF {HAS_SEQUENTIAL_KEY}\n    EXEC({inner});\n",
        inner = literal(inner.trim_end())
    )
}

/// `IF <table missing> BEGIN CREATE TABLE name (columns); then END`: `then` runs only
/// when this text creates the table.
fn table_then(name: &QualifiedName, columns: &str, then: &str) -> String {
    format!(
        "IF OBJECT_ID({literal}, N'U') IS NULL\nBEGIN\nCREATE TABLE {name} (\n{columns}\n);\n{then}\nEND;\n",
        literal = literal(&name.to_string()),
    )
}

/// The outbox table and its indexes.
pub(crate) fn outbox_objects(name: &QualifiedName) -> String {
    let columns = format!(
        "    id binary(16) NOT NULL,
    seq bigint IDENTITY(1, 1) NOT NULL,
    bucket AS CAST(CAST(SUBSTRING(id, 16, 1) AS int) % 16 AS tinyint) PERSISTED NOT NULL,
    destination nvarchar(max) COLLATE Latin1_General_100_BIN2 NOT NULL,
    partition_key nvarchar(400) COLLATE Latin1_General_100_BIN2 NULL,
    payload varbinary(max) NOT NULL,
    content_type nvarchar(max) NULL,
    headers nvarchar(max) NOT NULL CONSTRAINT {headers_default} DEFAULT N'{{}}',
    created_at datetime2(7) NOT NULL CONSTRAINT {created_default} DEFAULT SYSUTCDATETIME(),
    available_at datetime2(7) NOT NULL,
    attempts int NOT NULL CONSTRAINT {attempts_default} DEFAULT 0,
    last_error nvarchar(max) NULL,
    lease_token binary(16) NULL,
    dispatched_at datetime2(7) NULL,
    dead_at datetime2(7) NULL,
    CONSTRAINT {pk} PRIMARY KEY NONCLUSTERED (id)",
        headers_default = quote(&name.derived("headers_default")),
        created_default = quote(&name.derived("created_default")),
        attempts_default = quote(&name.derived("attempts_default")),
        pk = quote(&name.derived(index::PK)),
    );
    let no_escalation = format!("ALTER TABLE {name} SET (LOCK_ESCALATION = DISABLE);");
    let mut text = table_then(name, &columns, &no_escalation);
    text.push_str(&index(name, index::CLUSTERED, "(bucket, seq)"));
    text.push_str(&index(
        name,
        index::DUE,
        &format!(
            "(available_at, seq) INCLUDE (id, partition_key, lease_token, created_at, \
             dispatched_at, dead_at) WHERE {UNDELIVERED}"
        ),
    ));
    text.push_str(&index(
        name,
        index::KEY,
        &format!(
            "(partition_key, seq) INCLUDE (dispatched_at, dead_at) \
             WHERE {UNDELIVERED} AND partition_key IS NOT NULL"
        ),
    ));
    text.push_str(&index(
        name,
        index::DISPATCHED,
        "(dispatched_at) WHERE dispatched_at IS NOT NULL",
    ));
    text.push_str(&index(
        name,
        index::DEAD,
        "(id) INCLUDE (dead_at) WHERE dead_at IS NOT NULL",
    ));
    text
}

/// The inbox table of processed ids and its index.
pub(crate) fn inbox_objects(name: &QualifiedName) -> String {
    let columns = format!(
        "    consumer nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
    message_id binary(16) NOT NULL,
    processed_at datetime2(7) NOT NULL CONSTRAINT {processed_default} DEFAULT SYSUTCDATETIME(),
    CONSTRAINT {pk} PRIMARY KEY (consumer, message_id)",
        processed_default = quote(&name.derived("processed_default")),
        pk = quote(&name.derived(index::PK)),
    );
    let mut text = table(name, &columns);
    text.push_str(&index(name, index::PROCESSED_AT, "(processed_at)"));
    text
}

/// The entity table: one row per entity, state and outbox state as JSON text, the
/// version of the optimistic check.
pub(crate) fn entity_objects(name: &QualifiedName) -> String {
    let columns = format!(
        "    entity_key nvarchar(255) COLLATE Latin1_General_100_BIN2 NOT NULL,
    state nvarchar(max) NOT NULL,
    outbox nvarchar(max) NOT NULL CONSTRAINT {outbox_default} DEFAULT N'{{}}',
    version bigint NOT NULL CONSTRAINT {version_check} CHECK (version > 0),
    updated_at datetime2(7) NOT NULL CONSTRAINT {updated_default} DEFAULT SYSUTCDATETIME(),
    CONSTRAINT {pk} PRIMARY KEY (entity_key)",
        outbox_default = quote(&name.derived("outbox_default")),
        version_check = quote(&name.derived("version_check")),
        updated_default = quote(&name.derived("updated_default")),
        pk = quote(&name.derived(index::PK)),
    );
    table(name, &columns)
}

/// The schema (created through `EXEC`, since `CREATE SCHEMA` must be alone in its
/// batch) and the version table.
pub(crate) fn prelude(name: &QualifiedName) -> String {
    let versions = name.sibling(VERSION_TABLE);
    let create_schema = format!("CREATE SCHEMA {}", name.quoted_schema());
    let mut text = format!(
        "IF SCHEMA_ID({schema}) IS NULL EXEC({create});\n",
        schema = literal(name.schema()),
        create = literal(&create_schema),
    );
    text.push_str(&table(
        &versions,
        &format!(
            "    table_name nvarchar(128) NOT NULL CONSTRAINT {pk} PRIMARY KEY,
    version int NOT NULL,
    installed_at datetime2(7) NOT NULL CONSTRAINT {installed_default} DEFAULT SYSUTCDATETIME()",
            pk = quote(&versions.derived("pk")),
            installed_default = quote(&versions.derived("installed_default")),
        ),
    ));
    text
}

// The outbox and inbox tables, for tools.
outbox_core::backend::schema_from_inherent!(
    crate::MssqlOutbox,
    name = |s| s.qualified_name().to_string(),
    version = SCHEMA_VERSION
);
outbox_core::backend::schema_from_inherent!(
    crate::MssqlDedupStore,
    name = |s| s.config().display_name(),
    version = INBOX_VERSION
);

#[cfg(test)]
mod tests {
    use super::*;

    fn name(schema: &str, table: &str) -> QualifiedName {
        QualifiedName::new(schema, table).unwrap()
    }

    #[test]
    fn ddl_quotes_identifiers_and_checks_the_catalog_first() {
        let text = outbox_ddl(&name("s1", "t1"));
        assert!(text.contains("IF SCHEMA_ID(N's1') IS NULL EXEC(N'CREATE SCHEMA [s1]');"));
        assert!(text.contains("IF OBJECT_ID(N'[s1].[outbox_schema_versions]', N'U') IS NULL"));
        assert!(text.contains("CREATE TABLE [s1].[t1] ("));
        assert!(text
            .contains("CREATE UNIQUE CLUSTERED INDEX [t1_clustered] ON [s1].[t1] (bucket, seq);"));
        assert!(text.contains(
            "CREATE INDEX [t1_due] ON [s1].[t1] (available_at, seq) \
             INCLUDE (id, partition_key, lease_token, created_at, dispatched_at, dead_at) \
             WHERE dispatched_at IS NULL AND dead_at IS NULL;"
        ));
        assert!(text.contains(
            "CREATE INDEX [t1_dead] ON [s1].[t1] (id) INCLUDE (dead_at) WHERE dead_at IS NOT NULL;"
        ));
        assert!(text.contains("CONSTRAINT [t1_pk] PRIMARY KEY NONCLUSTERED (id)"));
        assert!(text.contains("VALUES (N't1', 2);"));
        for line in text
            .lines()
            .filter(|l| l.trim_start().starts_with("CREATE"))
        {
            // Each CREATE is the body of the IF on the line before.
            let before = text
                .split(line)
                .next()
                .unwrap()
                .lines()
                .last()
                .unwrap_or("");
            // (The outbox table's CREATE opens the `BEGIN` block of its IF.)
            let guarded = before.starts_with("IF ") || line.contains("IF ") || before == "BEGIN";
            assert!(guarded, "{line}");
        }
    }

    #[test]
    fn object_names_are_distinct_and_fit_for_long_tables() {
        let text = outbox_ddl(&name("s", &"t".repeat(128)));
        let names: std::collections::HashSet<String> = text
            .lines()
            .filter_map(|l| {
                l.split("CREATE INDEX [")
                    .nth(1)
                    .or(l.split("CLUSTERED INDEX [").nth(1))
            })
            .map(|l| l.split(']').next().unwrap().to_owned())
            .collect();
        assert_eq!(names.len(), 5, "{names:?}");
        assert!(names.iter().all(|n| n.len() <= 128));
    }

    #[test]
    fn the_outbox_disables_lock_escalation_when_it_creates_the_table_only() {
        let text = outbox_ddl(&name("s1", "t1"));
        assert!(text
            .contains("IF OBJECT_ID(N'[s1].[t1]', N'U') IS NULL\nBEGIN\nCREATE TABLE [s1].[t1] ("));
        assert!(text.contains(");\nALTER TABLE [s1].[t1] SET (LOCK_ESCALATION = DISABLE);\nEND;\n"));
        assert_eq!(text.matches("LOCK_ESCALATION").count(), 1, "{text}");
        // Settings, applied to an existing table at every install, never touch it: a
        // DBA's choice stands.
        assert!(!outbox_layout(&name("s1", "t1"))
            .settings
            .contains("LOCK_ESCALATION"));
        assert!(!inbox_ddl(&name("s1", "t1")).contains("LOCK_ESCALATION"));
    }

    /// `OPTIMIZE_FOR_SEQUENTIAL_KEY` exists from SQL Server 2019 and on Azure SQL; older
    /// servers refuse the option (and the catalog column) when the batch compiles, so
    /// the text names them only inside `EXEC(N'...')`, behind the version check.
    #[test]
    fn sequential_keys_are_set_only_where_the_server_has_them() {
        for (text, indexes) in [
            (
                outbox_ddl(&name("s1", "t1")),
                vec!["t1_pk", "t1_due", "t1_dispatched"],
            ),
            (
                inbox_ddl(&name("s1", "t1")),
                vec!["t1_pk", "t1_processed_at"],
            ),
        ] {
            let guard = format!("IF {HAS_SEQUENTIAL_KEY}\n    EXEC(N'");
            let (before, dynamic) = text.split_once(&guard).expect("the version check");
            assert!(!before.contains("OPTIMIZE_FOR_SEQUENTIAL_KEY"));
            let dynamic = dynamic.split("');\n").next().unwrap();
            for index in &indexes {
                assert!(
                    dynamic.contains(&format!(
                        "AND name = N''{index}'' AND optimize_for_sequential_key = 0) \
                         ALTER INDEX [{index}] ON [s1].[t1] SET (OPTIMIZE_FOR_SEQUENTIAL_KEY = ON);"
                    )),
                    "{index}: {dynamic}"
                );
            }
            assert_eq!(dynamic.matches("ALTER INDEX").count(), indexes.len());
            assert_eq!(
                text.matches("OPTIMIZE_FOR_SEQUENTIAL_KEY = ON").count(),
                indexes.len()
            );
        }
        assert!(HAS_SEQUENTIAL_KEY.contains("SERVERPROPERTY('ProductMajorVersion') AS int) >= 15"));
        assert!(HAS_SEQUENTIAL_KEY.contains("SERVERPROPERTY('EngineEdition') AS int) IN (5, 8)"));
        assert!(!entity_ddl(&name("s1", "t1")).contains("SEQUENTIAL"));
    }

    #[test]
    fn layouts_carry_their_own_versions() {
        let t = name("s1", "t1");
        assert_eq!(outbox_layout(&t).version, 2);
        assert_eq!(inbox_layout(&t).version, 1);
        assert_eq!(entity_layout(&t).version, 1);
        assert!(inbox_ddl(&t).contains("VALUES (N't1', 1);"));
        assert!(entity_ddl(&t).contains("VALUES (N't1', 1);"));
        // Settings come after the objects they change, and are part of the DDL text.
        let layout = outbox_layout(&t);
        let text = outbox_ddl(&t);
        assert!(text.find(&layout.objects).unwrap() < text.find(&layout.settings).unwrap());
    }

    /// The checked-in files are what the default configs render; regenerate them with
    /// `MssqlOutbox::ddl()` and friends when the layout changes.
    #[test]
    fn checked_in_sql_files_match_the_rendered_ddl() {
        let statements = outbox_core::backend::ddl_file_statements;
        let outbox = outbox_ddl(&name("outbox", "outbox_messages"));
        assert_eq!(statements(include_str!("../sql/outbox.sql")), outbox);
        let inbox = inbox_ddl(&name("outbox", "outbox_inbox"));
        assert_eq!(statements(include_str!("../sql/inbox.sql")), inbox);
        let entities = entity_ddl(&name("outbox", "outbox_entities"));
        assert_eq!(statements(include_str!("../sql/entities.sql")), entities);
    }
}
