//! The tables' DDL, rendered from a validated [`QualifiedName`], and the idempotent,
//! versioned installer. The DDL for the default names is checked in as
//! `sql/outbox.sql`, `sql/inbox.sql` and `sql/entities.sql` (a unit test keeps them
//! equal to what is rendered here).
//!
//! # The outbox table's layout
//!
//! - `id binary(16)` is the **nonclustered** primary key. `uniqueidentifier` would not
//!   do: SQL Server orders it by its last six bytes first, not like
//!   [`MessageId`](outbox_core::MessageId), and dead-letter paging relies on id order.
//! - The **clustered** key is `(bucket, seq)`, where `bucket` is a persisted computed
//!   column, the id's last byte modulo 16 (random bits in a UUIDv7). Clustering on
//!   `id` (time-ordered UUIDv7) or on `seq` (an identity) would send every insert to
//!   the last page of the clustered index: under concurrent enqueues, one page latch
//!   (`PAGELATCH_EX`) serialises them all. With the bucket first, inserts land on 16
//!   insertion points, each still append-only (no page splits in the middle of the
//!   index), so latch waits drop by about that factor while range scans by bucket stay
//!   cheap. `OPTIMIZE_FOR_SEQUENTIAL_KEY` (SQL Server 2019+) only queues the waiters
//!   better; it is not used, so the DDL runs on SQL Server 2016 and later.
//! - Text columns that are compared (`destination`, `partition_key`) use the binary
//!   collation `Latin1_General_100_BIN2`, so `=` is exact whatever the database's
//!   (usually case-insensitive) default is, as the contract's filters require.
//! - Filtered indexes give the contract's partial indexes: `<table>_due` on
//!   `(available_at, seq)` and `<table>_key` on `(partition_key, seq)` over
//!   undelivered rows, `<table>_dispatched` and `<table>_dead`. `<table>_key` includes
//!   the filter's own columns: the optimizer is known to add a key lookup for a query's
//!   `col IS NULL` even when an index filter states the same, unless the column is in
//!   the index, and would then look every probed row up in the clustered index. Index-only, the
//!   per-key head probe takes no lock on a table row, so with
//!   `READ_COMMITTED_SNAPSHOT` off it does not wait on a row another transaction has
//!   only updated (a claim, a lease, an error text).
//!
//! # Installing
//!
//! [`install`] runs in one transaction on a dedicated connection, serialised across
//! processes with `sp_getapplock` (transaction-owned, per schema), creates what is
//! missing, and records the layout version in `[<schema>].[outbox_schema_versions]`;
//! [`ErrorKind::Schema`] when a table was installed at another version.

use outbox_core::{Error, ErrorKind, Result};

use crate::error::from_tiberius;
use crate::exec::{query_rows, row_i32, row_str};
use crate::ident::{literal, quote, QualifiedName};
use crate::session::{rollback_quietly, MssqlClient, COMMIT};
use crate::sql::{Binder, Param, Stmt, UNDELIVERED};

/// The layout version this crate writes and expects.
pub const SCHEMA_VERSION: i32 = 1;

/// Begins the installer's transaction: any error aborts it whole.
pub(crate) const INSTALL_BEGIN: &str = "SET XACT_ABORT ON; BEGIN TRANSACTION;";

/// The SET options filtered indexes need (tiberius logs in with ANSI defaults on; the
/// DDL text states them for other tools).
pub(crate) const SET_OPTIONS: &str = "SET ANSI_NULLS ON;\nSET QUOTED_IDENTIFIER ON;\n";

/// The table (in each schema used) recording installed layout versions.
pub(crate) const VERSION_TABLE: &str = "outbox_schema_versions";

/// The complete, idempotent DDL for an outbox table.
pub(crate) fn outbox_ddl(name: &QualifiedName) -> String {
    ddl(name, &outbox_objects(name))
}

/// The complete, idempotent DDL for an inbox (dedup) table.
pub(crate) fn inbox_ddl(name: &QualifiedName) -> String {
    ddl(name, &inbox_objects(name))
}

/// The complete, idempotent DDL for an entity table.
pub(crate) fn entity_ddl(name: &QualifiedName) -> String {
    ddl(name, &entity_objects(name))
}

/// `objects` wrapped in the prelude and followed by the version record. Every
/// statement checks the catalog first, so the text can be run again as is (one batch:
/// no `GO` needed).
pub(crate) fn ddl(name: &QualifiedName, objects: &str) -> String {
    let versions = name.sibling(VERSION_TABLE);
    format!(
        "{SET_OPTIONS}{prelude}{objects}\
         IF NOT EXISTS (SELECT 1 FROM {versions} WHERE table_name = {table})\n    \
         INSERT INTO {versions} (table_name, version) VALUES ({table}, {SCHEMA_VERSION});\n",
        prelude = prelude(name),
        table = literal(name.table()),
    )
}

/// `IF <index missing> CREATE ...`.
fn index(name: &QualifiedName, suffix: &str, create: &str) -> String {
    let index = name.derived(suffix);
    format!(
        "IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE object_id = OBJECT_ID({table}) \
         AND name = {index_literal})\n    {create_kw} {quoted} ON {name} {create};\n",
        table = name.literal(),
        index_literal = literal(&index),
        quoted = quote(&index),
        create_kw = if suffix == "clustered" {
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
        literal = name.literal(),
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
        pk = quote(&name.derived("pk")),
    );
    let mut text = table(name, &columns);
    text.push_str(&index(name, "clustered", "(bucket, seq)"));
    text.push_str(&index(
        name,
        "due",
        &format!("(available_at, seq) WHERE {UNDELIVERED}"),
    ));
    text.push_str(&index(
        name,
        "key",
        &format!(
            "(partition_key, seq) INCLUDE (dispatched_at, dead_at) \
             WHERE {UNDELIVERED} AND partition_key IS NOT NULL"
        ),
    ));
    text.push_str(&index(
        name,
        "dispatched",
        "(dispatched_at) WHERE dispatched_at IS NOT NULL",
    ));
    text.push_str(&index(name, "dead", "(id) WHERE dead_at IS NOT NULL"));
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
        pk = quote(&name.derived("pk")),
    );
    let mut text = table(name, &columns);
    text.push_str(&index(name, "processed_at", "(processed_at)"));
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
        pk = quote(&name.derived("pk")),
    );
    table(name, &columns)
}

/// The schema (created through `EXEC`, since `CREATE SCHEMA` must be alone in its
/// batch) and the version table.
fn prelude(name: &QualifiedName) -> String {
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

/// Take the per-schema install lock for the current transaction, waiting up to a
/// minute.
pub(crate) fn install_lock(name: &QualifiedName) -> Stmt {
    let mut b = Binder::default();
    let resource = b.bind(Param::Text(Some(format!(
        "outbox-sqlserver:install:{}",
        name.schema()
    ))));
    b.finish(format!(
        "EXEC sp_getapplock @Resource = {resource}, @LockMode = 'Exclusive', \
         @LockOwner = 'Transaction', @LockTimeout = 60000; \
         SELECT APPLOCK_MODE('public', {resource}, 'Transaction') AS mode;"
    ))
}

/// The recorded layout version of `name`, if any.
pub(crate) fn installed_version(name: &QualifiedName) -> Stmt {
    let mut b = Binder::default();
    let table = b.bind(Param::Text(Some(name.table().to_owned())));
    b.finish(format!(
        "SELECT version FROM {versions} WHERE table_name = {table};",
        versions = name.sibling(VERSION_TABLE),
    ))
}

/// Record `name` at [`SCHEMA_VERSION`].
pub(crate) fn record_version(name: &QualifiedName) -> Stmt {
    let mut b = Binder::default();
    let table = b.bind(Param::Text(Some(name.table().to_owned())));
    let version = b.bind(Param::I32(SCHEMA_VERSION));
    b.finish(format!(
        "INSERT INTO {versions} (table_name, version) VALUES ({table}, {version});",
        versions = name.sibling(VERSION_TABLE),
    ))
}

/// Create `name` with `objects` unless it is already recorded, under the per-schema
/// install lock, and record [`SCHEMA_VERSION`]: one transaction on `client` (a
/// dedicated connection; on an error it is rolled back before the error returns).
///
/// # Errors
/// [`ErrorKind::Schema`] when the table was installed at another layout version, or
/// the install lock could not be had within a minute; mapped driver errors otherwise.
pub(crate) async fn install(
    client: &mut MssqlClient,
    name: &QualifiedName,
    objects: &str,
) -> Result<()> {
    let result = install_in_transaction(client, name, objects).await;
    if result.is_err() {
        rollback_quietly(client).await;
    }
    result
}

async fn install_in_transaction(
    client: &mut MssqlClient,
    name: &QualifiedName,
    objects: &str,
) -> Result<()> {
    let err = |e| from_tiberius("schema install", e);
    client
        .simple_query(INSTALL_BEGIN)
        .await
        .map_err(err)?
        .into_results()
        .await
        .map_err(err)?;
    let locked = crate::exec::query_all_rows(client, install_lock(name))
        .await
        .map_err(err)?;
    let mode = locked.first().map(|row| row_str(row, "mode")).transpose()?;
    if mode.as_deref() != Some("Exclusive") {
        return Err(Error::new(
            ErrorKind::Schema,
            format!(
                "could not take the install lock of schema {} within a minute",
                name.quoted_schema()
            ),
        ));
    }
    let prelude = format!("{SET_OPTIONS}{}", prelude(name));
    client
        .simple_query(prelude)
        .await
        .map_err(err)?
        .into_results()
        .await
        .map_err(err)?;
    let installed = query_rows(client, installed_version(name))
        .await
        .map_err(err)?;
    match installed
        .first()
        .map(|row| row_i32(row, "version"))
        .transpose()?
    {
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
            client
                .simple_query(objects.to_owned())
                .await
                .map_err(err)?
                .into_results()
                .await
                .map_err(err)?;
            query_rows(client, record_version(name))
                .await
                .map_err(err)?;
        }
    }
    client
        .simple_query(COMMIT)
        .await
        .map_err(err)?
        .into_results()
        .await
        .map_err(err)?;
    Ok(())
}

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
             WHERE dispatched_at IS NULL AND dead_at IS NULL;"
        ));
        assert!(text.contains("CONSTRAINT [t1_pk] PRIMARY KEY NONCLUSTERED (id)"));
        assert!(text.contains("VALUES (N't1', 1);"));
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
            assert!(before.starts_with("IF ") || line.contains("IF "), "{line}");
        }
    }

    #[test]
    fn object_names_are_distinct_and_fit_for_long_tables() {
        let text = outbox_ddl(&name("s", &"t".repeat(128)));
        let names: std::collections::HashSet<String> = text
            .lines()
            .filter_map(|l| l.split("INDEX [").nth(1))
            .map(|l| l.split(']').next().unwrap().to_owned())
            .collect();
        assert_eq!(names.len(), 5, "{names:?}");
        assert!(names.iter().all(|n| n.len() <= 128));
    }

    /// The checked-in files are what the default configs render; regenerate them with
    /// `MssqlOutbox::ddl()` and friends when the layout changes.
    #[test]
    fn checked_in_sql_files_match_the_rendered_ddl() {
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
