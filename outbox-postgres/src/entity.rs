//! [`PgEntityStore`]: the entity store of the decoupled consumer
//! ([`DecoupledConsumer`](outbox_core::consumer::DecoupledConsumer)) in a PostgreSQL
//! table.
//!
//! One row per entity: `state` and `outbox` as `jsonb`, `version` for the optimistic
//! check. A persist is one statement whose `WHERE` is the check (`INSERT ... ON
//! CONFLICT DO NOTHING` to create, `UPDATE ... WHERE version = $expected` to
//! replace), so concurrent writers cannot both succeed; a conflict is a value.
//!
//! ## Limitations
//!
//! - The pool must reach the primary: the optimistic check makes a stale read harmless
//!   for this store, but the dedup store of the same algorithm must read its writes.
//! - A row is rewritten on every message of its entity (twice: with the outbox state,
//!   then without); autovacuum must keep up on busy entities.
//! - Do not delete the row of an entity that may still receive messages: re-created, its
//!   versions start over at 1, and a copy holding an old version 1 could overwrite it.

use async_trait::async_trait;
use sqlx::PgPool;

use outbox_core::backend::{entity_version, loaded_entity, stored_entity_version};
use outbox_core::consumer::{EntityRecord, EntityStore, Loaded, Persisted, Version};
use outbox_core::{EntityKey, Error, Result};

use crate::config::PgEntityConfig;
use crate::error::from_sqlx;
use crate::ident::QualifiedName;
use crate::schema::{entity_ddl, entity_objects, install};

/// Entities of a [`DecoupledConsumer`](outbox_core::consumer::DecoupledConsumer) in a
/// PostgreSQL table, with optimistic concurrency on a `version` column.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> outbox_core::Result<()> {
/// use outbox_postgres::{PgEntityConfig, PgEntityStore};
///
/// let entities = PgEntityStore::new(pool, PgEntityConfig::default().with_table("accounts"))?;
/// entities.install().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgEntityStore {
    pool: PgPool,
    name: QualifiedName,
    sql: std::sync::Arc<EntityStatements>,
}

#[derive(Debug)]
struct EntityStatements {
    load: String,
    create: String,
    replace: String,
}

impl EntityStatements {
    fn new(t: &QualifiedName) -> Self {
        EntityStatements {
            load: format!("SELECT state, outbox, version FROM {t} WHERE entity_key = $1"),
            create: format!(
                "INSERT INTO {t} (entity_key, state, outbox, version) VALUES ($1, $2, $3, 1) \
                 ON CONFLICT (entity_key) DO NOTHING RETURNING version"
            ),
            replace: format!(
                "UPDATE {t} SET state = $2, outbox = $3, version = version + 1, \
                 updated_at = now() WHERE entity_key = $1 AND version = $4 RETURNING version"
            ),
        }
    }
}

impl PgEntityStore {
    /// A store on `pool` with `config`. Runs no SQL.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a bad schema or table name.
    pub fn new(pool: PgPool, config: PgEntityConfig) -> Result<Self> {
        let name = config.qualified_name()?;
        Ok(PgEntityStore {
            pool,
            sql: std::sync::Arc::new(EntityStatements::new(&name)),
            name,
        })
    }

    /// The DDL for this store's table, idempotent, for your migration tool.
    pub fn ddl(&self) -> String {
        entity_ddl(&self.name)
    }

    /// Create the schema and table if missing and record the layout version.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists at
    /// another layout version; mapped
    /// driver errors otherwise.
    pub async fn install(&self) -> Result<()> {
        install(&self.pool, &self.name, &entity_objects(&self.name)).await
    }
}

fn is_serialization_failure(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code == "40001")
}

fn stored_version(v: Version) -> Result<i64> {
    stored_entity_version(v, "a bigint")
}

#[async_trait]
impl EntityStore for PgEntityStore {
    async fn load(&self, key: &EntityKey) -> Result<Option<Loaded>> {
        let row: Option<(serde_json::Value, serde_json::Value, i64)> =
            sqlx::query_as(&self.sql.load)
                .bind(key.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| from_sqlx("load entity", e))?;
        let Some((state, outbox, version)) = row else {
            return Ok(None);
        };
        loaded_entity(key, state, outbox, version).map(Some)
    }

    async fn persist(
        &self,
        key: &EntityKey,
        expected: Option<Version>,
        record: &EntityRecord,
    ) -> Result<Persisted> {
        let outbox = serde_json::to_value(&record.outbox).map_err(|e| {
            Error::invalid_input("the outbox state does not serialize").with_source(e)
        })?;
        let query = match expected {
            None => sqlx::query_scalar(&self.sql.create),
            Some(_) => sqlx::query_scalar(&self.sql.replace),
        }
        .bind(key.as_str())
        .bind(&record.state)
        .bind(outbox);
        let query = match expected {
            None => query,
            Some(v) => query.bind(stored_version(v)?),
        };
        let stored: Option<i64> = match query.fetch_optional(&self.pool).await {
            Ok(stored) => stored,
            // Under REPEATABLE READ or SERIALIZABLE a concurrent writer of the row makes
            // this write fail instead of matching no row: the same conflict.
            Err(e) if is_serialization_failure(&e) => None,
            Err(e) => return Err(from_sqlx("persist entity", e)),
        };
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
        let sql = EntityStatements::new(&QualifiedName::new("s", "e").unwrap());
        assert!(sql
            .create
            .contains("ON CONFLICT (entity_key) DO NOTHING RETURNING version"));
        assert!(sql
            .replace
            .contains("WHERE entity_key = $1 AND version = $4 RETURNING version"));
        assert!(sql.replace.contains("version = version + 1"));
        assert!(entity_version(-1).is_err());
        assert_eq!(entity_version(3).unwrap(), Version::new(3));
        assert!(stored_version(Version::new(u64::MAX)).is_err());
    }
}
