//! The outbox table's DDL, as text for your own migration tool, and an idempotent
//! installer.
//!
//! # Layout
//!
//! While a lease is held, `available_at` **is** the lease expiry: a claim sets
//! `available_at = now() + lease`, a fresh `lease_token` and `attempts + 1`. So a message
//! is
//!
//! - **due** when `dispatched_at IS NULL AND dead_at IS NULL AND available_at <= now()`
//!   (an expired lease needs no extra logic: the message is simply due again);
//! - **in flight** when it is not dispatched or dead, `lease_token IS NOT NULL` and
//!   `available_at > now()`;
//! - **dispatched** when `dispatched_at` is set (kept only under
//!   [`Retention::Keep`](outbox_core::Retention::Keep)), **dead** when `dead_at` is set.
//!
//! Indexes are partial, so claims, per-key checks, purges and dead-letter listings cost
//! the same however much history the table holds.
//!
//! # Versions
//!
//! Each installed table is recorded with its layout version in
//! `"<schema>".outbox_schema_versions`. [`install`] creates what is missing and fails
//! with [`ErrorKind::Schema`] when a table was installed
//! at another version. Concurrent installs are serialised with a transaction-scoped
//! advisory lock per schema.

use sqlx::{Executor, PgPool};

use outbox_core::{Error, ErrorKind, Result};

use crate::config::{derived_identifier, PgOutboxConfig};
use crate::error::from_sqlx;

/// The layout version this crate writes and expects.
pub const SCHEMA_VERSION: i32 = 1;

/// The table (in each schema used) recording installed layout versions.
pub const VERSION_TABLE: &str = "outbox_schema_versions";

/// The complete DDL for `config`'s schema and table, ending with the version record.
///
/// Every statement is idempotent (`IF NOT EXISTS`, `ON CONFLICT DO NOTHING`), so the text
/// can be fed to a migration tool or to `psql` as is.
pub fn ddl(config: &PgOutboxConfig) -> String {
    let mut text = objects_ddl(config);
    // The table name is a validated identifier ([a-z0-9_]), so quoting it as a literal
    // is safe; `install` binds it instead.
    text.push_str(&format!(
        "INSERT INTO \"{schema}\".{VERSION_TABLE} (table_name, version) \
         VALUES ('{table}', {SCHEMA_VERSION}) ON CONFLICT (table_name) DO NOTHING;\n",
        schema = config.schema_name(),
        table = config.table_name(),
    ));
    text
}

/// The schema, version table, outbox table and its indexes.
fn objects_ddl(config: &PgOutboxConfig) -> String {
    let schema = config.schema_name();
    let table = config.table_name();
    let t = config.qualified_table();
    let pending = "dispatched_at IS NULL AND dead_at IS NULL";
    let due_index = derived_identifier(table, "due");
    let key_index = derived_identifier(table, "key");
    let dispatched_index = derived_identifier(table, "dispatched");
    let dead_index = derived_identifier(table, "dead");
    format!(
        r#"{prelude}CREATE TABLE IF NOT EXISTS {t} (
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
CREATE INDEX IF NOT EXISTS "{due_index}" ON {t} (available_at, seq)
    WHERE {pending};
CREATE INDEX IF NOT EXISTS "{key_index}" ON {t} (partition_key, seq)
    WHERE {pending} AND partition_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS "{dispatched_index}" ON {t} (dispatched_at)
    WHERE dispatched_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS "{dead_index}" ON {t} (id)
    WHERE dead_at IS NOT NULL;
"#,
        prelude = schema_prelude(schema),
    )
}

/// `CREATE SCHEMA` and the version table.
pub(crate) fn schema_prelude(schema: &str) -> String {
    format!(
        r#"CREATE SCHEMA IF NOT EXISTS "{schema}";
CREATE TABLE IF NOT EXISTS "{schema}".{VERSION_TABLE} (
    table_name text PRIMARY KEY,
    version integer NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now()
);
"#
    )
}

/// Create `config`'s schema, table and indexes if missing, and record the version.
///
/// Safe to call from every process at start-up: installs of the same schema are
/// serialised, and an installed table at this crate's version is left alone.
///
/// # Errors
/// [`ErrorKind::Config`] for an invalid config;
/// [`ErrorKind::Schema`] when the table was installed at another layout version;
/// mapped driver errors otherwise.
pub async fn install(pool: &PgPool, config: &PgOutboxConfig) -> Result<()> {
    config.validate()?;
    install_versioned(
        pool,
        config.schema_name(),
        config.table_name(),
        &objects_ddl(config),
    )
    .await
}

/// Run `objects` (idempotent DDL that includes [`schema_prelude`]) unless `table` is
/// already recorded, under a per-schema advisory lock, and record [`SCHEMA_VERSION`].
pub(crate) async fn install_versioned(
    pool: &PgPool,
    schema: &str,
    table: &str,
    objects: &str,
) -> Result<()> {
    let err = |e| from_sqlx("schema install", e);
    let mut tx = pool.begin().await.map_err(err)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("outbox-postgres:install:{schema}"))
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    let prelude = schema_prelude(schema);
    tx.execute(sqlx::raw_sql(&prelude)).await.map_err(err)?;
    let installed: Option<i32> = sqlx::query_scalar(&format!(
        "SELECT version FROM \"{schema}\".{VERSION_TABLE} WHERE table_name = $1"
    ))
    .bind(table)
    .fetch_optional(&mut *tx)
    .await
    .map_err(err)?;
    match installed {
        Some(SCHEMA_VERSION) => {}
        Some(other) => {
            return Err(Error::new(
                ErrorKind::Schema,
                format!(
                    "table {schema}.{table} is at layout version {other}, \
                     this crate expects {SCHEMA_VERSION}"
                ),
            ))
        }
        None => {
            tx.execute(sqlx::raw_sql(objects)).await.map_err(err)?;
            sqlx::query(&format!(
                "INSERT INTO \"{schema}\".{VERSION_TABLE} (table_name, version) VALUES ($1, $2)"
            ))
            .bind(table)
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

    #[test]
    fn ddl_quotes_identifiers_and_is_idempotent() {
        let text = ddl(&PgOutboxConfig::default().schema("s1").table("t1"));
        assert!(text.contains("CREATE SCHEMA IF NOT EXISTS \"s1\";"));
        assert!(text.contains("CREATE TABLE IF NOT EXISTS \"s1\".\"t1\" ("));
        assert!(text.contains("\"t1_due\" ON \"s1\".\"t1\" (available_at, seq)"));
        assert!(text.contains("VALUES ('t1', 1) ON CONFLICT (table_name) DO NOTHING"));
        for line in text.lines().filter(|l| l.starts_with("CREATE")) {
            assert!(line.contains("IF NOT EXISTS"), "{line}");
        }
    }

    #[test]
    fn index_names_are_distinct_for_long_tables() {
        let table = "t".repeat(63);
        let text = ddl(&PgOutboxConfig::default().table(table));
        let names: std::collections::HashSet<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("CREATE INDEX IF NOT EXISTS "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(names.iter().all(|n| n.len() <= 63 + 2));
    }
}
