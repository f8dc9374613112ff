//! Running a [`Stmt`] on a tiberius client, and reading typed columns from rows.
//!
//! The crate's own statements on pooled sessions run [`guarded`]: bounded in time,
//! and the session marked broken (closed by the pool, not reused) unless the request
//! finished, since a future dropped or timed out mid-request leaves the connection
//! with a response still to read (or half a request sent).

use std::time::Duration;

use futures::future::BoxFuture;
use futures::io::{AsyncRead, AsyncWrite};
use tiberius::{Client, Query, Row};

use outbox_core::{Error, ErrorKind, Result};

use crate::error::{decode_error, from_tiberius};
use crate::session::{BreakOnDrop, MssqlClient, MssqlSession};
use crate::sql::{Param, Stmt};

/// `stmt` as a tiberius query with every parameter bound.
fn to_query(stmt: Stmt) -> Query<'static> {
    let mut query = Query::new(stmt.sql);
    for param in stmt.params {
        match param {
            Param::Bytes(bytes) => query.bind(bytes),
            Param::Text(Some(text)) => query.bind(text),
            Param::Text(None) => query.bind(None::<&'static str>),
            Param::I64(n) => query.bind(n),
            Param::I32(n) => query.bind(n),
            Param::Bool(b) => query.bind(b),
        }
    }
    query
}

/// Run `stmt` and return the rows of its first result set.
pub(crate) async fn query_rows<S>(
    client: &mut Client<S>,
    stmt: Stmt,
) -> std::result::Result<Vec<Row>, tiberius::error::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    to_query(stmt)
        .query(client)
        .await?
        .into_first_result()
        .await
}

/// Run `stmt` and return the rows of all its result sets.
pub(crate) async fn query_all_rows<S>(
    client: &mut Client<S>,
    stmt: Stmt,
) -> std::result::Result<Vec<Row>, tiberius::error::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let sets = to_query(stmt).query(client).await?.into_results().await?;
    Ok(sets.into_iter().flatten().collect())
}

/// Run `stmt` and return how many rows it changed in all.
pub(crate) async fn execute<S>(
    client: &mut Client<S>,
    stmt: Stmt,
) -> std::result::Result<u64, tiberius::error::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    Ok(to_query(stmt).execute(client).await?.total())
}

/// Run `run` on `session`'s client for `what`, bounded by `limit` when given (see
/// [`bounded`]); past `limit`, [`ErrorKind::Timeout`] (retryable).
pub(crate) async fn guarded<'s, T: Send + 's>(
    session: &'s mut MssqlSession,
    what: &str,
    limit: Option<Duration>,
    run: impl FnOnce(
        &'s mut MssqlClient,
    ) -> BoxFuture<'s, std::result::Result<T, tiberius::error::Error>>,
) -> Result<T> {
    let (client, broken) = session.parts();
    let read_to_end = |e: &tiberius::error::Error| matches!(e, tiberius::error::Error::Server(_));
    match bounded(broken, limit, run(client), read_to_end).await {
        Ok(value) => Ok(value),
        Err(Cut::Failed(err)) => Err(from_tiberius(what, err)),
        Err(Cut::TimedOut(limit)) => Err(Error::new(
            ErrorKind::Timeout,
            format!("{what} did not finish within {limit:?}; its session is closed"),
        )),
    }
}

/// Why a [`bounded`] request did not return a value.
#[derive(Debug)]
pub(crate) enum Cut<E> {
    /// It failed with this error.
    Failed(E),
    /// It ran past this bound.
    TimedOut(Duration),
}

/// Await `request`, bounded by `limit`, keeping `broken` (the session's flag) set
/// unless the request finished with its response read to the end: a value, or an
/// error for which `read_to_end` says so (a server error). A time-out, a connection
/// error, or this future dropped before the end leave the flag set.
pub(crate) async fn bounded<T, E>(
    broken: &mut bool,
    limit: Option<Duration>,
    request: impl std::future::Future<Output = std::result::Result<T, E>>,
    read_to_end: impl Fn(&E) -> bool,
) -> std::result::Result<T, Cut<E>> {
    let open = BreakOnDrop::new(broken);
    let outcome = match limit {
        Some(limit) => tokio::time::timeout(limit, request)
            .await
            .map_err(|_| Cut::TimedOut(limit))?,
        None => request.await,
    };
    match outcome {
        Ok(value) => {
            open.disarm();
            Ok(value)
        }
        Err(err) => {
            if read_to_end(&err) {
                open.disarm();
            }
            Err(Cut::Failed(err))
        }
    }
}

/// [`query_rows`] on a pooled session, [`guarded`] by its statement time-out (or
/// `limit`, when shorter).
pub(crate) async fn session_rows(
    session: &mut MssqlSession,
    what: &str,
    stmt: Stmt,
    limit: Option<Duration>,
) -> Result<Vec<Row>> {
    let limit = shorter(session.statement_timeout(), limit);
    guarded(session, what, limit, |client| {
        Box::pin(query_rows(client, stmt))
    })
    .await
}

/// [`execute`] on a pooled session, [`guarded`] by its statement time-out.
pub(crate) async fn session_execute(
    session: &mut MssqlSession,
    what: &str,
    stmt: Stmt,
) -> Result<u64> {
    let limit = session.statement_timeout();
    guarded(session, what, limit, |client| {
        Box::pin(execute(client, stmt))
    })
    .await
}

/// The shorter of two optional bounds.
pub(crate) fn shorter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn missing(column: &str) -> outbox_core::Error {
    decode_error(format!("column {column} is NULL or missing"))
}

fn wrong(column: &str, e: tiberius::error::Error) -> outbox_core::Error {
    decode_error(format!("column {column} has an unexpected type")).with_source(e)
}

/// A non-null `binary(16)` column.
pub(crate) fn row_id(row: &Row, column: &str) -> Result<[u8; 16]> {
    let bytes: &[u8] = row
        .try_get(column)
        .map_err(|e| wrong(column, e))?
        .ok_or_else(|| missing(column))?;
    <[u8; 16]>::try_from(bytes).map_err(|_| {
        decode_error(format!(
            "column {column} holds {} bytes, not 16",
            bytes.len()
        ))
    })
}

/// A nullable text column.
pub(crate) fn row_opt_str(row: &Row, column: &str) -> Result<Option<String>> {
    let text: Option<&str> = row.try_get(column).map_err(|e| wrong(column, e))?;
    Ok(text.map(str::to_owned))
}

/// A non-null text column.
pub(crate) fn row_str(row: &Row, column: &str) -> Result<String> {
    row_opt_str(row, column)?.ok_or_else(|| missing(column))
}

/// A non-null `varbinary` column.
pub(crate) fn row_bytes(row: &Row, column: &str) -> Result<Vec<u8>> {
    let bytes: Option<&[u8]> = row.try_get(column).map_err(|e| wrong(column, e))?;
    bytes.map(<[u8]>::to_vec).ok_or_else(|| missing(column))
}

/// A non-null `int` column.
pub(crate) fn row_i32(row: &Row, column: &str) -> Result<i32> {
    let n: Option<i32> = row.try_get(column).map_err(|e| wrong(column, e))?;
    n.ok_or_else(|| missing(column))
}

/// A nullable `bigint` column.
pub(crate) fn row_opt_i64(row: &Row, column: &str) -> Result<Option<i64>> {
    row.try_get(column).map_err(|e| wrong(column, e))
}

/// A non-null `bigint` column.
pub(crate) fn row_i64(row: &Row, column: &str) -> Result<i64> {
    row_opt_i64(row, column)?.ok_or_else(|| missing(column))
}

/// A `bigint` count, as `u64`.
pub(crate) fn row_count(row: &Row, column: &str) -> Result<u64> {
    let n = row_i64(row, column)?;
    u64::try_from(n).map_err(|_| decode_error(format!("negative {column} count")))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll};

    #[derive(Debug, PartialEq)]
    enum Failure {
        Server,
        Io,
    }

    fn read_to_end(e: &Failure) -> bool {
        *e == Failure::Server
    }

    #[tokio::test(start_paused = true)]
    async fn a_statement_past_its_bound_times_out_and_breaks_its_session() {
        let mut broken = false;
        let hung = futures::future::pending::<std::result::Result<(), Failure>>();
        let out = bounded(
            &mut broken,
            Some(Duration::from_secs(30)),
            hung,
            read_to_end,
        )
        .await;
        assert!(matches!(out, Err(Cut::TimedOut(d)) if d == Duration::from_secs(30)));
        assert!(
            broken,
            "a request may still run on the session: the pool must close it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_statement_leaves_its_session_usable() {
        let mut broken = false;
        let ok = bounded(
            &mut broken,
            Some(Duration::from_secs(1)),
            async { Ok::<_, Failure>(7) },
            read_to_end,
        );
        assert_eq!(ok.await.unwrap(), 7);
        assert!(!broken);
        // A server error was read to the end of its response.
        let failed = bounded(
            &mut broken,
            None,
            async { Err::<(), _>(Failure::Server) },
            read_to_end,
        );
        assert!(matches!(failed.await, Err(Cut::Failed(Failure::Server))));
        assert!(!broken);
        // A connection error was not.
        let lost = bounded(
            &mut broken,
            None,
            async { Err::<(), _>(Failure::Io) },
            read_to_end,
        );
        assert!(matches!(lost.await, Err(Cut::Failed(Failure::Io))));
        assert!(broken);
    }

    #[test]
    fn a_statement_dropped_midway_breaks_its_session() {
        let mut broken = false;
        {
            let hung = futures::future::pending::<std::result::Result<(), Failure>>();
            let mut future = pin!(bounded(&mut broken, None, hung, read_to_end));
            let mut cx = Context::from_waker(futures::task::noop_waker_ref());
            assert!(matches!(future.as_mut().poll(&mut cx), Poll::Pending));
        }
        assert!(broken);
    }

    #[test]
    fn the_shorter_bound_wins() {
        let s = Duration::from_secs;
        assert_eq!(shorter(Some(s(30)), Some(s(5))), Some(s(5)));
        assert_eq!(shorter(Some(s(3)), Some(s(5))), Some(s(3)));
        assert_eq!(shorter(None, Some(s(5))), Some(s(5)));
        assert_eq!(shorter(Some(s(30)), None), Some(s(30)));
        assert_eq!(shorter(None, None), None);
    }
}
