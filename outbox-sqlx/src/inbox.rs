//! The inbox of a sqlx backend: [`SqlxInbox`] is what the backend writes (its
//! statements, how a consumer transaction begins), the functions here and
//! [`sqlx_dedup_store!`](crate::sqlx_dedup_store) are the rest, the same on every engine.

use async_trait::async_trait;
use futures::future::BoxFuture;
use sqlx::{Database, Pool, Transaction};

use outbox_core::consumer::Processed;
use outbox_core::{ConsumerName, Dedup, Error, MessageId, Result};

/// The database side of a sqlx inbox table: its statements, run as the backend's
/// dialect needs them (placeholders, how ids, times and the retention are bound). Each
/// method returns the driver's error; the functions of this module map it with
/// [`map_error`](Self::map_error).
#[async_trait]
pub trait SqlxInbox: Sync {
    /// The sqlx database.
    type Db: Database;

    /// The backend's error mapping (its [`from_sqlx`](crate::from_sqlx) over its
    /// [`ErrorCodes`](crate::ErrorCodes)), for the errors of the methods below.
    fn map_error(what: &str, err: sqlx::Error) -> Error;

    /// The pool the store's own statements run on.
    fn pool(&self) -> &Pool<Self::Db>;

    /// Begin the transaction [`process`] records the id and runs the handler on.
    async fn begin_consumer(&self) -> sqlx::Result<Transaction<'static, Self::Db>>;

    /// Record `id` for `consumer` on `conn`: insert it, or refresh an expired record.
    /// Returns the rows affected: 1 for a new (or expired) id, 0 for a duplicate.
    async fn record_on(
        &self,
        conn: &mut <Self::Db as Database>::Connection,
        consumer: &ConsumerName,
        id: MessageId,
    ) -> sqlx::Result<u64>;

    /// Whether an unexpired record of `id` for `consumer` exists.
    async fn contains_on_pool(&self, consumer: &ConsumerName, id: MessageId) -> sqlx::Result<bool>;

    /// Delete at most `limit` (at least 1) expired records; returns how many it deleted.
    async fn purge_on_pool(&self, limit: i64) -> sqlx::Result<u64>;
}

/// [`SqlxInbox::record_on`] with its error mapped: [`Dedup::New`] when it recorded the
/// id.
///
/// # Errors
/// Mapped driver errors.
pub async fn record_in<S: SqlxInbox>(
    inbox: &S,
    conn: &mut <S::Db as Database>::Connection,
    consumer: &ConsumerName,
    id: MessageId,
) -> Result<Dedup> {
    let affected = inbox
        .record_on(conn, consumer, id)
        .await
        .map_err(|e| S::map_error("record message id", e))?;
    Ok(if affected == 1 {
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
pub async fn contains<S: SqlxInbox>(
    inbox: &S,
    consumer: &ConsumerName,
    id: MessageId,
) -> Result<bool> {
    inbox
        .contains_on_pool(consumer, id)
        .await
        .map_err(|e| S::map_error("look up message id", e))
}

/// [`DedupStore::record`](outbox_core::DedupStore::record) of a sqlx inbox: the record
/// on a connection of its own, committed at once.
///
/// # Errors
/// Mapped driver errors.
pub async fn record<S: SqlxInbox>(
    inbox: &S,
    consumer: &ConsumerName,
    id: MessageId,
) -> Result<Dedup> {
    let mut conn = inbox
        .pool()
        .acquire()
        .await
        .map_err(|e| S::map_error("record message id", e))?;
    record_in(inbox, &mut conn, consumer, id).await
}

/// [`DedupStore::purge_expired`](outbox_core::DedupStore::purge_expired) of a sqlx
/// inbox: no statement for a `limit` of 0.
///
/// # Errors
/// Mapped driver errors.
pub async fn purge_expired<S: SqlxInbox>(inbox: &S, limit: usize) -> Result<u64> {
    if limit == 0 {
        return Ok(0);
    }
    inbox
        .purge_on_pool(outbox_core::backend::limit_param(limit))
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
