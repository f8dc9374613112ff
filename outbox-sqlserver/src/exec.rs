//! Running a [`Stmt`] on a tiberius client, and reading typed columns from rows.

use futures::io::{AsyncRead, AsyncWrite};
use tiberius::{Client, Query, Row};

use outbox_core::Result;

use crate::error::decode_error;
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
