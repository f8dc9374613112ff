//! [`PgOutbox`]: enqueue in the caller's transaction, and the [`OutboxStore`] relays
//! claim from.
//!
//! # The claim protocol on PostgreSQL
//!
//! 1. One statement selects due rows oldest first with `FOR UPDATE SKIP LOCKED` (rows
//!    another claimer or writer holds are skipped, never waited on), and updates them:
//!    `available_at = now() + lease`, a fresh `lease_token`, `attempts + 1`. It commits
//!    on its own, so the row lock lasts only for the statement; the lease lives on in
//!    the row.
//! 2. The relay publishes outside any transaction.
//! 3. Complete, fail and release are each one statement for the whole batch, matching
//!    `id`, `lease_token` and "not dispatched, not dead"; the ids they return are the
//!    leases applied, the rest are reported lost.
//! 4. A crashed relay's rows become due when `available_at` (the lease expiry) passes.
//!
//! With [`Ordering::PerKey`](outbox_core::Ordering::PerKey), a row with a partition key
//! is claimable only when no row with the same key and a lower `seq` is undelivered
//! (pending or in flight). Dead letters do not block their key, so one poison message
//! does not stall it; requeueing a dead letter puts it back in its original place.
//!
//! ## Limitations
//!
//! - "Enqueue order" is the order of `seq`, assigned when the row is inserted. Two
//!   transactions enqueueing the same key concurrently may commit in the other order; if
//!   the later `seq` commits first it can be published before the earlier one is visible.
//!   Serialise writers of one key (for example by the business row lock) if that matters.
//! - Rows that do not decode (such as `headers` that are not a JSON object of strings,
//!   written by hand) are dead-lettered by the claim that meets them, with a
//!   `last_error` saying why, so they cannot wedge a relay.
//! - [`stats`](OutboxStore::stats) is exact: pending, in-flight and dead counts read
//!   partial indexes, but the dispatched count grows with the history kept under
//!   [`Retention::Keep`].

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use outbox_core::store::{validate_lease, MAX_CLAIM_BATCH};
use outbox_core::{
    ClaimRequest, ClaimedMessage, Disposition, Error, Failure, Lease, LeaseToken, Message,
    MessageId, NewMessage, OutboxStats, OutboxStore, Result, Retention, Settled, StoreCapabilities,
};

use crate::config::PgOutboxConfig;
use crate::error::from_sqlx;
use crate::row::{decode_dead_letter, decode_error, decode_message, get, headers_json};
use crate::schema;
use crate::sql::Statements;

/// Longest `last_error` stored, in bytes.
const MAX_ERROR_LEN: usize = 8 * 1024;

/// A PostgreSQL outbox: enqueue with [`enqueue`](Self::enqueue) inside your
/// transaction, hand the store to a [`Relay`](outbox_core::Relay) to publish.
///
/// Cheap to clone (a pool handle and shared, prebuilt SQL).
#[derive(Clone)]
pub struct PgOutbox {
    pool: PgPool,
    inner: Arc<Inner>,
}

struct Inner {
    config: PgOutboxConfig,
    sql: Statements,
}

impl fmt::Debug for PgOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgOutbox")
            .field("table", &self.inner.config.qualified_table())
            .field("ordering", &self.inner.config.ordering_mode())
            .field("retention", &self.inner.config.retention_mode())
            .field("notify", &self.inner.config.notify_mode())
            .finish_non_exhaustive()
    }
}

impl PgOutbox {
    /// An outbox on `pool` with `config`. Runs no SQL; call [`install`](Self::install)
    /// or apply [`ddl`](Self::ddl) with your migration tool first.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when `config` does not
    /// validate.
    pub fn new(pool: PgPool, config: PgOutboxConfig) -> Result<Self> {
        config.validate()?;
        let sql = Statements::new(&config);
        Ok(PgOutbox {
            pool,
            inner: Arc::new(Inner { config, sql }),
        })
    }

    /// The pool this outbox claims with.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The settings.
    pub fn config(&self) -> &PgOutboxConfig {
        &self.inner.config
    }

    /// The DDL for this outbox's table (see [`schema::ddl`]).
    pub fn ddl(&self) -> String {
        schema::ddl(&self.inner.config)
    }

    /// The claim statement this store runs (`$1` limit, `$2` lease in microseconds,
    /// `$3` lease token), for `EXPLAIN` and for reviewing the SQL; identifiers are
    /// the config's, values are always bound.
    pub fn claim_statement(&self) -> &str {
        &self.inner.sql.claim
    }

    /// Create the schema, table and indexes if missing (see
    /// [`schema::install`]).
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists at
    /// another layout version; mapped driver errors otherwise.
    pub async fn install(&self) -> Result<()> {
        schema::install(&self.pool, &self.inner.config).await
    }

    /// Enqueue `messages` on `conn`, which should be inside your open transaction (pass
    /// `&mut *tx`). Never commits.
    ///
    /// - Every message is checked against the config's
    ///   [`MessageLimits`](outbox_core::MessageLimits) first; one bad message rejects the
    ///   batch and nothing is written.
    /// - The batch is one statement (one round trip), inserted in slice order, so
    ///   per-key order follows the slice.
    /// - Each message becomes due `delay` after the statement runs.
    /// - When notifying is on, the same statement issues `pg_notify`. PostgreSQL delivers
    ///   notifications only when the transaction commits and folds identical ones, so
    ///   listeners get at most one per transaction and none for a rollback.
    ///
    /// ```no_run
    /// # async fn demo(outbox: outbox_postgres::PgOutbox) -> outbox_core::Result<()> {
    /// use outbox_core::NewMessage;
    ///
    /// let mut tx = outbox.pool().begin().await.expect("begin");
    /// // ... business writes on &mut *tx ...
    /// let msg = NewMessage::builder("orders.created").payload(b"{}".to_vec()).build()?;
    /// outbox.enqueue(&mut *tx, &[msg]).await?;
    /// tx.commit().await.expect("commit");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) for a message
    /// over the limits or a delay too long to represent (nothing written);
    /// [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) for an id already stored;
    /// mapped driver errors otherwise. After an error the caller's transaction should
    /// be rolled back.
    pub async fn enqueue(&self, conn: &mut PgConnection, messages: &[NewMessage]) -> Result<()> {
        let limits = self.inner.config.message_limits();
        for msg in messages {
            limits.check(msg)?;
        }
        if messages.is_empty() {
            return Ok(());
        }
        let delays = messages
            .iter()
            .map(|m| micros("delay", m.delay()))
            .collect::<Result<Vec<_>>>()?;
        let ids: Vec<Uuid> = messages.iter().map(|m| m.id().as_uuid()).collect();
        let destinations: Vec<&str> = messages.iter().map(NewMessage::destination).collect();
        let keys: Vec<Option<&str>> = messages.iter().map(NewMessage::partition_key).collect();
        let payloads: Vec<&[u8]> = messages.iter().map(NewMessage::payload).collect();
        let content_types: Vec<Option<&str>> =
            messages.iter().map(NewMessage::content_type).collect();
        let headers: Vec<serde_json::Value> =
            messages.iter().map(|m| headers_json(m.headers())).collect();
        let mut query = sqlx::query(&self.inner.sql.enqueue)
            .bind(ids)
            .bind(destinations)
            .bind(keys)
            .bind(payloads)
            .bind(content_types)
            .bind(headers)
            .bind(delays);
        if let Some(channel) = self.inner.config.notify_channel() {
            query = query.bind(channel);
        }
        query
            .execute(conn)
            .await
            .map_err(|e| from_sqlx("enqueue", e))?;
        Ok(())
    }

    /// Enqueue one message; see [`enqueue`](Self::enqueue).
    ///
    /// # Errors
    /// As [`enqueue`](Self::enqueue).
    pub async fn enqueue_one(&self, conn: &mut PgConnection, message: &NewMessage) -> Result<()> {
        self.enqueue(conn, std::slice::from_ref(message)).await
    }

    async fn claim_with(
        &self,
        sql: &str,
        limit: usize,
        lease: Duration,
        ids: Option<Vec<Uuid>>,
    ) -> Result<Vec<ClaimedMessage>> {
        let token = LeaseToken::new();
        let mut query = sqlx::query(sql)
            .bind(count_param(limit)?)
            .bind(micros("lease", lease)?)
            .bind(token.as_uuid());
        if let Some(ids) = ids {
            query = query.bind(ids);
        }
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| from_sqlx("claim", e))?;
        let mut claimed = Vec::with_capacity(rows.len());
        let mut undecodable = Vec::new();
        for row in &rows {
            let due: (DateTime<Utc>, i64) = (get(row, "due_at")?, get(row, "seq")?);
            match decode_message(row)? {
                Ok(message) => {
                    let expires: DateTime<Utc> = get(row, "lease_expires_at")?;
                    let lease = Lease {
                        id: message.id,
                        token,
                        expires_at: SystemTime::from(expires),
                    };
                    claimed.push((due, ClaimedMessage { message, lease }));
                }
                Err((id, reason)) => undecodable.push((id, reason)),
            }
        }
        if !undecodable.is_empty() {
            self.dead_letter_undecodable(token, undecodable).await;
        }
        claimed.sort_by_key(|(due, _)| *due);
        Ok(claimed.into_iter().map(|(_, c)| c).collect())
    }

    /// Dead-letter rows this claim could not decode, fenced by its token. A failure is
    /// logged, not returned: the rows' leases then expire and a later claim tries again.
    async fn dead_letter_undecodable(&self, token: LeaseToken, rows: Vec<(Uuid, String)>) {
        let (ids, reasons): (Vec<Uuid>, Vec<String>) = rows.into_iter().unzip();
        tracing::warn!(
            ?ids,
            ?reasons,
            "dead-lettering outbox rows that do not decode"
        );
        let result = sqlx::query(&self.inner.sql.dead_letter_undecodable)
            .bind(&ids)
            .bind(reasons)
            .bind(token.as_uuid())
            .execute(&self.pool)
            .await;
        if let Err(e) = result {
            let err = from_sqlx("dead-lettering undecodable rows", e);
            tracing::error!(?ids, error = %err, "could not dead-letter undecodable rows");
        }
    }

    async fn settle(&self, what: &str, query: SettleQuery<'_>, ids: Vec<Uuid>) -> Result<Settled> {
        let applied: Vec<Uuid> = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| from_sqlx(what, e))?;
        Ok(Settled::reconcile(
            ids.into_iter().map(MessageId::from_uuid),
            applied.into_iter().map(MessageId::from_uuid),
        ))
    }

    fn lease_arrays(leases: impl Iterator<Item = Lease>) -> (Vec<Uuid>, Vec<Uuid>) {
        leases.map(|l| (l.id.as_uuid(), l.token.as_uuid())).unzip()
    }
}

type SettleQuery<'q> =
    sqlx::query::QueryScalar<'q, sqlx::Postgres, Uuid, sqlx::postgres::PgArguments>;

#[async_trait]
impl OutboxStore for PgOutbox {
    fn capabilities(&self) -> StoreCapabilities {
        let config = &self.inner.config;
        StoreCapabilities::new(config.ordering_mode(), config.retention_mode())
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Vec<ClaimedMessage>> {
        request.validate()?;
        self.claim_with(&self.inner.sql.claim, request.limit, request.lease, None)
            .await
    }

    async fn claim_ids(&self, ids: &[MessageId], lease: Duration) -> Result<Vec<ClaimedMessage>> {
        validate_lease(lease)?;
        if ids.len() > MAX_CLAIM_BATCH {
            return Err(Error::invalid_input(format!(
                "{} ids exceed the claim limit of {MAX_CLAIM_BATCH}",
                ids.len()
            )));
        }
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let uuids = ids.iter().map(MessageId::as_uuid).collect();
        self.claim_with(&self.inner.sql.claim_ids, ids.len(), lease, Some(uuids))
            .await
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Settled> {
        if leases.is_empty() {
            return Ok(Settled::default());
        }
        let (ids, tokens) = Self::lease_arrays(leases.iter().copied());
        let query = sqlx::query_scalar(&self.inner.sql.complete)
            .bind(ids.clone())
            .bind(tokens);
        self.settle("complete", query, ids).await
    }

    async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        if failures.is_empty() {
            return Ok(Settled::default());
        }
        let (ids, tokens) = Self::lease_arrays(failures.iter().map(|f| f.lease));
        let errors: Vec<String> = failures.iter().map(|f| clean_error(&f.error)).collect();
        let mut dead = Vec::with_capacity(failures.len());
        let mut retry_us = Vec::with_capacity(failures.len());
        for failure in failures {
            let (is_dead, after) = match failure.disposition {
                Disposition::Retry { after } => (false, after),
                Disposition::DeadLetter => (true, Duration::ZERO),
            };
            dead.push(is_dead);
            retry_us.push(micros("retry delay", after)?);
        }
        let query = sqlx::query_scalar(&self.inner.sql.fail)
            .bind(ids.clone())
            .bind(tokens)
            .bind(errors)
            .bind(dead)
            .bind(retry_us);
        self.settle("fail", query, ids).await
    }

    async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        if leases.is_empty() {
            return Ok(Settled::default());
        }
        let (ids, tokens) = Self::lease_arrays(leases.iter().copied());
        let query = sqlx::query_scalar(&self.inner.sql.release)
            .bind(ids.clone())
            .bind(tokens);
        self.settle("release", query, ids).await
    }

    async fn dead_letters(&self, after: Option<MessageId>, limit: usize) -> Result<Vec<Message>> {
        let rows = sqlx::query(&self.inner.sql.dead_letters)
            .bind(after.map(|id| id.as_uuid()))
            .bind(count_param(limit)?)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| from_sqlx("list dead letters", e))?;
        rows.iter().map(decode_dead_letter).collect()
    }

    async fn requeue_dead(&self, ids: &[MessageId]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Uuid> = ids.iter().map(MessageId::as_uuid).collect();
        let done = sqlx::query(&self.inner.sql.requeue_dead)
            .bind(ids)
            .execute(&self.pool)
            .await
            .map_err(|e| from_sqlx("requeue dead letters", e))?;
        Ok(done.rows_affected())
    }

    async fn purge_dispatched(&self, older_than: Duration, limit: usize) -> Result<u64> {
        let age = micros("purge age", older_than)?;
        let limit = count_param(limit)?;
        if self.inner.config.retention_mode() == Retention::Delete {
            return Ok(0);
        }
        let done = sqlx::query(&self.inner.sql.purge_dispatched)
            .bind(age)
            .bind(limit)
            .execute(&self.pool)
            .await
            .map_err(|e| from_sqlx("purge dispatched", e))?;
        Ok(done.rows_affected())
    }

    async fn stats(&self) -> Result<OutboxStats> {
        let row = sqlx::query(&self.inner.sql.stats)
            .fetch_one(&self.pool)
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
}

/// A duration as whole microseconds for binding.
fn micros(what: &str, d: Duration) -> Result<i64> {
    i64::try_from(d.as_micros())
        .map_err(|_| Error::invalid_input(format!("{what} of {d:?} is too long")))
}

/// A row count for binding as `LIMIT`.
fn count_param(n: usize) -> Result<i64> {
    i64::try_from(n).map_err(|_| Error::invalid_input(format!("limit {n} is too large")))
}

/// Text PostgreSQL accepts (no NUL), bounded in size.
fn clean_error(error: &str) -> String {
    let mut end = error.len().min(MAX_ERROR_LEN);
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    error[..end].replace('\0', "\u{fffd}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn durations_and_limits_bind_or_fail_typed() {
        assert_eq!(micros("x", Duration::from_millis(3)).unwrap(), 3000);
        assert_eq!(
            micros("x", Duration::MAX).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(count_param(5).unwrap(), 5);
    }

    #[test]
    fn errors_are_storable() {
        assert_eq!(clean_error("a\0b"), "a\u{fffd}b");
        let long = "é".repeat(MAX_ERROR_LEN);
        let cut = clean_error(&long);
        assert!(cut.len() <= MAX_ERROR_LEN && cut.chars().all(|c| c == 'é'));
    }
}
