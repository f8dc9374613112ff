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

use outbox_sqlx::{EntityStatements, SqlxEntities};
use sqlx::{PgPool, Postgres};

use outbox_core::backend::stored_entity_version;
use outbox_core::consumer::Version;
use outbox_core::{Error, Result};

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

fn entity_statements(t: &QualifiedName) -> EntityStatements {
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

impl PgEntityStore {
    /// A store on `pool` with `config`. Runs no SQL.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a bad schema or table name.
    pub fn new(pool: PgPool, config: PgEntityConfig) -> Result<Self> {
        let name = config.qualified_name()?;
        Ok(PgEntityStore {
            pool,
            sql: std::sync::Arc::new(entity_statements(&name)),
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

impl SqlxEntities for PgEntityStore {
    type Db = Postgres;
    /// `jsonb`.
    type Json = serde_json::Value;

    fn map_error(what: &str, err: sqlx::Error) -> Error {
        from_sqlx(what, err)
    }

    fn entities(&self) -> (&PgPool, &EntityStatements) {
        (&self.pool, &self.sql)
    }

    fn stored_version(v: Version) -> Result<Option<i64>> {
        stored_entity_version(v, "a bigint").map(Some)
    }

    /// Under REPEATABLE READ or SERIALIZABLE a concurrent writer of the row makes the
    /// write fail (SQLSTATE 40001) instead of matching no row: the same conflict.
    fn is_conflict(err: &sqlx::Error) -> bool {
        err.as_database_error()
            .and_then(|d| d.code())
            .is_some_and(|code| code == "40001")
    }
}

outbox_sqlx::sqlx_entity_store!(PgEntityStore);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persists_are_conditional_single_statements() {
        let sql = entity_statements(&QualifiedName::new("s", "e").unwrap());
        for (text, part) in [
            (
                &sql.create,
                "ON CONFLICT (entity_key) DO NOTHING RETURNING version",
            ),
            (
                &sql.replace,
                "WHERE entity_key = $1 AND version = $4 RETURNING version",
            ),
            (&sql.replace, "version = version + 1"),
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        // A version past a bigint is refused, not a conflict.
        assert!(PgEntityStore::stored_version(Version::new(u64::MAX)).is_err());
        assert_eq!(
            PgEntityStore::stored_version(Version::new(3)).unwrap(),
            Some(3)
        );
    }
}
