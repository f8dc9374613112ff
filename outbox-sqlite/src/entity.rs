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

use async_trait::async_trait;
use sqlx::SqlitePool;

use outbox_core::backend::{entity_version, loaded_entity, stored_entity_version};
use outbox_core::consumer::{EntityRecord, EntityStore, Loaded, Persisted, Version};
use outbox_core::{EntityKey, Error, ErrorKind, Result};

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

#[derive(Debug)]
struct EntityStatements {
    load: String,
    create: String,
    replace: String,
}

impl EntityStatements {
    fn new(t: &TableName) -> Self {
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
            sql: std::sync::Arc::new(EntityStatements::new(&name)),
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

fn stored_version(v: Version) -> Result<i64> {
    stored_entity_version(v, "64 bits")
}

fn decode_json<T: serde::de::DeserializeOwned>(
    key: &EntityKey,
    what: &str,
    text: &str,
) -> Result<T> {
    serde_json::from_str(text).map_err(|e| {
        Error::new(
            ErrorKind::Decode,
            format!("the {what} of entity {key} does not decode"),
        )
        .with_source(e)
    })
}

#[async_trait]
impl EntityStore for SqliteEntityStore {
    async fn load(&self, key: &EntityKey) -> Result<Option<Loaded>> {
        let row: Option<(String, String, i64)> = sqlx::query_as(&self.sql.load)
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| from_sqlx("load entity", e))?;
        let Some((state, outbox, version)) = row else {
            return Ok(None);
        };
        let state = decode_json(key, "state", &state)?;
        let outbox = decode_json(key, "outbox state", &outbox)?;
        loaded_entity(key, state, outbox, version).map(Some)
    }

    async fn persist(
        &self,
        key: &EntityKey,
        expected: Option<Version>,
        record: &EntityRecord,
    ) -> Result<Persisted> {
        let outbox = serde_json::to_string(&record.outbox).map_err(|e| {
            Error::invalid_input("the outbox state does not serialize").with_source(e)
        })?;
        let query = match expected {
            None => sqlx::query_scalar(&self.sql.create),
            Some(_) => sqlx::query_scalar(&self.sql.replace),
        }
        .bind(key.as_str())
        .bind(record.state.to_string())
        .bind(outbox)
        .bind(now_us());
        let query = match expected {
            None => query,
            // No row holds a version past what SQLite stores: it cannot match.
            Some(v) => match stored_version(v) {
                Ok(v) => query.bind(v),
                Err(_) => return Ok(Persisted::Conflict),
            },
        };
        let stored: Option<i64> = query
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| from_sqlx("persist entity", e))?;
        match stored {
            Some(v) => Ok(Persisted::Stored(entity_version(v)?)),
            None => Ok(Persisted::Conflict),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persists_are_conditional_single_statements() {
        let sql = EntityStatements::new(&TableName::new("e").unwrap());
        assert!(sql
            .create
            .contains("ON CONFLICT (entity_key) DO NOTHING RETURNING version"));
        assert!(sql
            .replace
            .contains("WHERE entity_key = ?1 AND version = ?5 RETURNING version"));
        assert!(sql.replace.contains("version = version + 1"));
        assert!(entity_version(-1).is_err());
        assert_eq!(entity_version(3).unwrap(), Version::new(3));
        assert!(stored_version(Version::new(u64::MAX)).is_err());
    }
}
