//! The [`OutboxAdmin`] side of [`MssqlOutbox`]: stats, dead letters, purges.
//!
//! Changes by filter and purges run in statements of at most
//! [`DELETE_BATCH`](crate::sql::DELETE_BATCH) rows (`TOP (n)` with `READPAST`, so rows
//! others hold are skipped; [`ESCALATING_BATCH`](crate::sql::ESCALATING_BATCH) where
//! the table's lock escalation is on), repeated until the caller's limit is reached or
//! a statement finds fewer rows.

use std::time::Duration;

use async_trait::async_trait;

use outbox_core::backend::{dead_target, purge_limit, DeadTarget};
use outbox_core::{
    DeadLetter, DeadLetterFilter, DeadLetterOrder, DeadLetterPage, DeadLetterSelection,
    OutboxAdmin, OutboxStats, Result, Retention,
};

use crate::claim::UPDATE_LOCKS;
use crate::error::has_number;
use crate::exec::{guarded, query_rows, row_count, row_opt_i64, session_execute};
use crate::ident::QualifiedName;
use crate::row::decode_dead_letter;
use crate::schema::{index, index_hint};
use crate::sql::{
    age_micros, before, bounded_delete, by_key, chunk_rows, id_list, limit_param, purge_hints,
    unix_us, Binder, Param, Stmt, DELETE_BATCH, NOW, UNDELIVERED,
};
use crate::store::MssqlOutbox;

/// Requeue or discard: the core's, named here for the statement builders.
pub(crate) use outbox_core::backend::DeadChange;

// ---- Statements ----------------------------------------------------------------

/// The dead-letter filter's clauses (only those set), appended to `WHERE dead_at IS
/// NOT NULL`. An empty id list matches nothing.
fn dead_filter(b: &mut Binder, filter: &DeadLetterFilter) -> String {
    let mut clauses = String::new();
    if let Some(destination) = filter.destination() {
        let p = b.bind(Param::Text(Some(destination.to_owned())));
        clauses.push_str(&format!(" AND destination = {p}"));
    }
    if let Some(age) = filter.dead_for() {
        let p = b.bind(Param::I64(age_micros(age)));
        clauses.push_str(&format!(" AND dead_at <= {}", before(&p)));
    }
    if let Some(ids) = filter.ids() {
        if ids.is_empty() {
            clauses.push_str(" AND 1 = 0");
        } else {
            // Up to MAX_ADMIN_BATCH ids: one JSON array of hex strings, not one
            // parameter each (SQL Server 2016+, compatibility level 130).
            let hex: Vec<String> = ids
                .iter()
                .map(|id| id.as_uuid().simple().to_string())
                .collect();
            let p = b.bind(Param::Text(Some(serde_json::Value::from(hex).to_string())));
            clauses.push_str(&format!(
                " AND id IN (SELECT CONVERT(binary(16), [value], 2) FROM OPENJSON({p}))"
            ));
        }
    }
    clauses
}

/// A page of dead letters.
pub(crate) fn dead_letters(
    t: &QualifiedName,
    filter: &DeadLetterFilter,
    order: DeadLetterOrder,
    limit: usize,
    after_id: Option<[u8; 16]>,
) -> Stmt {
    let mut b = Binder::default();
    let top = b.bind(Param::I64(limit_param(limit)));
    let clauses = dead_filter(&mut b, filter);
    let (cmp, direction) = match order {
        DeadLetterOrder::Ascending => (">", ""),
        DeadLetterOrder::Descending => ("<", " DESC"),
    };
    let cursor = match after_id {
        Some(id) => format!(" AND id {cmp} {}", b.bind_id(id)),
        None => String::new(),
    };
    let sql = format!(
        "SELECT TOP ({top}) id, destination, partition_key, payload, content_type, headers, \
         {created} AS created_us, attempts, last_error, {dead} AS dead_us \
         FROM {t} WHERE dead_at IS NOT NULL{clauses}{cursor} ORDER BY id{direction};",
        created = unix_us("created_at"),
        dead = unix_us("dead_at"),
    );
    b.finish(sql)
}

/// How many dead letters match.
pub(crate) fn count_dead(t: &QualifiedName, filter: &DeadLetterFilter) -> Stmt {
    let mut b = Binder::default();
    let clauses = dead_filter(&mut b, filter);
    b.finish(format!(
        "SELECT COUNT_BIG(*) AS n FROM {t} WHERE dead_at IS NOT NULL{clauses};"
    ))
}

/// `UPDATE <alias> SET ...` or `DELETE FROM <alias>`: the change, on a target named by
/// alias (a CTE, or a `FROM` occurrence that carries the hints; SQL Server refuses
/// index hints on the target itself).
fn dead_change_head(change: DeadChange, alias: &str) -> String {
    match change {
        DeadChange::Requeue => format!(
            // Requeued whole: a dispatched time another tool wrote on a dead letter
            // would keep it out of every claim and count.
            "UPDATE {alias} SET dead_at = NULL, dispatched_at = NULL, attempts = 0, \
             available_at = {NOW}, lease_token = NULL"
        ),
        DeadChange::Discard => format!("DELETE FROM {alias}"),
    }
}

/// Requeue or discard dead letters among `ids` (a chunk): the target is the alias of
/// a `FROM` occurrence pinned to the primary key.
pub(crate) fn change_dead_ids(t: &QualifiedName, change: DeadChange, ids: &[[u8; 16]]) -> Stmt {
    let mut b = Binder::default();
    let list = id_list(&mut b, ids);
    let head = dead_change_head(change, "x");
    b.finish(format!(
        "{head} FROM {t} AS x {hints} WHERE x.dead_at IS NOT NULL AND x.id IN ({list});",
        hints = by_key(t),
    ))
}

/// Requeue or discard up to `limit` (at most [`DELETE_BATCH`]) dead letters matching
/// `filter`, lowest id first, skipping rows locked elsewhere. The read is pinned to
/// `<table>_dead`, whose id order it walks (a scan of that index, not a seek: the
/// filter has no bound on `id`).
pub(crate) fn change_dead_matching(
    t: &QualifiedName,
    change: DeadChange,
    filter: &DeadLetterFilter,
    limit: usize,
) -> Stmt {
    let mut b = Binder::default();
    let top = b.bind(Param::I64(limit_param(limit.min(DELETE_BATCH))));
    let clauses = dead_filter(&mut b, filter);
    let head = dead_change_head(change, "picked");
    b.finish(format!(
        "WITH picked AS (SELECT TOP ({top}) * FROM {t} WITH ({dead}, {UPDATE_LOCKS}) \
         WHERE dead_at IS NOT NULL{clauses} ORDER BY id) {head};",
        dead = index_hint(t, index::DEAD),
    ))
}

/// Delete up to `limit` (at most [`DELETE_BATCH`]) rows dispatched more than `age_us`
/// ago.
pub(crate) fn purge_dispatched(t: &QualifiedName, age_us: i64, limit: usize) -> Stmt {
    let mut b = Binder::default();
    let top = b.bind(Param::I64(limit_param(limit.min(DELETE_BATCH))));
    let age = b.bind(Param::I64(age_us));
    let predicate = format!(
        "x.dispatched_at IS NOT NULL AND x.dispatched_at < {}",
        before(&age)
    );
    let hints = purge_hints(t, index::DISPATCHED);
    b.finish(bounded_delete(t, &top, &hints, &predicate))
}

/// How many rows a purge with this age would delete in all.
pub(crate) fn count_dispatched(t: &QualifiedName, age_us: i64) -> Stmt {
    let mut b = Binder::default();
    let age = b.bind(Param::I64(age_us));
    b.finish(format!(
        "SELECT COUNT_BIG(*) AS n FROM {t} \
         WHERE dispatched_at IS NOT NULL AND dispatched_at < {cutoff};",
        cutoff = before(&age),
    ))
}

/// The hints of `stats`' reads: pinned to the filtered index that covers the count, a
/// locking read (whatever `READ_COMMITTED_SNAPSHOT` says) that skips locked rows, at
/// row granularity (`READPAST` does not skip page locks).
fn stats_hints(t: &QualifiedName, suffix: &str) -> String {
    format!(
        "WITH ({}, READCOMMITTEDLOCK, READPAST, ROWLOCK)",
        index_hint(t, suffix)
    )
}

/// The counts of `OutboxStats`, in one statement. Each count reads one filtered index
/// that covers it (`<table>_due` includes `lease_token` and `created_at`), so no row is
/// looked up in the table, and reads past locked rows: it never waits behind an open
/// enqueue or a claim. The counts are therefore a moment's view without the rows other
/// transactions hold at that moment (uncommitted enqueues, rows being claimed or
/// settled).
pub(crate) fn stats(t: &QualifiedName) -> Stmt {
    Stmt::text(format!(
        "SELECT \
         COUNT_BIG(CASE WHEN lease_token IS NULL OR available_at <= {NOW} THEN 1 END) AS pending, \
         COUNT_BIG(CASE WHEN lease_token IS NOT NULL AND available_at > {NOW} THEN 1 END) \
         AS in_flight, \
         DATEDIFF_BIG(MICROSECOND, MIN(created_at), {NOW}) AS oldest_us, \
         (SELECT COUNT_BIG(*) FROM {t} {dead} WHERE dead_at IS NOT NULL) AS dead, \
         (SELECT COUNT_BIG(*) FROM {t} {dispatched} WHERE dispatched_at IS NOT NULL) \
         AS dispatched \
         FROM {t} {due} WHERE {UNDELIVERED};",
        dead = stats_hints(t, index::DEAD),
        dispatched = stats_hints(t, index::DISPATCHED),
        due = stats_hints(t, index::DUE),
    ))
}

/// The numbers of permission errors (`VIEW DATABASE STATE` or `VIEW DATABASE
/// PERFORMANCE STATE` missing): 297 (no permission for the action), 300 (a permission
/// denied on an object), 229 (a permission denied on an object, older wording).
pub(crate) const PERMISSION_DENIED: [u32; 3] = [297, 300, 229];

/// `stats` without counting the kept history: dead letters and dispatched rows are
/// the row counts of the filtered indexes `<table>_dead` and `<table>_dispatched` in
/// `sys.dm_db_partition_stats` (no row read, no lock taken; they include rows of
/// transactions not yet committed); the undelivered counts read `<table>_due` as
/// [`stats`] does. Needs `VIEW DATABASE STATE` (`VIEW DATABASE PERFORMANCE STATE` on
/// SQL Server 2022 and Azure SQL).
pub(crate) fn stats_by_index_size(t: &QualifiedName) -> Stmt {
    let mut b = Binder::default();
    let table = b.bind(Param::Text(Some(t.to_string())));
    let mut size = |suffix: &str| {
        let index = b.bind(Param::Text(Some(t.derived(suffix))));
        format!(
            "ISNULL((SELECT SUM(ps.row_count) FROM sys.dm_db_partition_stats AS ps \
             INNER JOIN sys.indexes AS i ON i.object_id = ps.object_id AND i.index_id = ps.index_id \
             WHERE ps.object_id = OBJECT_ID({table}) AND i.name = {index}), 0)"
        )
    };
    let dead = size(index::DEAD);
    let dispatched = size(index::DISPATCHED);
    b.finish(format!(
        "SELECT \
         COUNT_BIG(CASE WHEN lease_token IS NULL OR available_at <= {NOW} THEN 1 END) AS pending, \
         COUNT_BIG(CASE WHEN lease_token IS NOT NULL AND available_at > {NOW} THEN 1 END) \
         AS in_flight, \
         DATEDIFF_BIG(MICROSECOND, MIN(created_at), {NOW}) AS oldest_us, \
         {dead} AS dead, {dispatched} AS dispatched \
         FROM {t} {due} WHERE {UNDELIVERED};",
        due = stats_hints(t, index::DUE),
    ))
}

// ---- The trait ------------------------------------------------------------------

impl MssqlOutbox {
    /// Requeue or discard the selected dead letters; returns how many changed.
    async fn change_dead(
        &self,
        change: DeadChange,
        selection: &DeadLetterSelection,
    ) -> Result<u64> {
        let Some(target) = dead_target(selection)? else {
            return Ok(0);
        };
        let what = change.what();
        let name = self.qualified_name();
        let mut client = self.client(what).await?;
        let mut changed = 0;
        let batch = self.statement_rows();
        match target {
            DeadTarget::Ids(ids) => {
                // In id order (as `dead_target` gives them), like the settles, so
                // overlapping calls lock rows in one order.
                let ids: Vec<[u8; 16]> = ids.iter().map(|id| *id.as_uuid().as_bytes()).collect();
                for chunk in ids.chunks(chunk_rows(1, 0).min(batch)) {
                    changed +=
                        session_execute(&mut client, what, change_dead_ids(name, change, chunk))
                            .await?;
                }
            }
            DeadTarget::Matching { filter, limit } => {
                let limit = u64::try_from(limit).unwrap_or(u64::MAX);
                while changed < limit {
                    let step = usize::try_from(limit - changed).unwrap_or(batch).min(batch);
                    let done = session_execute(
                        &mut client,
                        what,
                        change_dead_matching(name, change, filter, step),
                    )
                    .await?;
                    changed += done;
                    if done < step as u64 {
                        break;
                    }
                }
            }
        }
        Ok(changed)
    }
}

#[async_trait]
impl OutboxAdmin for MssqlOutbox {
    /// As the trait says, read without waiting: undelivered rows other transactions
    /// hold at that moment (uncommitted enqueues, rows being claimed or settled) are not
    /// counted. Dead letters and dispatched rows are the sizes of their indexes where
    /// the login may read `sys.dm_db_partition_stats` (kept
    /// history is not read every call); without that permission (logged once) they are
    /// counted, at a cost that grows with the kept history.
    async fn stats(&self) -> Result<OutboxStats> {
        let what = "stats";
        let mut rows = None;
        if !self.stats_by_scan() {
            let mut session = self.client(what).await?;
            let limit = session.statement_timeout();
            let stmt = stats_by_index_size(self.qualified_name());
            rows = guarded(&mut session, what, limit, |c| {
                Box::pin(async move {
                    match query_rows(c, stmt).await {
                        Ok(rows) => Ok(Some(rows)),
                        Err(e) if has_number(&e, &PERMISSION_DENIED) => Ok(None),
                        Err(e) => Err(e),
                    }
                })
            })
            .await?;
            if rows.is_none() {
                tracing::warn!(
                    table = %self.qualified_name(),
                    "stats cannot read sys.dm_db_partition_stats (grant VIEW DATABASE STATE, \
                     or VIEW DATABASE PERFORMANCE STATE on SQL Server 2022): dead letters and \
                     dispatched rows are counted instead, reading all kept history"
                );
                self.count_stats_by_scan();
            }
        }
        let rows = match rows {
            Some(rows) => rows,
            None => self.rows(what, stats(self.qualified_name())).await?,
        };
        let row = rows
            .first()
            .ok_or_else(|| crate::error::decode_error("stats returned no row"))?;
        let oldest = row_opt_i64(row, "oldest_us")?
            .map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)));
        Ok(OutboxStats::new(
            row_count(row, "pending")?,
            row_count(row, "in_flight")?,
            row_count(row, "dead")?,
            row_count(row, "dispatched")?,
            oldest,
        ))
    }

    async fn dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>> {
        let after = page.after_id().map(|id| *id.as_uuid().as_bytes());
        let stmt = dead_letters(
            self.qualified_name(),
            page.filter(),
            page.order(),
            page.limit(),
            after,
        );
        let rows = self.rows("list dead letters", stmt).await?;
        rows.iter().map(decode_dead_letter).collect()
    }

    async fn count_dead(&self, filter: &DeadLetterFilter) -> Result<u64> {
        let rows = self
            .rows(
                "count dead letters",
                count_dead(self.qualified_name(), filter),
            )
            .await?;
        rows.first().map_or(Ok(0), |row| row_count(row, "n"))
    }

    async fn requeue_dead(&self, selection: &DeadLetterSelection) -> Result<u64> {
        self.change_dead(DeadChange::Requeue, selection).await
    }

    async fn discard_dead(&self, selection: &DeadLetterSelection) -> Result<u64> {
        self.change_dead(DeadChange::Discard, selection).await
    }

    /// As the trait says; a `limit` above
    /// [`MAX_ADMIN_BATCH`](outbox_core::admin::MAX_ADMIN_BATCH) is taken as that
    /// ([`purge_limit`]), and rows are deleted in statements of at most 2,000 rows (900
    /// where the table's lock escalation is on).
    async fn purge_dispatched(&self, older_than: Duration, limit: usize) -> Result<u64> {
        let Some(limit) = purge_limit(limit, self.config().retention()) else {
            return Ok(0);
        };
        let what = "purge dispatched";
        let limit = limit as u64;
        let age = age_micros(older_than);
        let mut client = self.client(what).await?;
        let mut purged = 0;
        let batch = self.statement_rows();
        while purged < limit {
            let step = usize::try_from(limit - purged).unwrap_or(batch).min(batch);
            let done = session_execute(
                &mut client,
                what,
                purge_dispatched(self.qualified_name(), age, step),
            )
            .await?;
            purged += done;
            if done < step as u64 {
                break;
            }
        }
        Ok(purged)
    }

    async fn count_dispatched(&self, older_than: Duration) -> Result<u64> {
        if self.config().retention() == Retention::Delete {
            return Ok(0);
        }
        let stmt = count_dispatched(self.qualified_name(), age_micros(older_than));
        let rows = self.rows("count dispatched", stmt).await?;
        rows.first().map_or(Ok(0), |row| row_count(row, "n"))
    }
}
