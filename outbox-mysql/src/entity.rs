//! [`MySqlEntityStore`]: one row per entity (`state`, `outbox` as `JSON`, `version` for
//! the optimistic check). A create is a plain `INSERT` (a duplicate key is the
//! conflict), a replace an `UPDATE` of the expected version; neither returns a row on
//! MySQL, so the persist counts the rows changed. Keys are `VARBINARY(255)`. Do not
//! delete the row of an entity that may still receive messages: its versions restart.

use outbox_sqlx::{EntityStatements, SqlxEntities};
use sqlx::mysql::MySqlQueryResult;
use sqlx::{MySql, MySqlPool};

use outbox_core::backend::stored_entity_version;
use outbox_core::consumer::Version;
use outbox_core::{Error, Result};

use crate::config::{MySqlEntityConfig, QualifiedName};
use crate::error::{from_sqlx, number};
use crate::schema::{ddl, entity_objects, install};
use crate::sql::NOW;

/// Entities of a [`DecoupledConsumer`](outbox_core::consumer::DecoupledConsumer) in a
/// MySQL table, with optimistic concurrency on a `version` column.
#[derive(Debug, Clone)]
pub struct MySqlEntityStore {
    pool: MySqlPool,
    name: QualifiedName,
    sql: std::sync::Arc<EntityStatements>,
}

/// `?` key, `?` state, `?` outbox (and `?` version for a replace). MySQL binds by
/// position, so the replace reads its values from a one-row derived table.
fn entity_statements(t: &QualifiedName) -> EntityStatements {
    EntityStatements {
        load: format!("SELECT state, outbox, version FROM {t} WHERE entity_key = ?"),
        create: format!(
            "INSERT INTO {t} (entity_key, state, outbox, version, updated_at) \
             VALUES (?, ?, ?, 1, {NOW})"
        ),
        replace: format!(
            "UPDATE {t} JOIN (SELECT ? AS k, ? AS s, ? AS o) AS p ON {t}.entity_key = p.k \
             SET state = p.s, outbox = p.o, version = version + 1, updated_at = {NOW} \
             WHERE version = ?"
        ),
    }
}

impl MySqlEntityStore {
    /// A store on `pool` with `config`. Runs no SQL.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a bad name.
    pub fn new(pool: MySqlPool, config: MySqlEntityConfig) -> Result<Self> {
        let name = config.qualified_name()?;
        let sql = std::sync::Arc::new(entity_statements(&name));
        Ok(MySqlEntityStore { pool, name, sql })
    }

    /// The DDL for this store's table, idempotent, for your migration tool.
    pub fn ddl(&self) -> String {
        ddl(&self.name, &entity_objects(&self.name))
    }

    /// Create the database and table if missing and record the layout version.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists at
    /// another layout version; mapped driver errors otherwise.
    pub async fn install(&self) -> Result<()> {
        install(&self.pool, &self.name, &entity_objects(&self.name)).await
    }
}

impl SqlxEntities for MySqlEntityStore {
    type Db = MySql;
    type Json = serde_json::Value;
    const COUNTS_ROWS: bool = true;

    fn map_error(what: &str, err: sqlx::Error) -> Error {
        from_sqlx(what, err)
    }

    fn entities(&self) -> (&MySqlPool, &EntityStatements) {
        (&self.pool, &self.sql)
    }

    fn stored_version(v: Version) -> Result<Option<i64>> {
        stored_entity_version(v, "a BIGINT").map(Some)
    }

    /// Found rows: 1 when the key (and version) matched.
    fn rows_affected(done: &MySqlQueryResult) -> u64 {
        done.rows_affected()
    }

    /// A create meeting the key (1062) is the conflict; so is a deadlock between two
    /// writers of the row.
    fn is_conflict(err: &sqlx::Error) -> bool {
        matches!(number(err), Some(1062 | 1213))
    }
}

outbox_sqlx::sqlx_entity_store!(MySqlEntityStore);
