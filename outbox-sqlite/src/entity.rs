//! [`SqliteEntityStore`]: the entity store of the decoupled consumer
//! ([`DecoupledConsumer`](outbox_core::consumer::DecoupledConsumer)) in an SQLite
//! table.
//!
//! One row per entity: `state` and `outbox` as JSON text, `version` for the optimistic
//! check. A persist is one statement whose `WHERE` is the check (`INSERT ... ON
//! CONFLICT DO NOTHING` to create, `UPDATE ... WHERE version = ?expected` to
//! replace), so concurrent writers cannot both succeed; a conflict is a value.
//!
//! Do not delete the row of an entity that may still receive messages: re-created, its
//! versions start over at 1, and a copy holding an old version 1 could overwrite it.

use outbox_sqlx::{EntityStatements, Query, SqlxEntities};
use sqlx::{Sqlite, SqlitePool};

use outbox_core::backend::stored_entity_version;
use outbox_core::consumer::Version;
use outbox_core::{Error, Result};

use crate::config::SqliteEntityConfig;
use crate::error::from_sqlx;
use crate::ident::TableName;
use crate::schema::{ddl, entity_objects, install};
use crate::time::now_us;

/// Entities and their outbox state in an SQLite table, versioned for optimistic
/// concurrency.
#[derive(Debug, Clone)]
pub struct SqliteEntityStore {
    pool: SqlitePool,
    name: TableName,
    sql: std::sync::Arc<EntityStatements>,
}

fn entity_statements(t: &TableName) -> EntityStatements {
    EntityStatements {
        load: format!("SELECT state, outbox, version FROM {t} WHERE entity_key = ?1"),
        create: format!(
            "INSERT INTO {t} (entity_key, state, outbox, version, updated_at) \
             VALUES (?1, ?2, ?3, 1, ?4) \
             ON CONFLICT (entity_key) DO NOTHING RETURNING version"
        ),
        replace: format!(
            "UPDATE {t} SET state = ?2, outbox = ?3, version = version + 1, \
             updated_at = ?4 WHERE entity_key = ?1 AND version = ?5 RETURNING version"
        ),
    }
}

impl SqliteEntityStore {
    /// A store on `pool` with `config`. Runs no SQL.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a bad table name.
    pub fn new(pool: SqlitePool, config: SqliteEntityConfig) -> Result<Self> {
        let name = config.table_name()?;
        Ok(SqliteEntityStore {
            pool,
            sql: std::sync::Arc::new(entity_statements(&name)),
            name,
        })
    }

    /// The DDL for this store's table, idempotent, for your migration tool (the
    /// default names' DDL is checked in as `sql/entities.sql`).
    pub fn ddl(&self) -> String {
        ddl(&self.name, &entity_objects(&self.name))
    }

    /// Create the table if missing and record the layout version.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists at
    /// another layout version; mapped driver errors otherwise.
    pub async fn install(&self) -> Result<()> {
        install(&self.pool, &self.name, &entity_objects(&self.name)).await
    }
}

impl SqlxEntities for SqliteEntityStore {
    type Db = Sqlite;
    /// JSON text.
    type Json = String;

    fn map_error(what: &str, err: sqlx::Error) -> Error {
        from_sqlx(what, err)
    }

    fn entities(&self) -> (&SqlitePool, &EntityStatements) {
        (&self.pool, &self.sql)
    }

    /// The time now, as `updated_at`.
    fn bind_now(query: Query<'_, Sqlite>) -> Query<'_, Sqlite> {
        query.bind(now_us())
    }

    /// No row holds a version past what SQLite stores: it cannot match.
    fn stored_version(v: Version) -> Result<Option<i64>> {
        Ok(stored_entity_version(v, "64 bits").ok())
    }
}

outbox_sqlx::sqlx_entity_store!(SqliteEntityStore);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persists_are_conditional_single_statements() {
        let sql = entity_statements(&TableName::new("e").unwrap());
        assert_eq!(
            sql.replace,
            "UPDATE \"e\" SET state = ?2, outbox = ?3, version = version + 1, \
             updated_at = ?4 WHERE entity_key = ?1 AND version = ?5 RETURNING version"
        );
        assert!(sql
            .create
            .ends_with("ON CONFLICT (entity_key) DO NOTHING RETURNING version"));
        // A version past what SQLite stores is a conflict, not an error.
        let too_big = SqliteEntityStore::stored_version(Version::new(u64::MAX));
        assert_eq!(too_big.unwrap(), None);
    }
}
