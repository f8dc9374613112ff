//! The [`OutboxAdmin`](outbox_core::OutboxAdmin) side of [`PgOutbox`]: its statements
//! and binds ([`SqlxAdmin`]); the dispatch and the purge bound are `outbox-sqlx`'s.

use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use outbox_core::{
    DeadLetter, DeadLetterFilter, DeadLetterPage, Error, MessageId, OutboxStats, Result,
};
use outbox_sqlx::{AdminStatements, SqlxAdmin};
use sqlx::postgres::PgQueryResult;
use sqlx::Pool;
use sqlx::Postgres;

use crate::error::from_sqlx;
use crate::row::{decode_dead_letter, decode_error, get};
use crate::sql::{age_micros, limit_param};
use crate::store::PgOutbox;

type Query<'q> = outbox_sqlx::Query<'q, Postgres>;

#[async_trait]
impl SqlxAdmin for PgOutbox {
    type Db = Postgres;

    fn map_error(what: &str, err: sqlx::Error) -> Error {
        from_sqlx(what, err)
    }

    fn negative_count(_: &str) -> Error {
        decode_error("negative count".to_owned())
    }

    /// `$1`: the ids as a `uuid[]`.
    fn bind_ids<'q>(query: Query<'q>, ids: &[MessageId]) -> Query<'q> {
        query.bind(ids.iter().map(MessageId::as_uuid).collect::<Vec<Uuid>>())
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    /// `$1` (destination or NULL), `$2` (least age in µs or NULL) and `$3` (ids or
    /// NULL).
    fn bind_filter<'q>(query: Query<'q>, filter: &'q DeadLetterFilter) -> Query<'q> {
        let ids: Option<Vec<Uuid>> = filter
            .ids()
            .map(|ids| ids.iter().map(MessageId::as_uuid).collect());
        query
            .bind(filter.destination())
            .bind(filter.dead_for().map(age_micros))
            .bind(ids)
    }

    fn admin(&self) -> (&Pool<Postgres>, &AdminStatements) {
        (self.pool(), &self.statements().admin)
    }

    /// The age in µs: the server's clock takes it from `now()`.
    fn bind_age(query: Query<'_>, older_than: Duration) -> Query<'_> {
        query.bind(age_micros(older_than))
    }

    async fn read_stats(&self) -> Result<OutboxStats> {
        let row = sqlx::query(self.stats_sql())
            .fetch_one(self.pool())
            .await
            .map_err(|e| from_sqlx("stats", e))?;
        let count = |name: &str| -> Result<u64> {
            let n: i64 = get(&row, name)?;
            u64::try_from(n).map_err(|_| decode_error(format!("negative {name} count")))
        };
        let oldest: Option<i64> = get(&row, "oldest_us")?;
        let oldest = oldest.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)));
        Ok(OutboxStats::new(
            count("pending")?,
            count("in_flight")?,
            count("dead")?,
            count("dispatched")?,
            oldest,
        ))
    }

    async fn list_dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>> {
        let sql = self
            .statements()
            .dead_letters(page.order(), page.after_id().is_some());
        let mut query =
            Self::bind_filter(sqlx::query(sql), page.filter()).bind(limit_param(page.limit()));
        if let Some(after) = page.after_id() {
            query = query.bind(after.as_uuid());
        }
        let rows = query
            .fetch_all(self.pool())
            .await
            .map_err(|e| from_sqlx("list dead letters", e))?;
        rows.iter().map(decode_dead_letter).collect()
    }
}

outbox_sqlx::sqlx_outbox_admin!(PgOutbox);
