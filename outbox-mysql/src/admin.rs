//! The [`OutboxAdmin`](outbox_core::OutboxAdmin) side of [`MySqlOutbox`]: its
//! statements' binds ([`SqlxAdmin`]); the dispatch and the purge bound are
//! `outbox-sqlx`'s.

use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;

use outbox_core::backend::{age_micros, limit_param};
use outbox_core::{
    DeadLetter, DeadLetterFilter, DeadLetterPage, Error, MessageId, OutboxStats, Result,
};
use outbox_sqlx::{AdminStatements, SqlxAdmin};
use sqlx::mysql::{MySqlQueryResult, MySqlRow};
use sqlx::{MySql, MySqlPool, Pool, Row};

use crate::error::from_sqlx;
use crate::row::decode_dead_letter;
use crate::store::MySqlOutbox;

type Query<'q> = outbox_sqlx::Query<'q, MySql>;

/// Ids as the JSON array of hex strings the statements read with `JSON_TABLE`.
fn json_ids(ids: &[MessageId]) -> String {
    let hex = ids.iter().map(|id| id.as_uuid().simple().to_string());
    serde_json::Value::from(hex.collect::<Vec<_>>()).to_string()
}

/// A purge that never waits for rows another transaction holds: one short transaction
/// on `pool` (READ COMMITTED) in which `select` locks at most its limit of rows with
/// `FOR UPDATE SKIP LOCKED` and returns each one's primary key as JSON, and `delete`
/// deletes those rows by primary key (its one parameter: the keys as a JSON array).
/// One `DELETE ... JOIN (SELECT ... SKIP LOCKED)` would wait: MariaDB 10.11 ignores
/// `SKIP LOCKED` in a derived table. Returns the rows deleted.
pub(crate) fn purge_locked<'a>(
    pool: &'a MySqlPool,
    select: Query<'a>,
    delete: &'a str,
) -> BoxFuture<'a, sqlx::Result<u64>> {
    Box::pin(async move {
        let mut tx = pool.begin().await?;
        let deleted = async {
            let keys: Vec<Vec<u8>> = select
                .try_map(|row: MySqlRow| row.try_get(0))
                .fetch_all(&mut *tx)
                .await?;
            if keys.is_empty() {
                return Ok(0);
            }
            // JSON of hex digits: ASCII, so never lossy.
            let keys = format!("[{}]", String::from_utf8_lossy(&keys.join(&b',')));
            let done = sqlx::query(delete).bind(keys).execute(&mut *tx).await?;
            Ok(done.rows_affected())
        }
        .await;
        if matches!(deleted, Ok(n) if n > 0) {
            tx.commit().await?;
            return deleted;
        }
        // Roll back now: a dropped transaction keeps its locks until its connection is
        // next used.
        let rolled_back = tx.rollback().await;
        deleted.and_then(|n| rolled_back.map(|()| n))
    })
}

#[async_trait]
impl SqlxAdmin for MySqlOutbox {
    type Db = MySql;

    fn map_error(what: &str, err: sqlx::Error) -> Error {
        from_sqlx(what, err)
    }

    /// The relay's READ COMMITTED pool: the admin writes and counts take no gap locks
    /// on `<table>_dead` or `<table>_dispatched`, which would block relays.
    fn admin(&self) -> (&Pool<MySql>, &AdminStatements) {
        (self.relay_pool(), &self.statements().admin)
    }

    fn rows_affected(done: &MySqlQueryResult) -> u64 {
        done.rows_affected()
    }

    /// One JSON array.
    fn bind_ids<'q>(query: Query<'q>, ids: &[MessageId]) -> Query<'q> {
        query.bind(json_ids(ids))
    }

    /// Each of destination, least age (µs) and ids twice (`? IS NULL OR ...`).
    fn bind_filter<'q>(query: Query<'q>, filter: &'q DeadLetterFilter) -> Query<'q> {
        let age = filter.dead_for().map(age_micros);
        let ids = filter.ids().map(json_ids);
        query
            .bind(filter.destination())
            .bind(filter.destination())
            .bind(age)
            .bind(age)
            .bind(ids.clone())
            .bind(ids)
    }

    fn bind_age(query: Query<'_>, older_than: Duration) -> Query<'_> {
        query.bind(age_micros(older_than))
    }

    /// The select (`FOR UPDATE SKIP LOCKED`), then a delete of the ids it locked, in
    /// one transaction: never waits on rows a relay holds.
    fn run_purge<'a>(&'a self, select: Query<'a>) -> BoxFuture<'a, sqlx::Result<u64>> {
        purge_locked(self.relay_pool(), select, &self.statements().purge_delete)
    }

    /// With held-lock claims, batches that ended without committing are swept first,
    /// so their messages count as pending, not in flight.
    async fn read_stats(&self) -> Result<OutboxStats> {
        self.sweep_held().await?;
        let (pending, in_flight, oldest, dead, dispatched): (i64, i64, Option<i64>, i64, i64) =
            sqlx::query_as(self.stats_sql())
                .fetch_one(self.pool())
                .await
                .map_err(|e| from_sqlx("stats", e))?;
        let unsigned = |n: i64| u64::try_from(n).map_err(|_| Self::negative_count("stats"));
        Ok(OutboxStats::new(
            unsigned(pending)?,
            unsigned(in_flight)?,
            unsigned(dead)?,
            unsigned(dispatched)?,
            oldest.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))),
        ))
    }

    async fn list_dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>> {
        let sql = self
            .statements()
            .dead_letters(page.order(), page.after_id().is_some());
        let mut query = Self::bind_filter(sqlx::query(sql), page.filter());
        if let Some(after) = page.after_id() {
            query = query.bind(after.as_uuid());
        }
        let rows = query
            .bind(limit_param(page.limit()))
            .fetch_all(self.pool())
            .await
            .map_err(|e| from_sqlx("list dead letters", e))?;
        rows.iter().map(decode_dead_letter).collect()
    }
}

outbox_sqlx::sqlx_outbox_admin!(MySqlOutbox);
