//! The inbox of a sqlx backend: [`SqlxInbox`] is what the backend writes (its
//! statements and binds, how a consumer transaction begins), the functions here and
//! [`sqlx_dedup_store!`](crate::sqlx_dedup_store) are the rest, the same on every engine.

use async_trait::async_trait;
use futures::future::BoxFuture;
use sqlx::{ColumnIndex, Database, Decode, Executor, IntoArguments, Pool, Row, Transaction, Type};

use crate::admin::{AdminEngine, Query};

use outbox_core::consumer::Processed;
use outbox_core::{ConsumerName, Dedup, Error, MessageId, Result};

/// The inbox statements whose control flow is shared: the backend writes their text
/// (placeholders, how the expiry is computed), the parameters are those the bind
/// methods of [`SqlxInbox`] bind, in this order.
#[derive(Debug, Clone)]
pub struct InboxStatements {
    /// The key ([`SqlxInbox::bind_key`]), then the expiry
    /// ([`SqlxInbox::bind_expiry`]): insert the id, or refresh an expired record. Its
    /// rows affected are 1 for a new (or expired) id, 0 for a duplicate (or as
    /// [`SqlxInbox::recorded`] reads them).
    pub record: String,
    /// The key, then the expiry; returns one row whose first column is whether an
    /// unexpired record of the id exists.
    pub contains: String,
    /// The expiry, then the limit (a 64-bit integer, at least 1): as
    /// [`SqlxInbox::run_purge`] runs it (by default, one statement deleting at most
    /// that many expired records).
    pub purge: String,
}

/// The database side of a sqlx inbox table: its statements ([`InboxStatements`]) and
/// binds, as the backend's dialect needs them (placeholders, how ids, times and the
/// retention are bound), and how a consumer transaction begins. The functions of this
/// module run the statements and map their errors with [`map_error`](Self::map_error).
#[async_trait]
pub trait SqlxInbox: Sync {
    /// The sqlx database.
    type Db: InboxEngine;

    /// The backend's error mapping (its [`from_sqlx`](crate::from_sqlx) over its
    /// [`ErrorCodes`](crate::ErrorCodes)).
    fn map_error(what: &str, err: sqlx::Error) -> Error;

    /// The pool the store's own statements run on.
    fn pool(&self) -> &Pool<Self::Db>;

    /// The store's statements.
    fn statements(&self) -> &InboxStatements;

    /// Begin the transaction [`process`] records the id and runs the handler on.
    async fn begin_consumer(&self) -> sqlx::Result<Transaction<'static, Self::Db>>;

    /// The rows a statement changed.
    fn rows_affected(done: &<Self::Db as Database>::QueryResult) -> u64;

    /// Whether [`InboxStatements::record`] recorded the id (new or expired) rather than
    /// finding it: by default, when it changed exactly one row. An engine that counts
    /// the rows a statement found rather than changed (MySQL's `CLIENT_FOUND_ROWS`)
    /// tells them apart otherwise.
    fn recorded(done: &<Self::Db as Database>::QueryResult) -> bool {
        Self::rows_affected(done) == 1
    }

    /// Bind the record's key: `consumer`, then `id`.
    fn bind_key<'q>(
        query: Query<'q, Self::Db>,
        consumer: &'q ConsumerName,
        id: MessageId,
    ) -> Query<'q, Self::Db>;

    /// Bind what tells an expired record (the retention, and the time now if the
    /// statement does not read the database's clock).
    fn bind_expiry<'q>(&self, query: Query<'q, Self::Db>) -> Query<'q, Self::Db>;

    /// Run [`InboxStatements::purge`], bound, and return how many records it deleted:
    /// by default as one statement on the pool. An engine on which that one statement
    /// would wait for records another transaction holds runs its own purge here.
    fn run_purge<'a>(&'a self, query: Query<'a, Self::Db>) -> BoxFuture<'a, sqlx::Result<u64>> {
        let pool = self.pool();
        Box::pin(async move { Ok(Self::rows_affected(&Self::Db::run(query, pool).await?)) })
    }
}

/// What the inbox functions need of a sqlx database beyond [`AdminEngine`]: to run a
/// statement on a connection and read a boolean. Every sqlx driver has it.
pub trait InboxEngine: AdminEngine {
    /// Run `query` on `conn`.
    fn run_on<'a, 'q: 'a>(
        query: Query<'q, Self>,
        conn: &'a mut Self::Connection,
    ) -> BoxFuture<'a, sqlx::Result<Self::QueryResult>>;

    /// Run `query` on `pool` and read the first column of its one row as a boolean.
    fn exists<'a, 'q: 'a>(
        query: Query<'q, Self>,
        pool: &'a Pool<Self>,
    ) -> BoxFuture<'a, sqlx::Result<bool>>;
}

impl<Db> InboxEngine for Db
where
    Db: AdminEngine,
    for<'c> &'c mut Db::Connection: Executor<'c, Database = Db>,
    for<'q> Db::Arguments<'q>: IntoArguments<'q, Db>,
    for<'r> bool: Decode<'r, Db> + Type<Db>,
    usize: ColumnIndex<Db::Row>,
{
    fn run_on<'a, 'q: 'a>(
        query: Query<'q, Self>,
        conn: &'a mut Self::Connection,
    ) -> BoxFuture<'a, sqlx::Result<Self::QueryResult>> {
        Box::pin(query.execute(conn))
    }

    fn exists<'a, 'q: 'a>(
        query: Query<'q, Self>,
        pool: &'a Pool<Self>,
    ) -> BoxFuture<'a, sqlx::Result<bool>> {
        Box::pin(async move { query.fetch_one(pool).await?.try_get(0) })
    }
}

/// [`InboxStatements::record`] on `conn`, its error mapped: [`Dedup::New`] when it
/// recorded the id.
///
/// # Errors
/// Mapped driver errors.
pub async fn record_in<S>(
    inbox: &S,
    conn: &mut <S::Db as Database>::Connection,
    consumer: &ConsumerName,
    id: MessageId,
) -> Result<Dedup>
where
    S: SqlxInbox,
    S::Db: InboxEngine,
{
    let query = S::bind_key(sqlx::query(&inbox.statements().record), consumer, id);
    let done = S::Db::run_on(inbox.bind_expiry(query), conn)
        .await
        .map_err(|e| S::map_error("record message id", e))?;
    Ok(if S::recorded(&done) {
        Dedup::New
    } else {
        Dedup::Duplicate
    })
}

/// Process message `id` for `consumer` exactly once in its own transaction: begin
/// ([`SqlxInbox::begin_consumer`]), record the id, run `handler` on the transaction,
/// commit. A duplicate runs nothing, rolls back and returns [`Processed::Duplicate`]; a
/// handler error drops the transaction, which rolls everything back, the id included.
///
/// # Errors
/// The handler's error, or mapped driver errors of begin, record and commit.
pub async fn process<S, T, F>(
    inbox: &S,
    consumer: &ConsumerName,
    id: MessageId,
    handler: F,
) -> Result<Processed<T>>
where
    S: SqlxInbox,
    S::Db: InboxEngine,
    T: Send,
    F: for<'c> FnOnce(&'c mut <S::Db as Database>::Connection) -> BoxFuture<'c, Result<T>> + Send,
{
    let mut tx = inbox
        .begin_consumer()
        .await
        .map_err(|e| S::map_error("begin the consumer transaction", e))?;
    if record_in(inbox, &mut tx, consumer, id).await? == Dedup::Duplicate {
        tx.rollback()
            .await
            .map_err(|e| S::map_error("end the consumer transaction", e))?;
        return Ok(Processed::Duplicate);
    }
    // On an error the transaction is dropped, which rolls it back.
    let value = handler(&mut tx).await?;
    tx.commit()
        .await
        .map_err(|e| S::map_error("commit the consumer transaction", e))?;
    Ok(Processed::Applied(value))
}

/// [`DedupStore::contains`](outbox_core::DedupStore::contains) of a sqlx inbox.
///
/// # Errors
/// Mapped driver errors.
pub async fn contains<S>(inbox: &S, consumer: &ConsumerName, id: MessageId) -> Result<bool>
where
    S: SqlxInbox,
    S::Db: InboxEngine,
{
    let query = S::bind_key(sqlx::query(&inbox.statements().contains), consumer, id);
    S::Db::exists(inbox.bind_expiry(query), inbox.pool())
        .await
        .map_err(|e| S::map_error("look up message id", e))
}

/// [`DedupStore::record`](outbox_core::DedupStore::record) of a sqlx inbox: the record
/// on a connection of its own, committed at once.
///
/// # Errors
/// Mapped driver errors.
pub async fn record<S>(inbox: &S, consumer: &ConsumerName, id: MessageId) -> Result<Dedup>
where
    S: SqlxInbox,
    S::Db: InboxEngine,
{
    let mut conn = inbox
        .pool()
        .acquire()
        .await
        .map_err(|e| S::map_error("record message id", e))?;
    record_in(inbox, &mut conn, consumer, id).await
}

/// [`DedupStore::purge_expired`](outbox_core::DedupStore::purge_expired) of a sqlx
/// inbox: [`SqlxInbox::run_purge`], nothing for a `limit` of 0.
///
/// # Errors
/// Mapped driver errors.
pub async fn purge_expired<S>(inbox: &S, limit: usize) -> Result<u64>
where
    S: SqlxInbox,
    S::Db: InboxEngine,
{
    if limit == 0 {
        return Ok(0);
    }
    let query = inbox.bind_expiry(sqlx::query(&inbox.statements().purge));
    let query = S::Db::bind_i64(query, outbox_core::backend::limit_param(limit));
    inbox
        .run_purge(query)
        .await
        .map_err(|e| S::map_error("purge message ids", e))
}

/// Writes what every sqlx inbox store has around its [`SqlxInbox`] impl: the public
/// `record_in` and `process` methods and the [`DedupStore`](outbox_core::DedupStore)
/// impl ([`Consistency::Strong`](outbox_core::Consistency::Strong)). `conn` is the
/// driver's connection type; the doc comments before `process` document it (say how
/// the transaction begins and what a failed commit leaves).
///
/// ```text
/// outbox_sqlx::sqlx_dedup_store! {
///     store: PgDedupStore,
///     conn: sqlx::PgConnection,
///     /// Process message `id` for `consumer` exactly once ...
///     process
/// }
/// ```
#[macro_export]
macro_rules! sqlx_dedup_store {
    (store: $store:ty, conn: $conn:ty, $(#[$process_doc:meta])* process $(,)?) => {
        impl $store {
            /// Record `id` for `consumer` on `conn`, normally inside the transaction that
            /// applies the message's effects (pass `&mut *tx`), so both commit together.
            ///
            /// # Errors
            /// Mapped driver errors.
            pub async fn record_in(
                &self,
                conn: &mut $conn,
                consumer: &::outbox_core::ConsumerName,
                id: ::outbox_core::MessageId,
            ) -> ::outbox_core::Result<::outbox_core::Dedup> {
                $crate::record_in(self, conn, consumer, id).await
            }

            $(#[$process_doc])*
            pub async fn process<T, F>(
                &self,
                consumer: &::outbox_core::ConsumerName,
                id: ::outbox_core::MessageId,
                handler: F,
            ) -> ::outbox_core::Result<::outbox_core::consumer::Processed<T>>
            where
                T: Send,
                F: for<'c> FnOnce(
                        &'c mut $conn,
                    ) -> $crate::__private::BoxFuture<'c, ::outbox_core::Result<T>>
                    + Send,
            {
                $crate::process(self, consumer, id, handler).await
            }
        }

        #[$crate::__private::async_trait]
        impl ::outbox_core::DedupStore for $store {
            fn consistency(&self) -> ::outbox_core::Consistency {
                ::outbox_core::Consistency::Strong
            }

            async fn contains(
                &self,
                consumer: &::outbox_core::ConsumerName,
                id: ::outbox_core::MessageId,
            ) -> ::outbox_core::Result<bool> {
                $crate::contains(self, consumer, id).await
            }

            async fn record(
                &self,
                consumer: &::outbox_core::ConsumerName,
                id: ::outbox_core::MessageId,
            ) -> ::outbox_core::Result<::outbox_core::Dedup> {
                $crate::record(self, consumer, id).await
            }

            async fn purge_expired(&self, limit: usize) -> ::outbox_core::Result<u64> {
                $crate::purge_expired(self, limit).await
            }
        }
    };
}
