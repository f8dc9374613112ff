//! The [`OutboxAdmin`](outbox_core::OutboxAdmin) side of [`SqliteOutbox`]: its
//! statements and binds ([`SqlxAdmin`]); the dispatch and the purge bound are
//! `outbox-sqlx`'s.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;

use outbox_core::{
    DeadLetter, DeadLetterFilter, DeadLetterOrder, DeadLetterPage, Error, ErrorKind, MessageId,
    OutboxStats, Result,
};
use outbox_sqlx::{AdminStatements, SqlxAdmin};
use sqlx::sqlite::SqliteQueryResult;
use sqlx::Pool;
use sqlx::Sqlite;

use crate::error::from_sqlx;
use crate::row::{decode_dead_letter, get};
use crate::store::SqliteOutbox;
use crate::time::{age_micros, limit_param, now_us};

type Query<'q> = outbox_sqlx::Query<'q, Sqlite>;

/// Ids as the JSON array of hex strings the statements read with `json_each`.
fn hex_ids(ids: &[MessageId]) -> String {
    let hex: Vec<String> = ids
        .iter()
        .map(|id| id.as_uuid().simple().to_string())
        .collect();
    json!(hex).to_string()
}

/// Bind a filter as `?1` (destination or NULL), `?2` (dead-at cutoff or NULL) and `?3`
/// (ids as a JSON array of hex strings, or NULL).
fn bind_filter<'q>(query: Query<'q>, filter: &'q DeadLetterFilter, now: i64) -> Query<'q> {
    query
        .bind(filter.destination())
        .bind(filter.dead_for().map(|age| cutoff(now, age)))
        .bind(filter.ids().map(hex_ids))
}

/// `now` minus `age`, stopping at the smallest time rather than overflowing.
fn cutoff(now: i64, age: Duration) -> i64 {
    now.saturating_sub(age_micros(age))
}

#[async_trait]
impl SqlxAdmin for SqliteOutbox {
    type Db = Sqlite;

    fn map_error(what: &str, err: sqlx::Error) -> Error {
        from_sqlx(what, err)
    }

    /// `?1`: the ids as a JSON array of hex strings.
    fn bind_ids<'q>(query: Query<'q>, ids: &[MessageId]) -> Query<'q> {
        query.bind(hex_ids(ids))
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    /// `?1` (destination or NULL), `?2` (dead-at cutoff from now, or NULL) and `?3`
    /// (ids as a JSON array of hex strings, or NULL).
    fn bind_filter<'q>(query: Query<'q>, filter: &'q DeadLetterFilter) -> Query<'q> {
        bind_filter(query, filter, now_us())
    }

    fn admin(&self) -> (&Pool<Sqlite>, &AdminStatements) {
        (self.pool(), &self.statements().admin)
    }

    /// Now: the time the requeued rows become due.
    fn bind_requeue(query: Query<'_>) -> Query<'_> {
        query.bind(now_us())
    }

    /// The completion-time cutoff: now minus the age, stopping at the smallest time.
    fn bind_age(query: Query<'_>, older_than: Duration) -> Query<'_> {
        query.bind(cutoff(now_us(), older_than))
    }

    async fn read_stats(&self) -> Result<OutboxStats> {
        let now = now_us();
        let row = sqlx::query(&self.statements().stats)
            .bind(now)
            .fetch_one(self.pool())
            .await
            .map_err(|e| from_sqlx("stats", e))?;
        let count = |index: usize, name: &str| -> Result<u64> {
            let n: i64 = get(&row, index)?;
            u64::try_from(n)
                .map_err(|_| Error::new(ErrorKind::Decode, format!("negative {name} count")))
        };
        let oldest: Option<i64> = get(&row, 2)?;
        let oldest = oldest.map(|created| {
            Duration::from_micros(u64::try_from(now.saturating_sub(created)).unwrap_or(0))
        });
        Ok(OutboxStats::new(
            count(0, "pending")?,
            count(1, "in_flight")?,
            count(3, "dead")?,
            count(4, "dispatched")?,
            oldest,
        ))
    }

    async fn list_dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>> {
        let sql = self.statements();
        let sql = match page.order() {
            DeadLetterOrder::Ascending => &sql.dead_letters,
            DeadLetterOrder::Descending => &sql.dead_letters_desc,
        };
        let rows = bind_filter(sqlx::query(sql), page.filter(), now_us())
            .bind(limit_param(page.limit()))
            .bind(page.after_id().map(|id| id.as_uuid().as_bytes().to_vec()))
            .fetch_all(self.pool())
            .await
            .map_err(|e| from_sqlx("list dead letters", e))?;
        rows.iter().map(decode_dead_letter).collect()
    }
}

outbox_sqlx::sqlx_outbox_admin!(SqliteOutbox);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutoffs_saturate() {
        assert_eq!(cutoff(10, Duration::from_micros(4)), 6);
        assert_eq!(cutoff(10, Duration::MAX), 10 - i64::MAX);
        assert_eq!(cutoff(i64::MIN + 5, Duration::from_micros(10)), i64::MIN);
    }
}
