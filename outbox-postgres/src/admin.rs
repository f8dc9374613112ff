//! The [`OutboxAdmin`] side of [`PgOutbox`]: stats, dead letters, purges.

use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use outbox_core::admin::MAX_ADMIN_BATCH;
use outbox_core::{
    DeadLetter, DeadLetterFilter, DeadLetterPage, DeadLetterSelection, MessageId, OutboxAdmin,
    OutboxStats, Result, Retention,
};

use crate::error::from_sqlx;
use crate::row::{decode_dead_letter, decode_error, get};
use crate::sql::{age_micros, limit_param};
use crate::store::PgOutbox;

/// How a dead-letter statement changes its rows.
#[derive(Debug, Clone, Copy)]
enum Change {
    Requeue,
    Discard,
}

impl PgOutbox {
    /// Requeue or discard the selected dead letters; returns how many changed.
    async fn change_dead(&self, change: Change, selection: &DeadLetterSelection) -> Result<u64> {
        selection.validate()?;
        let sql = self.statements();
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
                // In id order, like the settle statements, so overlapping calls lock
                // their rows in one order.
                let mut ids: Vec<Uuid> = ids.iter().map(MessageId::as_uuid).collect();
                ids.sort_unstable();
                ids.dedup();
                sqlx::query(by_ids).bind(ids)
            }
            DeadLetterSelection::Matching { filter, limit } => {
                bind_filter(sqlx::query(matching), filter).bind(limit_param(*limit))
            }
        };
        let done = query
            .execute(self.pool())
            .await
            .map_err(|e| from_sqlx(what, e))?;
        Ok(done.rows_affected())
    }
}

type Query<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Bind a filter as `$1` (destination or NULL), `$2` (least age in µs or NULL) and `$3`
/// (ids or NULL).
fn bind_filter<'q>(query: Query<'q>, filter: &'q DeadLetterFilter) -> Query<'q> {
    let ids: Option<Vec<Uuid>> = filter
        .ids()
        .map(|ids| ids.iter().map(MessageId::as_uuid).collect());
    query
        .bind(filter.destination())
        .bind(filter.dead_for().map(age_micros))
        .bind(ids)
}

/// The `count` column of a `SELECT count(*)`, as `u64`.
fn count(row: &sqlx::postgres::PgRow) -> Result<u64> {
    let n: i64 = get(row, "count")?;
    u64::try_from(n).map_err(|_| decode_error("negative count".to_owned()))
}

#[async_trait]
impl OutboxAdmin for PgOutbox {
    async fn stats(&self) -> Result<OutboxStats> {
        let row = sqlx::query(&self.statements().stats)
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

    async fn dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>> {
        let sql = self
            .statements()
            .dead_letters(page.order(), page.after_id().is_some());
        let mut query =
            bind_filter(sqlx::query(sql), page.filter()).bind(limit_param(page.limit()));
        if let Some(after) = page.after_id() {
            query = query.bind(after.as_uuid());
        }
        let rows = query
            .fetch_all(self.pool())
            .await
            .map_err(|e| from_sqlx("list dead letters", e))?;
        rows.iter().map(decode_dead_letter).collect()
    }

    async fn count_dead(&self, filter: &DeadLetterFilter) -> Result<u64> {
        let row = bind_filter(sqlx::query(&self.statements().count_dead), filter)
            .fetch_one(self.pool())
            .await
            .map_err(|e| from_sqlx("count dead letters", e))?;
        count(&row)
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
            .bind(age_micros(older_than))
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
            .bind(age_micros(older_than))
            .fetch_one(self.pool())
            .await
            .map_err(|e| from_sqlx("count dispatched", e))?;
        count(&row)
    }
}
