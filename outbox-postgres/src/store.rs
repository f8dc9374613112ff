//! [`PgOutbox`]: enqueue in the caller's transaction, and the [`OutboxStore`] relays
//! claim from.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use outbox_core::backend::{bounded_error, check_enqueue, in_id_order, validate_lease};
use outbox_core::backend::{finish_claim, release_claim, CommittedClaim, DecodedClaim};
use outbox_core::message::MAX_DELAY;
use outbox_core::{
    store::ClaimIds, store::ClaimRequest, store::Claimed, store::Disposition, store::Failure,
    store::Lease, store::LeaseToken, store::Renewed, store::Settled, store::SettledAndClaimed,
    store::Settlement, store::StoreCapabilities, ClaimMode, Error, Message, MessageId, NewMessage,
    OutboxStore, Result,
};
use sqlx::Row;

use crate::config::PgOutboxConfig;
use crate::connect;
use crate::error::from_sqlx;
use crate::held::PgHeld;
use crate::held_sql::HeldStatements;
use crate::ident::QualifiedName;
use crate::row::{decode_claimed, get};
use crate::schema;
use crate::sql::{limit_param, micros, Statements};
use outbox_core::backend::{HeldBatches, HeldWhich};

/// A PostgreSQL outbox: enqueue with [`enqueue`](Self::enqueue) inside your
/// transaction, hand the store to a [`Relay`](outbox_core::Relay) to publish, and to
/// operators as an [`OutboxAdmin`](outbox_core::OutboxAdmin).
///
/// Cheap to clone (a pool handle and shared, prebuilt SQL).
///
/// # The claim protocol on PostgreSQL
///
/// 1. One statement selects due rows oldest first with `FOR UPDATE SKIP LOCKED` (rows
///    another claimer or writer holds are skipped, never waited on), and updates them:
///    `available_at = now() + lease`, a fresh `lease_token`, `attempts + 1` (saturating
///    at [`MAX_ATTEMPTS`](outbox_core::store::MAX_ATTEMPTS)). It commits on its own, so
///    the row lock lasts only for the statement; the lease lives on in the row.
/// 2. Rows that do not make a deliverable message (see below) are dead-lettered at
///    once, fenced by the claim's token, with a `last_error` saying why; the others are
///    returned. If the rows cannot be read at all (a column of the wrong type), the
///    claim releases every row holding its token (attempt undone, due at once) before
///    returning the error.
/// 3. The relay publishes outside any transaction.
/// 4. Complete, fail and release are each one statement for the whole batch, matching
///    `id`, `lease_token` and "not dispatched, not dead", reaching rows by primary key,
///    prepared on the relay's connections ([`PgOutbox::relay_pool`]), whose planner
///    settings keep every plan on the index, so neither missing statistics nor a plan
///    cached while the table was small make them scan it; the ids they return are the leases
///    applied, the rest are reported lost. Batches are bound in id order, so concurrent
///    statements lock the rows they share in the same order and cannot deadlock on each
///    other.
/// 5. A crashed relay's rows become due when `available_at` (the lease expiry) passes.
///
/// With [`KeyOrder::PerKey`](outbox_core::KeyOrder::PerKey), a row with a partition key
/// is claimable only when no row with the same key and a lower `seq` is undelivered
/// (pending or in flight). Dead letters do not block their key, so one poison message
/// does not stall it.
///
/// Requeueing a dead letter
/// ([`requeue_dead`](outbox_core::OutboxAdmin::requeue_dead)) does **not** restore the
/// key's order around it. The row keeps its original `seq` and is due at once, so it is
/// claimable at once even if later messages of its key were already delivered, or are
/// in flight at that moment: then two messages of one key are in flight together and
/// may publish in either order. Undelivered messages of the key with a higher `seq`
/// wait for the requeued one again.
///
/// ## Poison rows
///
/// Other tools write to the table too (migrations, producers in other languages), so a
/// claim checks each row and dead-letters, instead of publishing, one whose headers are
/// not a JSON object of strings, whose `created_at` or `available_at` is outside
/// 0001-01-01..9999-12-31 UTC (`infinity`, say), whose attempts reached the limit, or
/// that breaks the config's [`MessageLimits`](outbox_core::MessageLimits) the way
/// [`enqueue`](Self::enqueue) would refuse it
/// ([`Message::check_stored`](outbox_core::Message::check_stored)).
///
/// ## Limitations
///
/// - "Enqueue order" is the order of `seq`, assigned when the row is inserted. Two
///   transactions enqueueing the same key concurrently may commit in the other order; if
///   the later `seq` commits first it can be published before the earlier one is visible.
///   Serialise writers of one key (for example by the business row lock) if that matters.
/// - [`stats`](outbox_core::OutboxAdmin::stats) is exact: pending, in-flight and dead
///   counts read partial indexes, but the dispatched count grows with the history kept
///   under [`Retention::Keep`](outbox_core::Retention::Keep).
/// - Per-key claims pay for blocked backlogs: a claim walks past every due row of a key
///   whose head is in flight or backing off; see
///   [Per-key order behind a stuck key](crate#per-key-order-behind-a-stuck-key) for the
///   figures and what to do.
/// - A row whose `available_at` another tool set centuries ahead, but inside the
///   decodable range, is a delayed message like any other: it is not due, and under
///   per-key order it holds its key back until it is. (Past the range, `infinity`
///   included, it is claimed at once and dead-lettered as above.)
#[derive(Clone)]
pub struct PgOutbox {
    pool: PgPool,
    /// The relay statements' own connections (see [`PgOutbox::relay_pool`]).
    relay: PgPool,
    inner: Arc<Inner>,
}

struct Inner {
    config: PgOutboxConfig,
    name: QualifiedName,
    sql: Statements,
    /// Present in [`ClaimMode::HeldLock`].
    held: Option<HeldBatches<PgHeld>>,
}

impl fmt::Debug for PgOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &self.inner.config;
        config
            .table_config()
            .debug_store(f, "PgOutbox")
            .field("notify", config.notify())
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
        let name = config.qualified_name()?;
        let sql = Statements::new(&name, &config);
        let relay = connect::relay_pool(&pool, config.relay_connections());
        let held = (config.claim_mode() == ClaimMode::HeldLock).then(|| {
            let engine = PgHeld::new(
                connect::relay_pool(&pool, config.held_connections()),
                relay.clone(),
                HeldStatements::new(&name, &config),
                config.limits().clone(),
            );
            HeldBatches::new(engine, config.sweep_interval())
        });
        Ok(PgOutbox {
            pool,
            relay,
            inner: Arc::new(Inner {
                config,
                name,
                sql,
                held,
            }),
        })
    }

    /// The pool this outbox was made with: installs and operator calls
    /// ([`OutboxAdmin`](outbox_core::OutboxAdmin)) run on it.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The connections the relay's statements run on (claims, settles, renewals),
    /// prepared once per connection: a pool of their own beside [`pool`](Self::pool),
    /// with its connect options, of at most
    /// [`PgOutboxConfig::relay_connections`], opened on first use. Each of its
    /// sessions prices out sequential and bitmap scans, hash and merge joins, sorts,
    /// materialisation and JIT, so that every plan of those statements, custom or
    /// generic, made on an empty table or a grown one without statistics, reaches rows
    /// through the intended index. Those settings stay on these connections; your own
    /// pool is untouched. (They need a server that accepts `SET` at session start:
    /// behind a pooler in transaction mode, give the outbox a direct connection.)
    pub fn relay_pool(&self) -> &PgPool {
        &self.relay
    }

    /// The settings.
    pub fn config(&self) -> &PgOutboxConfig {
        &self.inner.config
    }

    /// The table, validated; displays as `"schema"."table"`, the name
    /// [`Schema::name`](outbox_core::schema::Schema::name) gives this outbox.
    pub fn qualified_name(&self) -> &QualifiedName {
        &self.inner.name
    }

    /// The DDL for this outbox's table: idempotent statements creating the schema, the
    /// table and the indexes this configuration reads, and recording the layout
    /// version, for your migration tool. The `<table>_key` index is rendered only under
    /// [`KeyOrder::PerKey`](outbox_core::KeyOrder::PerKey), the one configuration that
    /// reads it. The default names' DDL is checked in as `sql/outbox.sql` (unordered)
    /// and `sql/outbox_per_key.sql`; see the crate README.
    pub fn ddl(&self) -> String {
        schema::outbox_ddl(&self.inner.name, self.inner.config.ordering())
    }

    /// Create the schema, table and indexes if missing, and record the layout version.
    /// Safe to call from every process at start-up.
    ///
    /// On a table already installed at this layout version, it creates the indexes of
    /// this configuration that are missing and changes nothing else: a per-key outbox
    /// adds `<table>_key` to a table an unordered one installed (building it while
    /// holding off writes to the table; the crate README says how to build it
    /// beforehand on a large table), and an unordered outbox leaves an existing
    /// `<table>_key` alone (drop it yourself if nothing claims in per-key order).
    /// Indexes present are looked up in the catalog, so an install that finds
    /// nothing to do takes no lock on the table.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists at
    /// another layout version, or one of its indexes is invalid (a failed
    /// `CREATE INDEX CONCURRENTLY`); mapped driver errors otherwise.
    pub async fn install(&self) -> Result<()> {
        let name = &self.inner.name;
        let ordering = self.inner.config.ordering();
        schema::install_with(
            &self.pool,
            name,
            &schema::outbox_objects(name, ordering),
            &schema::outbox_indexes(name, ordering),
        )
        .await?;
        // Tables installed before held-lock claims existed lack the registry.
        sqlx::raw_sql(&schema::held_registry(name))
            .execute(&self.pool)
            .await
            .map_err(|e| from_sqlx("schema install (held-lock registry)", e))?;
        Ok(())
    }

    /// Enqueue `messages` on `conn`, which should be inside your open transaction (pass
    /// `&mut *tx`). Never commits.
    ///
    /// - Every message is checked against the config's
    ///   [`MessageLimits`](outbox_core::MessageLimits) first (at once when built with the
    ///   same limits); one bad message, or an id given twice, rejects the batch before
    ///   anything is sent.
    /// - The batch is one statement (one round trip), inserted in slice order, so
    ///   per-key order follows the slice. If any id is already stored, the batch
    ///   writes nothing and the call fails with
    ///   [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) naming those ids,
    ///   **without** aborting your transaction: you may ignore it and commit the rest of
    ///   your work (a retried handler learns that way that its earlier attempt
    ///   committed). The statement skips stored ids (`ON CONFLICT DO NOTHING`), and a
    ///   second one takes back the rest of the batch, only in that case.
    /// - Times come from the server's `now()`, which is the **start of your
    ///   transaction**, not of the statement or the commit: `created_at` is the
    ///   transaction's start, and each message is due `delay` after it. In a
    ///   transaction that ran longer than `delay`, the message is due the moment it
    ///   commits, and it is ordered among due messages by that start time.
    /// - Nothing is notified by default: relays in other processes find the message at
    ///   their next poll, and a relay in this process can be woken right after your
    ///   commit with [`Relay::wakeup`](outbox_core::Relay::wakeup). With
    ///   [`Notify`](crate::Notify) turned on, the same statement issues `pg_notify`
    ///   (read [`Notify`](crate::Notify) for what that costs your commits).
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
    /// - [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) for a message
    ///   over the limits; [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) for
    ///   an id given twice in the batch. Nothing was sent: the transaction is usable.
    /// - [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) naming the ids
    ///   already stored. Nothing was written; the transaction is usable. An id that
    ///   another transaction is inserting at that moment makes the enqueue wait for
    ///   that transaction: if it commits, the id counts as stored; if it rolls back,
    ///   the enqueue goes on.
    /// - Under `REPEATABLE READ` or `SERIALIZABLE`, an id committed by another
    ///   transaction after yours took its snapshot cannot be skipped: PostgreSQL aborts
    ///   your transaction with a serialization failure
    ///   ([`ErrorKind::Contention`](outbox_core::ErrorKind::Contention), SQLSTATE
    ///   40001). Roll back and retry, as for any serialization failure.
    /// - Mapped driver errors otherwise; after them, roll the transaction back.
    pub async fn enqueue(&self, conn: &mut PgConnection, messages: &[NewMessage]) -> Result<()> {
        check_enqueue(messages, self.inner.config.limits())?;
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
            messages.iter().map(|m| m.headers().to_json()).collect();
        let mut query = sqlx::query_scalar(&self.inner.sql.enqueue)
            .bind(&ids)
            .bind(destinations)
            .bind(keys)
            .bind(payloads)
            .bind(content_types)
            .bind(headers)
            .bind(delays);
        if let Some(channel) = self.inner.config.notify_channel() {
            query = query.bind(channel);
        }
        let inserted: Vec<Uuid> = query
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| from_sqlx("enqueue", e))?;
        if inserted.len() == ids.len() {
            return Ok(());
        }
        // Some ids were stored already: take back the rows just inserted (only this
        // transaction can see them), so the batch writes nothing.
        if !inserted.is_empty() {
            sqlx::query(&self.inner.sql.unenqueue)
                .persistent(false)
                .bind(&inserted)
                .execute(&mut *conn)
                .await
                .map_err(|e| from_sqlx("taking back a partly enqueued batch", e))?;
        }
        let inserted: HashSet<Uuid> = inserted.into_iter().collect();
        let stored: Vec<MessageId> = ids
            .into_iter()
            .filter(|id| !inserted.contains(id))
            .map(MessageId::from_uuid)
            .collect();
        Err(Error::already_stored(stored))
    }

    /// Enqueue one message; see [`enqueue`](Self::enqueue).
    ///
    /// # Errors
    /// As [`enqueue`](Self::enqueue).
    pub async fn enqueue_one(&self, conn: &mut PgConnection, message: &NewMessage) -> Result<()> {
        self.enqueue(conn, std::slice::from_ref(message)).await
    }

    /// Store `messages`, which never were rows of this table, as dead letters: the
    /// log-tailing relay's refusals, listed, requeued and discarded here like any
    /// other. Each message's `last_error` is the reason and `attempts` its attempts;
    /// `created_at` is kept, and it is dead (and available) as of now. A message whose
    /// id is stored already is left as it is, so writing the same letters again adds
    /// nothing. One statement, in a transaction of its own. Returns how many were
    /// stored.
    ///
    /// # Errors
    /// Mapped driver errors: among them text PostgreSQL cannot hold (a NUL character
    /// in a destination, key, content type, header or error), which the caller must
    /// replace first. Nothing is stored then.
    pub async fn store_dead_letters(&self, messages: &[Message]) -> Result<u64> {
        if messages.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Uuid> = messages.iter().map(|m| m.id.as_uuid()).collect();
        let destinations: Vec<&str> = messages.iter().map(|m| m.destination.as_str()).collect();
        let keys: Vec<Option<&str>> = messages
            .iter()
            .map(|m| m.partition_key.as_deref())
            .collect();
        let payloads: Vec<&[u8]> = messages.iter().map(|m| m.payload.as_slice()).collect();
        let content_types: Vec<Option<&str>> =
            messages.iter().map(|m| m.content_type.as_deref()).collect();
        let headers: Vec<serde_json::Value> =
            messages.iter().map(|m| m.headers.to_json()).collect();
        let created: Vec<chrono::DateTime<chrono::Utc>> =
            messages.iter().map(|m| m.created_at.into()).collect();
        let attempts: Vec<i32> = messages
            .iter()
            .map(|m| i32::try_from(m.attempts).unwrap_or(i32::MAX))
            .collect();
        let errors: Vec<Option<String>> = messages
            .iter()
            .map(|m| m.last_error.clone().map(bounded_error))
            .collect();
        let stored = sqlx::query(&self.inner.sql.store_dead)
            .bind(ids)
            .bind(destinations)
            .bind(keys)
            .bind(payloads)
            .bind(content_types)
            .bind(headers)
            .bind(created)
            .bind(attempts)
            .bind(errors)
            .execute(&self.pool)
            .await
            .map_err(|e| from_sqlx("store dead letters", e))?;
        Ok(stored.rows_affected())
    }

    pub(crate) fn statements(&self) -> &Statements {
        &self.inner.sql
    }

    /// The statistics statement of this claim mode.
    pub(crate) fn stats_sql(&self) -> &str {
        match &self.inner.held {
            Some(held) => held.engine().stats_sql(),
            None => &self.inner.sql.stats,
        }
    }

    /// Charge an attempt to the messages of held-lock batches whose relay ended without
    /// settling them (see [`ClaimMode::HeldLock`]); how many messages were charged.
    /// Claims do this on their own (see
    /// [`PgOutboxConfig::with_sweep_interval`]); call it to do it now. Does nothing in
    /// lease mode.
    ///
    /// # Errors
    /// Mapped driver errors.
    pub async fn sweep_held(&self) -> Result<u64> {
        match &self.inner.held {
            Some(held) => held.sweep().await,
            None => Ok(0),
        }
    }

    /// The connections held-lock claims hold their transactions on (none are opened in
    /// lease mode), and how many batches are held open now.
    pub fn held_pool(&self) -> Option<(&PgPool, usize)> {
        self.inner
            .held
            .as_ref()
            .map(|held| (held.engine().pool(), held.open_batches()))
    }

    async fn claim_with(
        &self,
        sql: &str,
        limit: usize,
        lease: Duration,
        ids: Option<Vec<Uuid>>,
    ) -> Result<Claimed> {
        let token = LeaseToken::new();
        let mut query = sqlx::query(sql)
            .bind(limit_param(limit))
            .bind(micros("lease", lease)?)
            .bind(token.as_uuid());
        if let Some(ids) = ids {
            query = query.bind(ids);
        }
        let rows = query
            .fetch_all(&self.relay)
            .await
            .map_err(|e| from_sqlx("claim", e))?;
        self.claimed(token, rows).await
    }

    /// The messages of a committed claim's rows: poison rows dead-lettered, and every
    /// row released if they cannot be read at all.
    async fn claimed(&self, token: LeaseToken, rows: Vec<PgRow>) -> Result<Claimed> {
        finish_claim(self, token, rows).await
    }

    /// Run a settle statement that takes only `$1` ids and `$2` tokens (complete,
    /// release), bound in id order so overlapping batches lock rows in one order.
    async fn settle_leases(&self, what: &str, sql: &str, leases: &[Lease]) -> Result<Settled> {
        if leases.is_empty() {
            return Ok(Settled::default());
        }
        let (ids, tokens) = lease_arrays(in_id_order(leases, |l| l.id).into_iter());
        let query = sqlx::query_scalar(sql).bind(ids).bind(tokens);
        self.settle(what, query, leases.iter().map(|l| l.id)).await
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
            .fetch_all(&self.relay)
            .await
            .map_err(|e| from_sqlx(what, e))?;
        Ok(Settled::reconcile(
            requested,
            applied.into_iter().map(MessageId::from_uuid),
        ))
    }
}

type SettleQuery<'q> =
    sqlx::query::QueryScalar<'q, sqlx::Postgres, Uuid, sqlx::postgres::PgArguments>;

/// Ids and tokens as parallel arrays, in the order given.
fn lease_arrays<'a>(leases: impl Iterator<Item = &'a Lease>) -> (Vec<Uuid>, Vec<Uuid>) {
    leases.map(|l| (l.id.as_uuid(), l.token.as_uuid())).unzip()
}

/// Text PostgreSQL can store: `text` cannot hold NUL.
pub(crate) fn storable(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{fffd}")
    } else {
        text
    }
}

#[async_trait]
impl OutboxStore for PgOutbox {
    fn capabilities(&self) -> StoreCapabilities {
        let config = &self.inner.config;
        StoreCapabilities::new(config.ordering(), config.retention())
            .with_lease_renewal(true)
            .with_claim_mode(config.claim_mode())
            .with_batches_in_flight(
                self.inner
                    .held
                    .as_ref()
                    .map(|_| usize::try_from(config.held_connections()).unwrap_or(usize::MAX)),
            )
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Claimed> {
        if let Some(held) = &self.inner.held {
            return held
                .claim(HeldWhich::Due, request.limit(), request.lease())
                .await;
        }
        self.claim_with(
            &self.inner.sql.claim,
            request.limit(),
            request.lease(),
            None,
        )
        .await
    }

    async fn claim_ids(&self, request: &ClaimIds) -> Result<Claimed> {
        let ids = request.ids();
        if ids.is_empty() {
            return Ok(Claimed::default());
        }
        let uuids: Vec<Uuid> = ids.iter().map(MessageId::as_uuid).collect();
        if let Some(held) = &self.inner.held {
            return held
                .claim(HeldWhich::Ids(ids.to_vec()), ids.len(), request.lease())
                .await;
        }
        let sql = &self.inner.sql.claim_ids;
        self.claim_with(sql, ids.len(), request.lease(), Some(uuids))
            .await
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Settled> {
        if let Some(held) = &self.inner.held {
            return held.complete(leases).await;
        }
        self.settle_leases("complete", &self.inner.sql.complete, leases)
            .await
    }

    async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        if failures.is_empty() {
            return Ok(Settled::default());
        }
        if let Some(held) = &self.inner.held {
            return held.fail(failures).await;
        }
        let ordered = in_id_order(failures, |f| f.lease().id);
        let (ids, tokens) = lease_arrays(ordered.iter().map(|f| f.lease()));
        let errors: Vec<String> = ordered
            .iter()
            .map(|f| storable(f.error().to_owned()))
            .collect();
        let mut dead = Vec::with_capacity(ordered.len());
        let mut retry_us = Vec::with_capacity(ordered.len());
        for failure in &ordered {
            let (is_dead, after) = match failure.disposition() {
                // Beyond MAX_DELAY (ten years) a retry time could overflow the column.
                Disposition::Retry { after } => (false, after.min(MAX_DELAY)),
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
        self.settle("fail", query, failures.iter().map(|f| f.lease().id))
            .await
    }

    async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        if let Some(held) = &self.inner.held {
            return held.release(leases).await;
        }
        self.settle_leases("release", &self.inner.sql.release, leases)
            .await
    }

    /// Fails and releases (rare between batches) go first, as their own statements;
    /// then one prepared statement completes and claims, one round trip per batch. That
    /// statement locks the batch's rows `NOWAIT` before writing them: when another
    /// statement holds one, it is refused at once (`Contention`), and the relay settles
    /// on its own and claims as usual.
    async fn settle_and_claim(
        &self,
        settlement: Settlement<'_>,
        next: ClaimRequest,
    ) -> Result<SettledAndClaimed> {
        if let Some(held) = &self.inner.held {
            return held.settle_and_claim(settlement, next).await;
        }
        let failed = self.fail(settlement.fail).await?;
        let released = self.release(settlement.release).await?;
        let excluded: Vec<Uuid> = settlement.ids().map(|id| id.as_uuid()).collect();
        let (ids, tokens) = lease_arrays(in_id_order(settlement.complete, |l| l.id).into_iter());
        let token = LeaseToken::new();
        let rows = sqlx::query(&self.inner.sql.complete_and_claim)
            .bind(limit_param(next.limit()))
            .bind(micros("lease", next.lease())?)
            .bind(token.as_uuid())
            .bind(ids)
            .bind(tokens)
            .bind(excluded)
            .fetch_all(&self.relay)
            .await
            .map_err(|e| from_sqlx("complete and claim", e))?;
        // `completed` is on one row (NULL on the others); the claimed columns are NULL
        // on the one row returned when nothing was claimed.
        let mut completed: Result<Option<Vec<Uuid>>> = Ok(None);
        let mut claimed_rows = Vec::with_capacity(rows.len());
        for row in rows {
            match get::<Option<Vec<Uuid>>>(&row, "completed") {
                Ok(Some(ids)) => completed = completed.map(|_| Some(ids)),
                Ok(None) => {}
                Err(err) => completed = Err(err),
            }
            if row
                .try_get::<Option<Uuid>, _>("id")
                .ok()
                .flatten()
                .is_some()
            {
                claimed_rows.push(row);
            }
        }
        let completed = match completed.and_then(|ids| {
            ids.ok_or_else(|| {
                crate::row::decode_error("complete and claim returned no completed ids".to_owned())
            })
        }) {
            Ok(completed) => completed,
            Err(err) => {
                release_claim(self, token, &claimed_rows, &err).await;
                return Err(err);
            }
        };
        Ok(SettledAndClaimed {
            completed: Settled::reconcile(
                settlement.complete.iter().map(|l| l.id),
                completed.into_iter().map(MessageId::from_uuid),
            ),
            failed,
            released,
            claimed: self.claimed(token, claimed_rows).await,
        })
    }

    async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        validate_lease(lease)?;
        if leases.is_empty() {
            return Ok(Renewed::default());
        }
        if let Some(held) = &self.inner.held {
            return held.renew(leases, lease).await;
        }
        let ordered = in_id_order(leases, |l| l.id);
        let (ids, tokens) = lease_arrays(ordered.iter().copied());
        let rows: Vec<(Uuid, chrono::DateTime<chrono::Utc>)> =
            sqlx::query_as(&self.inner.sql.renew)
                .bind(ids)
                .bind(tokens)
                .bind(micros("lease", lease)?)
                .fetch_all(&self.relay)
                .await
                .map_err(|e| from_sqlx("renew", e))?;
        let renewed = rows
            .into_iter()
            .map(|(id, at)| (MessageId::from_uuid(id), at.into()));
        Ok(Renewed::reconcile(leases, renewed))
    }
}

/// The fenced writes after a claim, on the relay's connections.
impl CommittedClaim for PgOutbox {
    type Row = PgRow;
    type Id = Uuid;

    fn decode(&self, token: LeaseToken, rows: &[PgRow]) -> Result<DecodedClaim<Uuid>> {
        decode_claimed(rows, token, self.inner.config.limits())
    }

    fn row_id(row: &PgRow) -> Result<Uuid> {
        get(row, "id")
    }

    async fn dead_letter_rows(
        &self,
        token: LeaseToken,
        rows: Vec<(Uuid, String)>,
    ) -> Result<usize> {
        let (ids, reasons): (Vec<Uuid>, Vec<String>) = rows
            .into_iter()
            .map(|(id, reason)| (id, storable(reason)))
            .unzip();
        let done = sqlx::query(&self.inner.sql.dead_letter_claimed)
            .bind(&ids)
            .bind(reasons)
            .bind(token.as_uuid())
            .execute(&self.relay)
            .await
            .map_err(|e| from_sqlx("dead-lettering undeliverable rows", e))?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    async fn release_rows(&self, token: LeaseToken, ids: Vec<Uuid>) -> Result<()> {
        sqlx::query(&self.inner.sql.release_claim)
            .bind(token.as_uuid())
            .bind(ids)
            .execute(&self.relay)
            .await
            .map_err(|e| from_sqlx("releasing an undecodable claim", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_text_has_no_nul() {
        assert_eq!(storable("a\0b".to_owned()), "a\u{fffd}b");
        assert_eq!(storable("plain".to_owned()), "plain");
    }
}
