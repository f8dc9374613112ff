//! [`MssqlEntityStore`]: the entity store of the decoupled consumer
//! ([`DecoupledConsumer`](outbox_core::consumer::DecoupledConsumer)) in a SQL Server
//! table.
//!
//! One row per entity: `state` and `outbox` as JSON text, `version` for the optimistic
//! check. A persist is one autocommit statement whose `WHERE` is the check (`INSERT ...
//! WHERE NOT EXISTS (... WITH (READCOMMITTEDLOCK))` to create, `UPDATE ... WHERE
//! version = @expected` to replace), so concurrent writers cannot both succeed; a
//! conflict is a value ([`Persisted::Conflict`]). Creating takes no range lock: two
//! creates of one key that both pass the check race on the primary key, and the loser's
//! error 2627 is reported as the same conflict.
//!
//! ## Limitations
//!
//! - Use the primary replica: the dedup store of the same algorithm must read its
//!   writes.
//! - Do not delete the row of an entity that may still receive messages: re-created,
//!   its versions start over at 1.

use async_trait::async_trait;

use outbox_core::backend::{entity_version, loaded_entity, stored_entity_version};
use outbox_core::consumer::{EntityRecord, EntityStore, Loaded, Persisted, Version};
use outbox_core::{EntityKey, Error, ErrorKind, Result};

use crate::config::MssqlEntityConfig;
use crate::error::{from_pool, has_number};
use crate::exec::{guarded, query_rows, row_i64, row_str, session_rows};
use crate::ident::QualifiedName;
use crate::install::install;
use crate::schema::{entity_ddl, entity_layout};
use crate::session::{dedicated, MssqlPool};
use crate::sql::{Binder, Param, Stmt, NOW};

pub(crate) fn load(t: &QualifiedName, key: &str) -> Stmt {
    let mut b = Binder::default();
    let key = b.bind(Param::Text(Some(key.to_owned())));
    b.finish(format!(
        "SELECT state, outbox, version FROM {t} WHERE entity_key = {key};"
    ))
}

pub(crate) fn create(t: &QualifiedName, key: &str, state: String, outbox: String) -> Stmt {
    let mut b = Binder::default();
    let key = b.bind(Param::Text(Some(key.to_owned())));
    let state = b.bind(Param::Text(Some(state)));
    let outbox = b.bind(Param::Text(Some(outbox)));
    b.finish(format!(
        "INSERT INTO {t} (entity_key, state, outbox, version, updated_at) \
         OUTPUT INSERTED.version \
         SELECT {key}, {state}, {outbox}, 1, {NOW} WHERE NOT EXISTS \
         (SELECT 1 FROM {t} WITH (READCOMMITTEDLOCK) WHERE entity_key = {key});"
    ))
}

pub(crate) fn replace(
    t: &QualifiedName,
    key: &str,
    state: String,
    outbox: String,
    expected: i64,
) -> Stmt {
    let mut b = Binder::default();
    let key = b.bind(Param::Text(Some(key.to_owned())));
    let state = b.bind(Param::Text(Some(state)));
    let outbox = b.bind(Param::Text(Some(outbox)));
    let expected = b.bind(Param::I64(expected));
    b.finish(format!(
        "UPDATE {t} SET state = {state}, outbox = {outbox}, version = version + 1, \
         updated_at = {NOW} OUTPUT INSERTED.version \
         WHERE entity_key = {key} AND version = {expected};"
    ))
}

/// Entities of a [`DecoupledConsumer`](outbox_core::consumer::DecoupledConsumer) in a
/// SQL Server table, with optimistic concurrency on a `version` column.
#[derive(Debug, Clone)]
pub struct MssqlEntityStore {
    pool: MssqlPool,
    name: QualifiedName,
}

impl MssqlEntityStore {
    /// A store on `pool` with `config`. Runs no SQL.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] for a bad schema or table name.
    pub fn new(pool: MssqlPool, config: MssqlEntityConfig) -> Result<Self> {
        let name = config.qualified_name()?;
        Ok(MssqlEntityStore { pool, name })
    }

    /// The DDL for this store's table, idempotent, for your migration tool.
    pub fn ddl(&self) -> String {
        entity_ddl(&self.name)
    }

    /// Create the schema and table if missing and record the layout version.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`] when the table exists at another layout version; mapped
    /// driver errors otherwise.
    pub async fn install(&self) -> Result<()> {
        let mut client = dedicated(&self.pool, "schema install").await?;
        install(&mut client, &self.name, &entity_layout(&self.name))
            .await
            .map(drop)
    }
}

fn stored_version(v: Version) -> Result<i64> {
    stored_entity_version(v, "a bigint")
}

fn json(what: &str, text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| {
        Error::new(
            ErrorKind::Decode,
            format!("the {what} of an entity is not JSON"),
        )
        .with_source(e)
    })
}

#[async_trait]
impl EntityStore for MssqlEntityStore {
    async fn load(&self, key: &EntityKey) -> Result<Option<Loaded>> {
        let what = "load entity";
        let mut client = self.pool.get().await.map_err(|e| from_pool(what, e))?;
        let rows = session_rows(&mut client, what, load(&self.name, key.as_str()), None).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let state = json("state", &row_str(row, "state")?)?;
        let outbox = json("outbox state", &row_str(row, "outbox")?)?;
        loaded_entity(key, state, outbox, row_i64(row, "version")?).map(Some)
    }

    async fn persist(
        &self,
        key: &EntityKey,
        expected: Option<Version>,
        record: &EntityRecord,
    ) -> Result<Persisted> {
        let what = "persist entity";
        let outbox = serde_json::to_string(&record.outbox).map_err(|e| {
            Error::invalid_input("the outbox state does not serialize").with_source(e)
        })?;
        let state = record.state.to_string();
        let stmt = match expected {
            None => create(&self.name, key.as_str(), state, outbox),
            Some(v) => replace(&self.name, key.as_str(), state, outbox, stored_version(v)?),
        };
        let mut client = self.pool.get().await.map_err(|e| from_pool(what, e))?;
        let limit = client.statement_timeout();
        let rows = guarded(&mut client, what, limit, |c| {
            Box::pin(async move {
                match query_rows(c, stmt).await {
                    Ok(rows) => Ok(Some(rows)),
                    // A racing create of the same key: the same conflict.
                    Err(e) if has_number(&e, &[2627, 2601]) => Ok(None),
                    Err(e) => Err(e),
                }
            })
        })
        .await?;
        let Some(rows) = rows else {
            return Ok(Persisted::Conflict);
        };
        match rows.first() {
            Some(row) => Ok(Persisted::Stored(entity_version(row_i64(row, "version")?)?)),
            None => Ok(Persisted::Conflict),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_convert_or_fail_typed() {
        assert!(entity_version(-1).is_err());
        assert_eq!(entity_version(3).unwrap(), Version::new(3));
        assert!(stored_version(Version::new(u64::MAX)).is_err());
    }
}
