//! The admin side of a sqlx outbox: [`SqlxAdmin`] is what the backend writes (its
//! statements, how it binds ids, filters and ages, its stats and dead-letter pages),
//! the functions here and [`sqlx_outbox_admin!`](crate::sqlx_outbox_admin) are the
//! rest: the dispatch on a [`DeadLetterSelection`], the purge bound, running the
//! statements and mapping their errors.

use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Row, Type};

use outbox_core::backend::{dead_target, limit_param, purge_limit, DeadChange, DeadTarget};
use outbox_core::{
    DeadLetter, DeadLetterFilter, DeadLetterPage, DeadLetterSelection, Error, ErrorKind,
    OutboxStats, Result, Retention,
};

/// A statement of database `Db` with its arguments, as the bind methods of
/// [`SqlxAdmin`] take and return it.
pub type Query<'q, Db> = sqlx::query::Query<'q, Db, <Db as Database>::Arguments<'q>>;

/// The admin statements whose control flow is shared: the backend writes their text
/// (placeholders, how ids are passed), the parameters are those the bind methods of
/// [`SqlxAdmin`] bind, in this order.
#[derive(Debug, Clone)]
pub struct AdminStatements {
    /// The store's retention: under [`Retention::Delete`] there are no dispatched rows,
    /// so `purge_dispatched` and `count_dispatched` do not run.
    pub retention: Retention,
    /// The filter ([`SqlxAdmin::bind_filter`]); returns one row whose first column is
    /// the count.
    pub count_dead: String,
    /// The ids ([`SqlxAdmin::bind_ids`]), then what [`SqlxAdmin::bind_requeue`] binds.
    pub requeue_ids: String,
    /// The filter, the limit (a 64-bit integer), then what
    /// [`SqlxAdmin::bind_requeue`] binds.
    pub requeue_matching: String,
    /// The ids.
    pub discard_ids: String,
    /// The filter, then the limit.
    pub discard_matching: String,
    /// The age ([`SqlxAdmin::bind_age`]), then the limit: as
    /// [`SqlxAdmin::run_purge`] runs it (by default, one statement deleting at most
    /// that many dispatched rows).
    pub purge_dispatched: String,
    /// The age; returns one row whose first column is how many rows
    /// `purge_dispatched` would delete in all.
    pub count_dispatched: String,
}

impl AdminStatements {
    /// The statements of `change`: by ids, and matching a filter.
    fn change(&self, change: DeadChange) -> (&str, &str) {
        match change {
            DeadChange::Requeue => (&self.requeue_ids, &self.requeue_matching),
            DeadChange::Discard => (&self.discard_ids, &self.discard_matching),
        }
    }
}

/// The database side of a sqlx outbox's admin: its statements and binds. The bind
/// methods add parameters to a statement of [`AdminStatements`] in the order it reads
/// them.
#[async_trait]
pub trait SqlxAdmin: Sync {
    /// The sqlx database.
    type Db: AdminEngine;

    /// The backend's error mapping (its [`from_sqlx`](crate::from_sqlx)).
    fn map_error(what: &str, err: sqlx::Error) -> Error;

    /// The error of a count the database returned negative; `what` names it
    /// (`"dead letter"`, `"dispatched"`). By default a
    /// [`Decode`](outbox_core::ErrorKind::Decode) error saying so.
    fn negative_count(what: &str) -> Error {
        Error::new(ErrorKind::Decode, format!("negative {what} count"))
    }

    /// The pool the statements run on, and their text.
    fn admin(&self) -> (&Pool<Self::Db>, &AdminStatements);

    /// The rows a statement changed.
    fn rows_affected(done: &<Self::Db as Database>::QueryResult) -> u64;

    /// Bind `ids` (at least one, in id order, no repeats).
    fn bind_ids<'q>(
        query: Query<'q, Self::Db>,
        ids: &[outbox_core::MessageId],
    ) -> Query<'q, Self::Db>;

    /// Bind a dead-letter filter.
    fn bind_filter<'q>(
        query: Query<'q, Self::Db>,
        filter: &'q DeadLetterFilter,
    ) -> Query<'q, Self::Db>;

    /// Bind what a requeue needs after its selection (the time it makes the rows due,
    /// say); the default binds nothing.
    fn bind_requeue(query: Query<'_, Self::Db>) -> Query<'_, Self::Db> {
        query
    }

    /// Bind the age a dispatched row must be over to be purged (or counted).
    fn bind_age(query: Query<'_, Self::Db>, older_than: Duration) -> Query<'_, Self::Db>;

    /// Run [`AdminStatements::purge_dispatched`], bound, and return how many rows it
    /// deleted: by default as one statement on the pool. An engine on which that one
    /// statement would wait for rows another transaction holds runs its own purge here.
    fn run_purge<'a>(&'a self, query: Query<'a, Self::Db>) -> BoxFuture<'a, sqlx::Result<u64>> {
        let pool = self.admin().0;
        Box::pin(async move { Ok(Self::rows_affected(&Self::Db::run(query, pool).await?)) })
    }

    /// [`OutboxAdmin::stats`](outbox_core::OutboxAdmin::stats).
    async fn read_stats(&self) -> Result<OutboxStats>;

    /// [`OutboxAdmin::dead_letters`](outbox_core::OutboxAdmin::dead_letters).
    async fn list_dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>>;
}

/// What the shared admin functions need of a sqlx database beyond [`Database`]: to
/// run a statement on a pool, read a count and bind a 64-bit integer. Every sqlx
/// driver has it.
pub trait AdminEngine: Database {
    /// Run `query` on `pool`.
    fn run<'a, 'q: 'a>(
        query: Query<'q, Self>,
        pool: &'a Pool<Self>,
    ) -> BoxFuture<'a, sqlx::Result<Self::QueryResult>>;

    /// Run `query` on `pool` and read the first column of its one row.
    fn count<'a, 'q: 'a>(
        query: Query<'q, Self>,
        pool: &'a Pool<Self>,
    ) -> BoxFuture<'a, sqlx::Result<i64>>;

    /// Bind `value`.
    fn bind_i64(query: Query<'_, Self>, value: i64) -> Query<'_, Self>;
}

impl<Db> AdminEngine for Db
where
    Db: Database,
    for<'c> &'c mut Db::Connection: Executor<'c, Database = Db>,
    for<'q> Db::Arguments<'q>: IntoArguments<'q, Db>,
    for<'q> i64: Encode<'q, Db> + Decode<'q, Db> + Type<Db>,
    usize: ColumnIndex<Db::Row>,
{
    fn run<'a, 'q: 'a>(
        query: Query<'q, Self>,
        pool: &'a Pool<Self>,
    ) -> BoxFuture<'a, sqlx::Result<Self::QueryResult>> {
        Box::pin(query.execute(pool))
    }

    fn count<'a, 'q: 'a>(
        query: Query<'q, Self>,
        pool: &'a Pool<Self>,
    ) -> BoxFuture<'a, sqlx::Result<i64>> {
        Box::pin(async move { query.fetch_one(pool).await?.try_get(0) })
    }

    fn bind_i64(query: Query<'_, Self>, value: i64) -> Query<'_, Self> {
        query.bind(value)
    }
}

/// A count as `u64`.
fn unsigned<S: SqlxAdmin>(n: i64, what: &str) -> Result<u64> {
    u64::try_from(n).map_err(|_| S::negative_count(what))
}

/// [`OutboxAdmin::count_dead`](outbox_core::OutboxAdmin::count_dead) of a sqlx outbox.
///
/// # Errors
/// Mapped driver errors.
pub async fn count_dead<S>(store: &S, filter: &DeadLetterFilter) -> Result<u64>
where
    S: SqlxAdmin,
    S::Db: AdminEngine,
{
    let query = S::bind_filter(sqlx::query(&store.admin().1.count_dead), filter);
    let n = S::Db::count(query, store.admin().0)
        .await
        .map_err(|e| S::map_error("count dead letters", e))?;
    unsigned::<S>(n, "dead letter")
}

/// [`OutboxAdmin::requeue_dead`](outbox_core::OutboxAdmin::requeue_dead) (`change` is
/// [`DeadChange::Requeue`]) or [`discard_dead`](outbox_core::OutboxAdmin::discard_dead)
/// of a sqlx outbox: one statement, none for an empty id list.
///
/// # Errors
/// The selection's bounds ([`DeadLetterSelection::validate`]), mapped driver errors.
pub async fn change_dead<S>(
    store: &S,
    change: DeadChange,
    selection: &DeadLetterSelection,
) -> Result<u64>
where
    S: SqlxAdmin,
    S::Db: AdminEngine,
{
    let Some(target) = dead_target(selection)? else {
        return Ok(0);
    };
    let (by_ids, matching) = store.admin().1.change(change);
    let query = match target {
        DeadTarget::Ids(ids) => S::bind_ids(sqlx::query(by_ids), &ids),
        DeadTarget::Matching { filter, limit } => S::Db::bind_i64(
            S::bind_filter(sqlx::query(matching), filter),
            limit_param(limit),
        ),
    };
    let query = match change {
        DeadChange::Requeue => S::bind_requeue(query),
        DeadChange::Discard => query,
    };
    let done = S::Db::run(query, store.admin().0)
        .await
        .map_err(|e| S::map_error(change.what(), e))?;
    Ok(S::rows_affected(&done))
}

/// [`OutboxAdmin::purge_dispatched`](outbox_core::OutboxAdmin::purge_dispatched) of a
/// sqlx outbox: [`SqlxAdmin::run_purge`] of at most [`purge_limit`] rows, nothing when
/// that is 0.
///
/// # Errors
/// Mapped driver errors.
pub async fn purge_dispatched<S>(store: &S, older_than: Duration, limit: usize) -> Result<u64>
where
    S: SqlxAdmin,
    S::Db: AdminEngine,
{
    let Some(limit) = purge_limit(limit, store.admin().1.retention) else {
        return Ok(0);
    };
    let query = S::bind_age(sqlx::query(&store.admin().1.purge_dispatched), older_than);
    store
        .run_purge(S::Db::bind_i64(query, limit_param(limit)))
        .await
        .map_err(|e| S::map_error("purge dispatched", e))
}

/// [`OutboxAdmin::count_dispatched`](outbox_core::OutboxAdmin::count_dispatched) of a
/// sqlx outbox: 0 under [`Retention::Delete`], without a statement.
///
/// # Errors
/// Mapped driver errors.
pub async fn count_dispatched<S>(store: &S, older_than: Duration) -> Result<u64>
where
    S: SqlxAdmin,
    S::Db: AdminEngine,
{
    if store.admin().1.retention == Retention::Delete {
        return Ok(0);
    }
    let query = S::bind_age(sqlx::query(&store.admin().1.count_dispatched), older_than);
    let n = S::Db::count(query, store.admin().0)
        .await
        .map_err(|e| S::map_error("count dispatched", e))?;
    unsigned::<S>(n, "dispatched")
}

/// Writes the [`OutboxAdmin`](outbox_core::OutboxAdmin) impl of a store that
/// implements [`SqlxAdmin`]: stats and dead-letter pages from the backend, the rest
/// from this crate's functions.
///
/// ```text
/// outbox_sqlx::sqlx_outbox_admin!(PgOutbox);
/// ```
#[macro_export]
macro_rules! sqlx_outbox_admin {
    ($store:ty) => {
        #[$crate::__private::async_trait]
        impl ::outbox_core::OutboxAdmin for $store {
            async fn stats(&self) -> ::outbox_core::Result<::outbox_core::OutboxStats> {
                <$store as $crate::SqlxAdmin>::read_stats(self).await
            }

            async fn dead_letters(
                &self,
                page: &::outbox_core::DeadLetterPage,
            ) -> ::outbox_core::Result<::std::vec::Vec<::outbox_core::DeadLetter>> {
                <$store as $crate::SqlxAdmin>::list_dead_letters(self, page).await
            }

            async fn count_dead(
                &self,
                filter: &::outbox_core::DeadLetterFilter,
            ) -> ::outbox_core::Result<u64> {
                $crate::count_dead(self, filter).await
            }

            async fn requeue_dead(
                &self,
                selection: &::outbox_core::DeadLetterSelection,
            ) -> ::outbox_core::Result<u64> {
                $crate::change_dead(self, ::outbox_core::backend::DeadChange::Requeue, selection)
                    .await
            }

            async fn discard_dead(
                &self,
                selection: &::outbox_core::DeadLetterSelection,
            ) -> ::outbox_core::Result<u64> {
                $crate::change_dead(self, ::outbox_core::backend::DeadChange::Discard, selection)
                    .await
            }

            /// As the trait says; a `limit` above
            /// [`MAX_ADMIN_BATCH`](outbox_core::admin::MAX_ADMIN_BATCH) is taken as that,
            /// so one statement never deletes more.
            async fn purge_dispatched(
                &self,
                older_than: ::std::time::Duration,
                limit: usize,
            ) -> ::outbox_core::Result<u64> {
                $crate::purge_dispatched(self, older_than, limit).await
            }

            async fn count_dispatched(
                &self,
                older_than: ::std::time::Duration,
            ) -> ::outbox_core::Result<u64> {
                $crate::count_dispatched(self, older_than).await
            }
        }
    };
}
