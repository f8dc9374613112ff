//! [`PgOutbox`]: enqueue in the caller's transaction, and the [`OutboxStore`] relays
//! claim from.
//!
//! # The claim protocol on PostgreSQL
//!
//! 1. One statement selects due rows oldest first with `FOR UPDATE SKIP LOCKED` (rows
//!    another claimer or writer holds are skipped, never waited on), and updates them:
//!    `available_at = now() + lease`, a fresh `lease_token`, `attempts + 1`. It commits
//!    on its own, so the row lock lasts only for the statement; the lease lives on in
//!    the row. If the returned rows then cannot be decoded at all (a column of the
//!    wrong type), the claim releases every row holding its token (attempt undone, due
//!    at once) before returning the error.
//! 2. The relay publishes outside any transaction.
//! 3. Complete, fail and release are each one statement for the whole batch, matching
//!    `id`, `lease_token` and "not dispatched, not dead"; the ids they return are the
//!    leases applied, the rest are reported lost. Batches are bound in id order, so
//!    concurrent statements lock the rows they share in the same order and cannot
//!    deadlock on each other.
//! 4. A crashed relay's rows become due when `available_at` (the lease expiry) passes.
//!
//! With [`KeyOrder::PerKey`](outbox_core::KeyOrder::PerKey), a row with a partition key
//! is claimable only when no row with the same key and a lower `seq` is undelivered
//! (pending or in flight). Dead letters do not block their key, so one poison message
//! does not stall it.
//!
//! Requeueing a dead letter ([`requeue_dead`](OutboxStore::requeue_dead)) does **not**
//! restore the key's order around it. The row keeps its original `seq` and is due at
//! once, so it is claimable at once even if later messages of its key were already
//! delivered, or are in flight at that moment: then two messages of one key are in
//! flight together and may publish in either order. Undelivered messages of the key
//! with a higher `seq` wait for the requeued one again.
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
//! - **Per-key claims pay for blocked backlogs.** A claim walks due rows in
//!   `(available_at, seq)` order and checks each keyed candidate against the head of its
//!   key (one probe of the `<table>_key` partial index). Rows of a key whose head is in
//!   flight or backing off are due but not claimable, and every claim walks past all of
//!   them that come before the claimable rows: the cost grows with the blocked backlog,
//!   not with the batch. Measured on PostgreSQL 15 (2 shared cores): with 50,000 due
//!   rows of one key behind its in-flight head, plus 40 to 5,000 rows on other keys,
//!   after `ANALYZE`, a claim of up to 100 took 0.29-0.36 s (about 6 µs per blocked
//!   row), against 2 ms for a 100-row claim from 50,000 unblocked rows. A statement
//!   that skips blocked keys needs either a walk over every key (which makes the
//!   common many-keys case cost O(keys) per claim) or a schema change, so neither is
//!   done. Keep per-key backlogs short: dead-letter a stuck head rather than retrying
//!   it for long, and prefer many fine-grained keys to a few hot ones.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use outbox_core::store::{validate_lease, MAX_CLAIM_BATCH};
use outbox_core::{
    ClaimRequest, ClaimedMessage, Disposition, Error, Failure, Lease, LeaseToken, Message,
    MessageId, NewMessage, OutboxStats, OutboxStore, Result, Retention, Settled, StoreCapabilities,
};

use crate::config::PgOutboxConfig;
use crate::error::from_sqlx;
use crate::row::{
    decode_claimed, decode_dead_letter, decode_error, get, headers_json, DecodedClaim,
};
use crate::schema;
use crate::sql::{limit_param, micros, Statements};

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
    /// - Times come from the server's `now()`, which is the **start of your
    ///   transaction**, not of the statement or the commit: `created_at` is the
    ///   transaction's start, and each message is due `delay` after it. In a
    ///   transaction that ran longer than `delay`, the message is due the moment it
    ///   commits, and it is ordered among due messages by that start time.
    /// - Nothing is notified by default: relays in other processes find the message at
    ///   their next poll, and a relay in this process can be woken right after your
    ///   commit with [`Relay::wakeup`](outbox_core::Relay::wakeup).
    /// - With [`PgOutboxConfig::notify_on_commit`] (or a
    ///   [`NotifyMode::Channel`](crate::NotifyMode::Channel)), the same statement issues
    ///   `pg_notify`. PostgreSQL delivers notifications only when the transaction
    ///   commits and folds identical ones, so listeners get at most one per transaction
    ///   and none for a rollback. The price: PostgreSQL serialises the commits of all
    ///   notifying transactions on one cluster-wide lock (see
    ///   [`notify_on_commit`](PgOutboxConfig::notify_on_commit)).
    ///
    /// ```no_run
    /// # async fn demo(outbox: outbox_postgres::PgOutbox, relay: outbox_core::Relay) -> outbox_core::Result<()> {
    /// use outbox_core::NewMessage;
    ///
    /// let mut tx = outbox.pool().begin().await.expect("begin");
    /// // ... business writes on &mut *tx ...
    /// let msg = NewMessage::builder("orders.created").payload(b"{}".to_vec()).build()?;
    /// outbox.enqueue(&mut *tx, &[msg]).await?;
    /// tx.commit().await.expect("commit");
    /// // Committed: wake this process's relay now instead of at its next poll.
    /// relay.wakeup().wake();
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

    /// Run a settle statement that takes only `$1` ids and `$2` tokens (complete,
    /// release), bound sorted by id so overlapping batches lock rows in one order.
    async fn settle_leases(&self, what: &str, sql: &str, leases: &[Lease]) -> Result<Settled> {
        if leases.is_empty() {
            return Ok(Settled::default());
        }
        let (ids, tokens) = Self::lease_arrays(by_id(leases, |l| l.id).into_iter());
        let query = sqlx::query_scalar(sql).bind(ids).bind(tokens);
        self.settle(what, query, leases.iter().map(|l| l.id)).await
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
            .bind(limit_param(limit))
            .bind(micros("lease", lease)?)
            .bind(token.as_uuid());
        if let Some(ids) = ids {
            query = query.bind(ids);
        }
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| from_sqlx("claim", e))?;
        // The claim has committed: from here on, an error must give its rows back.
        match decode_claimed(&rows, token) {
            Ok(DecodedClaim {
                claimed,
                undecodable,
            }) => {
                if !undecodable.is_empty() {
                    self.dead_letter_undecodable(token, undecodable).await;
                }
                Ok(claimed)
            }
            Err(err) => {
                self.release_claim(token, rows.len(), &err).await;
                Err(err)
            }
        }
    }

    /// Undo a claim whose rows could not be returned (a column of the wrong type, say):
    /// every row holding `token` is released with its attempt given back, so the
    /// messages are due again at once instead of leased to nobody until the lease
    /// expires. A failure is logged, not returned: the leases then expire as after a
    /// crash.
    async fn release_claim(&self, token: LeaseToken, rows: usize, cause: &Error) {
        tracing::error!(
            rows, error = %cause,
            "claimed outbox rows could not be decoded; releasing the claim"
        );
        let result = sqlx::query(&self.inner.sql.release_claim)
            .bind(token.as_uuid())
            .execute(&self.pool)
            .await;
        if let Err(e) = result {
            let err = from_sqlx("releasing an undecodable claim", e);
            tracing::error!(
                rows, error = %err,
                "could not release the claim; its leases expire instead"
            );
        }
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

    /// Run a settle statement and report which of `requested` (in the caller's order)
    /// it applied.
    async fn settle(
        &self,
        what: &str,
        query: SettleQuery<'_>,
        requested: impl Iterator<Item = MessageId>,
    ) -> Result<Settled> {
        let applied: Vec<Uuid> = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| from_sqlx(what, e))?;
        Ok(Settled::reconcile(
            requested,
            applied.into_iter().map(MessageId::from_uuid),
        ))
    }

    /// Ids and tokens as parallel arrays, in the order given.
    fn lease_arrays<'a>(leases: impl Iterator<Item = &'a Lease>) -> (Vec<Uuid>, Vec<Uuid>) {
        leases.map(|l| (l.id.as_uuid(), l.token.as_uuid())).unzip()
    }
}

/// `items` in id order, the order every batch statement binds its rows in: statements
/// then lock the rows they share in the same order, so two concurrent batches (a
/// complete and a release of the same leases, say) wait for each other instead of
/// deadlocking.
fn by_id<T>(items: &[T], id: impl Fn(&T) -> MessageId) -> Vec<&T> {
    let mut sorted: Vec<&T> = items.iter().collect();
    sorted.sort_by_key(|item| id(item));
    sorted
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
        self.settle_leases("complete", &self.inner.sql.complete, leases)
            .await
    }

    async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        if failures.is_empty() {
            return Ok(Settled::default());
        }
        let ordered = by_id(failures, |f| f.lease.id);
        let (ids, tokens) = Self::lease_arrays(ordered.iter().map(|f| &f.lease));
        let errors: Vec<String> = ordered.iter().map(|f| clean_error(&f.error)).collect();
        let mut dead = Vec::with_capacity(ordered.len());
        let mut retry_us = Vec::with_capacity(ordered.len());
        for failure in &ordered {
            let (is_dead, after) = match failure.disposition {
                Disposition::Retry { after } => (false, after),
                Disposition::DeadLetter => (true, Duration::ZERO),
            };
            dead.push(is_dead);
            retry_us.push(micros("retry delay", after)?);
        }
        let query = sqlx::query_scalar(&self.inner.sql.fail)
            .bind(ids)
            .bind(tokens)
            .bind(errors)
            .bind(dead)
            .bind(retry_us);
        self.settle("fail", query, failures.iter().map(|f| f.lease.id))
            .await
    }

    async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        self.settle_leases("release", &self.inner.sql.release, leases)
            .await
    }

    async fn dead_letters(&self, after: Option<MessageId>, limit: usize) -> Result<Vec<Message>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(&self.inner.sql.dead_letters)
            .bind(after.map(|id| id.as_uuid()))
            .bind(limit_param(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| from_sqlx("list dead letters", e))?;
        rows.iter().map(decode_dead_letter).collect()
    }

    async fn requeue_dead(&self, ids: &[MessageId]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        // In id order, like the settle statements (see `by_id`).
        let mut ids: Vec<Uuid> = ids.iter().map(MessageId::as_uuid).collect();
        ids.sort_unstable();
        ids.dedup();
        let done = sqlx::query(&self.inner.sql.requeue_dead)
            .bind(ids)
            .execute(&self.pool)
            .await
            .map_err(|e| from_sqlx("requeue dead letters", e))?;
        Ok(done.rows_affected())
    }

    async fn purge_dispatched(&self, older_than: Duration, limit: usize) -> Result<u64> {
        if limit == 0 || self.inner.config.retention_mode() == Retention::Delete {
            return Ok(0);
        }
        // An age beyond what fits saturates; the statement then stops the cutoff at the
        // Unix epoch (rather than overflowing PostgreSQL's timestamp range).
        let age = micros("purge age", older_than).unwrap_or(i64::MAX);
        let done = sqlx::query(&self.inner.sql.purge_dispatched)
            .bind(age)
            .bind(limit_param(limit))
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

    #[test]
    fn batches_bind_in_id_order() {
        let ids: Vec<MessageId> = (0..50).map(|_| MessageId::new()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        let reversed: Vec<MessageId> = sorted.iter().rev().copied().collect();
        for input in [&ids, &reversed, &sorted] {
            let bound: Vec<MessageId> = by_id(input, |id| *id).into_iter().copied().collect();
            assert_eq!(bound, sorted);
        }
    }

    #[test]
    fn errors_are_storable() {
        assert_eq!(clean_error("a\0b"), "a\u{fffd}b");
        let long = "é".repeat(MAX_ERROR_LEN);
        let cut = clean_error(&long);
        assert!(cut.len() <= MAX_ERROR_LEN && cut.chars().all(|c| c == 'é'));
    }
}
