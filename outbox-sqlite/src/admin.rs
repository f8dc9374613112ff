//! The [`OutboxAdmin`] side of [`SqliteOutbox`]: stats, dead letters, purges.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;

use outbox_core::admin::MAX_ADMIN_BATCH;
use outbox_core::{
    DeadLetter, DeadLetterFilter, DeadLetterOrder, DeadLetterPage, DeadLetterSelection, Error,
    ErrorKind, MessageId, OutboxAdmin, OutboxStats, Result, Retention,
};

use crate::error::from_sqlx;
use crate::row::{decode_dead_letter, get};
use crate::store::SqliteOutbox;
use crate::time::{age_micros, limit_param, now_us};

/// How a dead-letter statement changes its rows.
#[derive(Debug, Clone, Copy)]
enum Change {
    Requeue,
    Discard,
}

type Query<'q> = sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

/// Bind a filter as `?1` (destination or NULL), `?2` (dead-at cutoff or NULL) and `?3`
/// (ids as a JSON array of hex strings, or NULL).
fn bind_filter<'q>(query: Query<'q>, filter: &'q DeadLetterFilter, now: i64) -> Query<'q> {
    query
        .bind(filter.destination())
        .bind(filter.dead_for().map(|age| cutoff(now, age)))
        .bind(filter.ids().map(hex_ids))
}

/// Ids as the JSON array of hex strings the statements read with `json_each`.
fn hex_ids(ids: &[MessageId]) -> String {
    let hex: Vec<String> = ids
        .iter()
        .map(|id| id.as_uuid().simple().to_string())
        .collect();
    json!(hex).to_string()
}

/// The only column of a `SELECT count(*)`, as `u64`.
fn count(row: &sqlx::sqlite::SqliteRow, what: &str) -> Result<u64> {
    let n: i64 = get(row, 0)?;
    u64::try_from(n).map_err(|_| Error::new(ErrorKind::Decode, format!("negative {what} count")))
}

/// `now` minus `age`, stopping at the smallest time rather than overflowing.
fn cutoff(now: i64, age: Duration) -> i64 {
    now.saturating_sub(age_micros(age))
}

impl SqliteOutbox {
    /// Requeue or discard the selected dead letters; returns how many changed.
    async fn change_dead(&self, change: Change, selection: &DeadLetterSelection) -> Result<u64> {
        selection.validate()?;
        let sql = self.statements();
        let now = now_us();
        let (what, by_ids, matching) = match change {
            Change::Requeue => (
                "requeue dead letters",
                &sql.requeue_ids,
                &sql.requeue_matching,
            ),
            Change::Discard => (
                "discard dead letters",
                &sql.discard_ids,
                &sql.discard_matching,
            ),
        };
        let query = match selection {
            DeadLetterSelection::Ids(ids) if ids.is_empty() => return Ok(0),
            DeadLetterSelection::Ids(ids) => {
                let query = sqlx::query(by_ids).bind(hex_ids(ids));
                match change {
                    Change::Requeue => query.bind(now),
                    Change::Discard => query,
                }
            }
            DeadLetterSelection::Matching { filter, limit } => {
                let query =
                    bind_filter(sqlx::query(matching), filter, now).bind(limit_param(*limit));
                match change {
                    Change::Requeue => query.bind(now),
                    Change::Discard => query,
                }
            }
        };
        let done = query
            .execute(self.pool())
            .await
            .map_err(|e| from_sqlx(what, e))?;
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl OutboxAdmin for SqliteOutbox {
    async fn stats(&self) -> Result<OutboxStats> {
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

    async fn dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>> {
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

    async fn count_dead(&self, filter: &DeadLetterFilter) -> Result<u64> {
        let query = sqlx::query(&self.statements().count_dead);
        let row = bind_filter(query, filter, now_us())
            .fetch_one(self.pool())
            .await
            .map_err(|e| from_sqlx("count dead letters", e))?;
        count(&row, "dead letter")
    }

    async fn requeue_dead(&self, selection: &DeadLetterSelection) -> Result<u64> {
        self.change_dead(Change::Requeue, selection).await
    }

    async fn discard_dead(&self, selection: &DeadLetterSelection) -> Result<u64> {
        self.change_dead(Change::Discard, selection).await
    }

    /// As the trait says; a `limit` above [`MAX_ADMIN_BATCH`] is taken as that, so one
    /// statement never deletes more.
    async fn purge_dispatched(&self, older_than: Duration, limit: usize) -> Result<u64> {
        if limit == 0 || self.config().retention() == Retention::Delete {
            return Ok(0);
        }
        let done = sqlx::query(&self.statements().purge_dispatched)
            .bind(cutoff(now_us(), older_than))
            .bind(limit_param(limit.min(MAX_ADMIN_BATCH)))
            .execute(self.pool())
            .await
            .map_err(|e| from_sqlx("purge dispatched", e))?;
        Ok(done.rows_affected())
    }

    async fn count_dispatched(&self, older_than: Duration) -> Result<u64> {
        if self.config().retention() == Retention::Delete {
            return Ok(0);
        }
        let row = sqlx::query(&self.statements().count_dispatched)
            .bind(cutoff(now_us(), older_than))
            .fetch_one(self.pool())
            .await
            .map_err(|e| from_sqlx("count dispatched", e))?;
        count(&row, "dispatched")
    }
}

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
