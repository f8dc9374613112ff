//! The entity store of a sqlx backend: [`SqlxEntities`] is what the backend writes
//! (its statements, how JSON and versions are stored, what counts as a conflict), the
//! functions here and [`sqlx_entity_store!`](crate::sqlx_entity_store) are the rest:
//! running the statements, the optimistic check and the error texts.

use futures::future::BoxFuture;
use serde::Serialize;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Row, Type};

use outbox_core::backend::{entity_version, loaded_entity};
use outbox_core::consumer::{EntityRecord, Loaded, Persisted, Version};
use outbox_core::{EntityKey, Error, ErrorKind, Result};

use crate::admin::{AdminEngine, Query};

/// The entity statements whose control flow is shared: the backend writes their text,
/// the parameters are bound in this order.
#[derive(Debug, Clone)]
pub struct EntityStatements {
    /// The key (text); returns at most one row: `state`, `outbox` (as
    /// [`SqlxEntities::Json`]) and `version` (a 64-bit integer).
    pub load: String,
    /// The key, the state, the outbox state, then what [`SqlxEntities::bind_now`]
    /// binds: insert the row at version 1 unless the key exists, returning the stored
    /// version (no row: a conflict).
    pub create: String,
    /// As [`create`](Self::create), then the expected version: replace the row of that
    /// version and increment it, returning the stored version (no row: a conflict).
    pub replace: String,
}

/// The database side of a sqlx entity table (of a
/// [`DecoupledConsumer`](outbox_core::consumer::DecoupledConsumer)): its statements
/// and what differs between engines. A persist is one statement whose `WHERE` is the
/// optimistic check, so concurrent writers cannot both succeed.
pub trait SqlxEntities: Sync {
    /// The sqlx database.
    type Db: Database;

    /// How the `state` and `outbox` columns are bound and read: `serde_json::Value`
    /// for a JSON column type, `String` for JSON text.
    type Json: JsonColumn<Self::Db>;

    /// The backend's error mapping (its [`from_sqlx`](crate::from_sqlx)).
    fn map_error(what: &str, err: sqlx::Error) -> Error;

    /// The pool the statements run on, and their text.
    fn entities(&self) -> (&Pool<Self::Db>, &EntityStatements);

    /// Bind what a persist needs after the outbox state (the time now, say); the
    /// default binds nothing.
    fn bind_now(query: Query<'_, Self::Db>) -> Query<'_, Self::Db> {
        query
    }

    /// The expected version `v` as bound; `Ok(None)` when no row can hold it, so the
    /// persist is a conflict without a statement.
    ///
    /// # Errors
    /// When the backend refuses the version.
    fn stored_version(v: Version) -> Result<Option<i64>>;

    /// `true` on an engine without `UPDATE ... RETURNING` (MySQL): create and replace
    /// return no row, and a persist that changed one row ([`rows_affected`](Self::rows_affected))
    /// stored the expected version plus one (1 for a create). Default `false`: they
    /// return the stored version.
    const COUNTS_ROWS: bool = false;

    /// The rows a persist changed; read only when [`COUNTS_ROWS`](Self::COUNTS_ROWS)
    /// (the default, 0, is a conflict).
    fn rows_affected(done: &<Self::Db as Database>::QueryResult) -> u64 {
        let _ = done;
        0
    }

    /// Whether the persist's driver error `err` is a conflict (a concurrent writer of
    /// the row) rather than an error; the default: never.
    fn is_conflict(err: &sqlx::Error) -> bool {
        let _ = err;
        false
    }
}

/// How an entity's JSON columns are bound and read on database `Db`: implemented for
/// `serde_json::Value` (a JSON column type; the state is bound by reference, not copied
/// per persist) and `String` (JSON text).
pub trait JsonColumn<Db: Database>: Sized {
    /// `value` as stored.
    ///
    /// # Errors
    /// When `value` does not serialize.
    fn to_json<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Self>;

    /// Bind the entity's `state` as stored.
    ///
    /// # Errors
    /// When `state` does not serialize.
    fn bind_state<'q>(
        query: Query<'q, Db>,
        state: &'q serde_json::Value,
    ) -> serde_json::Result<Query<'q, Db>>;

    /// What was read, as JSON.
    ///
    /// # Errors
    /// When it is not JSON.
    fn into_value(self) -> serde_json::Result<serde_json::Value>;
}

impl<Db: Database> JsonColumn<Db> for serde_json::Value
where
    for<'q> &'q serde_json::Value: Encode<'q, Db> + Type<Db>,
{
    fn to_json<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Self> {
        serde_json::to_value(value)
    }

    fn bind_state<'q>(
        query: Query<'q, Db>,
        state: &'q serde_json::Value,
    ) -> serde_json::Result<Query<'q, Db>> {
        Ok(query.bind(state))
    }

    fn into_value(self) -> serde_json::Result<serde_json::Value> {
        Ok(self)
    }
}

impl<Db: Database> JsonColumn<Db> for String
where
    for<'q> String: Encode<'q, Db> + Type<Db>,
{
    fn to_json<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<Self> {
        serde_json::to_string(value)
    }

    fn bind_state<'q>(
        query: Query<'q, Db>,
        state: &'q serde_json::Value,
    ) -> serde_json::Result<Query<'q, Db>> {
        Ok(query.bind(serde_json::to_string(state)?))
    }

    fn into_value(self) -> serde_json::Result<serde_json::Value> {
        serde_json::from_str(&self)
    }
}

/// What the entity functions need of a sqlx database whose JSON columns are bound and
/// read as `J`. Every sqlx driver has it for the types it supports.
pub trait EntityEngine<J>: Database {
    /// Run `query` on `pool` and read its row, if any, as (state, outbox, version).
    fn load_row<'a, 'q: 'a>(
        query: Query<'q, Self>,
        pool: &'a Pool<Self>,
    ) -> BoxFuture<'a, sqlx::Result<Option<(J, J, i64)>>>;

    /// Run `query` on `pool` and read the first column of its row, if any.
    fn fetch_version<'a, 'q: 'a>(
        query: Query<'q, Self>,
        pool: &'a Pool<Self>,
    ) -> BoxFuture<'a, sqlx::Result<Option<i64>>>;

    /// Bind `key`.
    fn bind_key<'q>(query: Query<'q, Self>, key: &'q EntityKey) -> Query<'q, Self>;

    /// Bind `json`.
    fn bind_json(query: Query<'_, Self>, json: J) -> Query<'_, Self>;

    /// Bind `value`.
    fn bind_version(query: Query<'_, Self>, value: i64) -> Query<'_, Self>;
}

impl<Db, J> EntityEngine<J> for Db
where
    Db: Database,
    J: Send + 'static + for<'q> Encode<'q, Db> + for<'r> Decode<'r, Db> + Type<Db>,
    for<'c> &'c mut Db::Connection: Executor<'c, Database = Db>,
    for<'q> Db::Arguments<'q>: IntoArguments<'q, Db>,
    for<'q> i64: Encode<'q, Db> + Decode<'q, Db> + Type<Db>,
    for<'q> &'q str: Encode<'q, Db> + Type<Db>,
    usize: ColumnIndex<Db::Row>,
{
    fn load_row<'a, 'q: 'a>(
        query: Query<'q, Self>,
        pool: &'a Pool<Self>,
    ) -> BoxFuture<'a, sqlx::Result<Option<(J, J, i64)>>> {
        Box::pin(async move {
            match query.fetch_optional(pool).await? {
                Some(row) => Ok(Some((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))),
                None => Ok(None),
            }
        })
    }

    fn fetch_version<'a, 'q: 'a>(
        query: Query<'q, Self>,
        pool: &'a Pool<Self>,
    ) -> BoxFuture<'a, sqlx::Result<Option<i64>>> {
        Box::pin(async move {
            match query.fetch_optional(pool).await? {
                Some(row) => row.try_get(0).map(Some),
                None => Ok(None),
            }
        })
    }

    fn bind_key<'q>(query: Query<'q, Self>, key: &'q EntityKey) -> Query<'q, Self> {
        query.bind(key.as_str())
    }

    fn bind_json(query: Query<'_, Self>, json: J) -> Query<'_, Self> {
        query.bind(json)
    }

    fn bind_version(query: Query<'_, Self>, value: i64) -> Query<'_, Self> {
        query.bind(value)
    }
}

/// [`EntityStore::load`](outbox_core::consumer::EntityStore::load) of a sqlx entity
/// table.
///
/// # Errors
/// Mapped driver errors; [`ErrorKind::Decode`](outbox_core::ErrorKind::Decode) for a
/// row that does not decode.
pub async fn load_entity<S>(store: &S, key: &EntityKey) -> Result<Option<Loaded>>
where
    S: SqlxEntities,
    S::Db: EntityEngine<S::Json>,
{
    let (pool, sql) = store.entities();
    let query = S::Db::bind_key(sqlx::query(&sql.load), key);
    let row = S::Db::load_row(query, pool)
        .await
        .map_err(|e| S::map_error("load entity", e))?;
    let Some((state, outbox, version)) = row else {
        return Ok(None);
    };
    let decode = |what: &str, json: S::Json| {
        json.into_value().map_err(|e| {
            Error::new(
                ErrorKind::Decode,
                format!("the {what} of entity {key} does not decode"),
            )
            .with_source(e)
        })
    };
    let (state, outbox) = (decode("state", state)?, decode("outbox state", outbox)?);
    loaded_entity(key, state, outbox, version).map(Some)
}

/// [`EntityStore::persist`](outbox_core::consumer::EntityStore::persist) of a sqlx
/// entity table: [`EntityStatements::create`] without `expected`,
/// [`EntityStatements::replace`] with it; no stored row is a conflict.
///
/// # Errors
/// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) when the record
/// does not serialize, what [`SqlxEntities::stored_version`] refuses, mapped driver
/// errors.
pub async fn persist_entity<S>(
    store: &S,
    key: &EntityKey,
    expected: Option<Version>,
    record: &EntityRecord,
) -> Result<Persisted>
where
    S: SqlxEntities,
    S::Db: EntityEngine<S::Json> + AdminEngine,
{
    let outbox = S::Json::to_json(&record.outbox)
        .map_err(|e| Error::invalid_input("the outbox state does not serialize").with_source(e))?;
    let (pool, sql) = store.entities();
    let text = match expected {
        None => &sql.create,
        Some(_) => &sql.replace,
    };
    let query = S::Json::bind_state(S::Db::bind_key(sqlx::query(text), key), &record.state)
        .map_err(|e| Error::invalid_input("the state does not serialize").with_source(e))?;
    let query = S::bind_now(S::Db::bind_json(query, outbox));
    let query = match expected {
        None => query,
        Some(v) => match S::stored_version(v)? {
            Some(v) => S::Db::bind_version(query, v),
            None => return Ok(Persisted::Conflict),
        },
    };
    let counted = match expected {
        None => 1,
        Some(v) => entity_version_after(v)?,
    };
    let stored = if S::COUNTS_ROWS {
        S::Db::run(query, pool)
            .await
            .map(|done| (S::rows_affected(&done) == 1).then_some(counted))
    } else {
        S::Db::fetch_version(query, pool).await
    };
    let stored = match stored {
        Ok(stored) => stored,
        Err(e) if S::is_conflict(&e) => None,
        Err(e) => return Err(S::map_error("persist entity", e)),
    };
    match stored {
        Some(v) => Ok(Persisted::Stored(entity_version(v)?)),
        None => Ok(Persisted::Conflict),
    }
}

/// Writes the [`EntityStore`](outbox_core::consumer::EntityStore) impl of a store
/// that implements [`SqlxEntities`], from [`load_entity`] and [`persist_entity`].
///
/// ```text
/// outbox_sqlx::sqlx_entity_store!(PgEntityStore);
/// ```
#[macro_export]
macro_rules! sqlx_entity_store {
    ($store:ty) => {
        #[$crate::__private::async_trait]
        impl ::outbox_core::consumer::EntityStore for $store {
            async fn load(
                &self,
                key: &::outbox_core::EntityKey,
            ) -> ::outbox_core::Result<::std::option::Option<::outbox_core::consumer::Loaded>> {
                $crate::load_entity(self, key).await
            }

            async fn persist(
                &self,
                key: &::outbox_core::EntityKey,
                expected: ::std::option::Option<::outbox_core::consumer::Version>,
                record: &::outbox_core::consumer::EntityRecord,
            ) -> ::outbox_core::Result<::outbox_core::consumer::Persisted> {
                $crate::persist_entity(self, key, expected, record).await
            }
        }
    };
}

/// The version a replace of version `v` stores, as counted by a
/// [`SqlxEntities::COUNTS_ROWS`] engine.
fn entity_version_after(v: Version) -> Result<i64> {
    i64::try_from(v.next()?.get()).map_err(|_| Error::invalid_input("entity version overflows"))
}
