//! [`MySqlOutbox`]: enqueue in the caller's transaction, and the [`OutboxStore`] relays
//! claim from.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::NaiveDateTime;
use sqlx::mysql::{MySqlPoolOptions, MySqlRow};
use sqlx::{Executor, MySqlConnection, MySqlPool};
use uuid::Uuid;

type Query<'q> = outbox_sqlx::Query<'q, sqlx::MySql>;

use outbox_core::backend::settle_then_claim;
use outbox_core::backend::{check_enqueue, in_id_order, limit_param, micros, validate_lease};
use outbox_core::backend::{finish_claim, CommittedClaim, DecodedClaim};
use outbox_core::backend::{HeldBatches, HeldWhich};
use outbox_core::message::MAX_DELAY;
use outbox_core::{
    store::ClaimIds, store::ClaimRequest, store::Claimed, store::Disposition, store::Failure,
    store::Lease, store::LeaseToken, store::Renewed, store::Settled, store::SettledAndClaimed,
    store::Settlement, store::StoreCapabilities, ClaimMode, Error, MessageId, NewMessage,
    OutboxStore, Result,
};

use crate::config::{MySqlClaimConfig, MySqlOutboxConfig, QualifiedName};
use crate::error::{from_sqlx, number};
use crate::held::MySqlHeld;
use crate::held_sql::{held_registry, HeldStatements};
use crate::row::{decode_claimed, get};
use crate::schema;
use crate::sql::{json_hex, padded, with_ids, Statements};

/// The most messages one `INSERT` of an enqueue carries (7 parameters each).
const ENQUEUE_CHUNK: usize = 4096;

/// `verb` the savepoint of an enqueue of several statements (`chunked`).
async fn savepoint(conn: &mut MySqlConnection, chunked: bool, verb: &str) -> Result<()> {
    if chunked {
        let sql = format!("{verb} outbox_enqueue");
        conn.execute(&*sql).await.map_err(|e| from_sqlx(&sql, e))?;
    }
    Ok(())
}

/// A MySQL / MariaDB outbox: enqueue with [`enqueue`](Self::enqueue) inside your
/// transaction, hand the store to a [`Relay`](outbox_core::Relay) to publish, and to
/// operators as an [`OutboxAdmin`](outbox_core::OutboxAdmin).
///
/// Cheap to clone (pool handles and shared, prebuilt SQL).
///
/// # The claim protocol on InnoDB
///
/// Relay statements run on a pool of their own beside the one the outbox is made with
/// ([`relay_pool`](Self::relay_pool)), whose sessions are READ COMMITTED: locking reads
/// take no gap locks, and rows a claim reads but does not keep are unlocked at once.
///
/// 1. A claim is one short transaction: `SELECT ... FORCE INDEX (<table>_due) ...
///    ORDER BY due_at, seq LIMIT n FOR UPDATE SKIP LOCKED` (rows another claimer or
///    writer holds are skipped, never waited on), then one `UPDATE ... FORCE INDEX
///    (PRIMARY) WHERE id IN (...)` stamping `available_at = now + lease`, a fresh
///    `lease_token` and `attempts + 1` (saturating at
///    [`MAX_ATTEMPTS`](outbox_core::store::MAX_ATTEMPTS)), then commit. The row locks
///    last only for that transaction; the lease lives on in the row.
/// 2. Rows that do not make a deliverable message are dead-lettered at once, fenced by
///    the claim's token, with a `last_error` saying why.
/// 3. The relay publishes outside any transaction.
/// 4. Complete, fail, release and renew are each one transaction: `SELECT ... FORCE
///    INDEX (PRIMARY) WHERE id IN (...) ORDER BY id FOR UPDATE` locks the leases' rows
///    in id order, the rows whose token matches and that are undelivered are written by
///    primary key, the others are reported lost. Two overlapping batches lock their
///    shared rows in the same order, so they wait for each other instead of deadlocking.
/// 5. A crashed relay's rows become due when `available_at` (the lease expiry) passes.
///
/// With [`KeyOrder::PerKey`](outbox_core::KeyOrder::PerKey), a keyed row is claimable
/// only when no undelivered row of its key has a lower `seq` (one probe of
/// `<table>_key`); dead letters do not block their key. Requeueing a dead letter does
/// not restore its key's order around it (as on every backend).
///
/// Its limitations are in the [crate docs](crate#limitations).
#[derive(Clone)]
pub struct MySqlOutbox {
    pool: MySqlPool,
    relay: MySqlPool,
    inner: Arc<Inner>,
}

struct Inner {
    config: MySqlOutboxConfig,
    name: QualifiedName,
    sql: Statements,
    claims: MySqlClaimConfig,
    /// Present in [`ClaimMode::HeldLock`].
    held: Option<HeldBatches<MySqlHeld>>,
}

impl fmt::Debug for MySqlOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner
            .config
            .debug_store(f, "MySqlOutbox")
            .finish_non_exhaustive()
    }
}

/// What a settle writes on the rows whose lease held.
enum Write {
    Complete,
    Release,
    /// The new lease, µs.
    Renew(i64),
    /// The rows of [`Statements::fail`] ([`fail_rows`]).
    Fail(String),
}

/// The JSON array [`Statements::fail`] reads: `[id, token, error, dead, retry µs]` a
/// row, id and token in hex.
pub(crate) fn fail_rows<'a>(
    rows: impl Iterator<Item = (Uuid, LeaseToken, &'a str, bool, i64)>,
) -> String {
    let hex = |id: Uuid| id.simple().to_string();
    let rows = rows.map(|(id, token, error, dead, retry)| {
        serde_json::json!([hex(id), hex(token.as_uuid()), error, u8::from(dead), retry])
    });
    serde_json::Value::from(rows.collect::<Vec<_>>()).to_string()
}

/// [`fail_rows`] of `failures`: each one's disposition as a dead flag and a retry
/// delay (capped at [`MAX_DELAY`]).
pub(crate) fn failure_rows<'a>(failures: impl Iterator<Item = &'a Failure>) -> Result<String> {
    let mut rows = Vec::new();
    for f in failures {
        let (dead, after) = match f.disposition() {
            Disposition::Retry { after } => (false, after.min(MAX_DELAY)),
            Disposition::DeadLetter => (true, Duration::ZERO),
        };
        let lease = f.lease();
        let retry_us = micros("retry delay", after)?;
        rows.push((lease.id.as_uuid(), lease.token, f.error(), dead, retry_us));
    }
    Ok(fail_rows(rows.into_iter()))
}

/// [`MySqlOutbox::relay_pool`] of `pool`: session settings belong in its connect
/// options, as its `after_connect` hook is not copied.
pub(crate) fn read_committed(pool: &MySqlPool, max_connections: u32) -> MySqlPool {
    let options = pool.options();
    MySqlPoolOptions::new()
        .max_connections(max_connections)
        .min_connections(options.get_min_connections())
        .acquire_timeout(options.get_acquire_timeout())
        .idle_timeout(options.get_idle_timeout())
        .max_lifetime(options.get_max_lifetime())
        .test_before_acquire(options.get_test_before_acquire())
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .await?;
                Ok(())
            })
        })
        .connect_lazy_with((*pool.connect_options()).clone())
}

impl MySqlOutbox {
    /// An outbox on `pool` with `config`. Runs no SQL; call [`install`](Self::install)
    /// or apply [`ddl`](Self::ddl) with your migration tool first.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when `config` does not
    /// validate.
    pub fn new(pool: MySqlPool, config: MySqlOutboxConfig) -> Result<Self> {
        config.validate()?;
        let name = config.qualified_name()?;
        let sql = Statements::new(&name, &config);
        let relay = read_committed(&pool, pool.options().get_max_connections());
        let inner = Arc::new(Inner {
            config,
            name,
            sql,
            claims: MySqlClaimConfig::default(),
            held: None,
        });
        Ok(MySqlOutbox { pool, relay, inner })
    }

    /// This outbox with relays claiming as `claims` says (default: leases). With
    /// [`ClaimMode::HeldLock`] the held transactions get a pool of their own (opened on
    /// first use, `READ COMMITTED`, [`MySqlClaimConfig::held_connections`] connections);
    /// see [`MySqlClaimConfig::with_claim_mode`].
    #[must_use]
    pub fn with_claims(self, claims: MySqlClaimConfig) -> Self {
        let inner = &self.inner;
        let held = (claims.claim_mode() == ClaimMode::HeldLock).then(|| {
            let engine = MySqlHeld::new(
                read_committed(&self.pool, claims.held_connections()),
                self.relay.clone(),
                HeldStatements::new(&inner.name, &inner.config, &inner.sql),
                inner.config.limits().clone(),
            );
            HeldBatches::new(engine, claims.sweep_interval())
        });
        let inner = Arc::new(Inner {
            config: inner.config.clone(),
            name: inner.name.clone(),
            sql: Statements::new(&inner.name, &inner.config),
            claims,
            held,
        });
        MySqlOutbox {
            pool: self.pool,
            relay: self.relay,
            inner,
        }
    }

    /// How relays claim from this outbox.
    pub fn claims(&self) -> &MySqlClaimConfig {
        &self.inner.claims
    }

    /// Charge an attempt to the messages of held-lock batches whose relay ended without
    /// settling them (see [`ClaimMode::HeldLock`]); how many messages were charged.
    /// Held-lock claims sweep on their own; this is for tools and tests. Charges nothing
    /// in lease mode.
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
    pub fn held_pool(&self) -> Option<(&MySqlPool, usize)> {
        self.inner
            .held
            .as_ref()
            .map(|held| (held.engine().pool(), held.open_batches()))
    }

    /// The statistics statement: held-lock claims count registered batches in flight.
    pub(crate) fn stats_sql(&self) -> &str {
        match &self.inner.held {
            Some(held) => &held.engine().statements().stats,
            None => &self.inner.sql.stats,
        }
    }

    /// The pool this outbox was made with: installs, stats and dead-letter pages run on
    /// it.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The connections the relay's and the admin's writes run on: a pool beside
    /// [`pool`](Self::pool), opened on first use, copying its connect options, size,
    /// timeouts and lifetimes (not its `after_connect` hook, which sqlx does not
    /// expose), whose sessions are `READ COMMITTED`, so locking reads take no gap locks.
    pub fn relay_pool(&self) -> &MySqlPool {
        &self.relay
    }

    /// The settings.
    pub fn config(&self) -> &MySqlOutboxConfig {
        &self.inner.config
    }

    /// The table, validated; displays as `` `schema`.`table` ``, the name
    /// [`Schema::name`](outbox_core::schema::Schema::name) gives this outbox.
    pub fn qualified_name(&self) -> &QualifiedName {
        &self.inner.name
    }

    /// The idempotent DDL of this outbox's database, version table and table, for your
    /// migration tool (the default names' is checked in as `sql/outbox.sql`).
    pub fn ddl(&self) -> String {
        schema::ddl(&self.inner.name, &schema::outbox_objects(&self.inner.name))
    }

    /// Create the database, table and indexes if missing and record the layout version;
    /// safe from every process at start-up.
    ///
    /// # Errors
    /// [`ErrorKind::Schema`](outbox_core::ErrorKind::Schema) when the table exists at
    /// another layout version; mapped driver errors otherwise.
    pub async fn install(&self) -> Result<()> {
        let name = &self.inner.name;
        schema::install(&self.pool, name, &schema::outbox_objects(name)).await?;
        // Tables installed before held-lock claims existed lack the registry.
        sqlx::raw_sql(&held_registry(name))
            .execute(&self.pool)
            .await
            .map_err(|e| from_sqlx("schema install (held-lock registry)", e))?;
        Ok(())
    }

    /// The text of a relay or admin statement by name (held-lock statements prefixed
    /// `held_`, in that mode only), with room for `ids` ids: for the plan tests, which
    /// explain what the store sends.
    #[doc(hidden)]
    pub fn relay_sql(&self, statement: &str, ids: usize) -> Option<String> {
        let sql = &self.inner.sql;
        let text = match statement {
            "claim" => &sql.claim,
            "claim_ids" => &sql.claim_ids,
            "lease" => &sql.lease,
            "lock" => &sql.lock,
            "complete" => &sql.complete,
            "release" => &sql.release,
            "renew" => &sql.renew,
            "fail" => &sql.fail,
            "purge" => &sql.admin.purge_dispatched,
            "purge_delete" => &sql.purge_delete,
            "requeue_ids" => &sql.admin.requeue_ids,
            "requeue_matching" => &sql.admin.requeue_matching,
            "discard_ids" => &sql.admin.discard_ids,
            "discard_matching" => &sql.admin.discard_matching,
            "count_dead" => &sql.admin.count_dead,
            "count_dispatched" => &sql.admin.count_dispatched,
            held => {
                let held_sql = self.inner.held.as_ref()?.engine().statements();
                match held {
                    "held_claim" => &held_sql.claim,
                    "held_claim_ids" => &held_sql.claim_ids,
                    "held_claim_excluding" => &held_sql.claim_excluding,
                    "held_complete" => &held_sql.complete,
                    "held_fail" => &held_sql.fail,
                    "held_hold" => &held_sql.hold,
                    "held_unregister" => &held_sql.unregister,
                    "held_swept" => &held_sql.swept,
                    "held_free" => &held_sql.free,
                    "held_undelivered" => &held_sql.undelivered,
                    "held_charge" => &held_sql.charge,
                    "held_drop_batches" => &held_sql.drop_batches,
                    "held_keep" => &held_sql.keep,
                    "held_stats" => &held_sql.stats,
                    _ => return None,
                }
            }
        };
        Some(with_ids(text, ids))
    }

    /// Enqueue `messages` on `conn`, which should be inside your open transaction (pass
    /// `&mut *tx`). Never commits.
    ///
    /// - Every message is checked against the config's limits first; one bad message,
    ///   or an id given twice, rejects the batch before anything is sent.
    /// - The batch is one multi-row `INSERT` per 4,096 messages, in slice order (a longer
    ///   batch runs under a savepoint, `outbox_enqueue`). If an id is already stored,
    ///   InnoDB undoes the statement and the savepoint undoes the earlier ones (only
    ///   those: your transaction goes on), and the call fails with [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict)
    ///   naming the stored ids that your transaction can see.
    /// - `created_at` is the statement's `UTC_TIMESTAMP(6)`, and each message is due
    ///   `delay` after it.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) for a message
    /// over the limits; [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) for an
    /// id given twice or already stored (nothing written, the transaction usable);
    /// mapped driver errors otherwise.
    pub async fn enqueue(&self, conn: &mut MySqlConnection, messages: &[NewMessage]) -> Result<()> {
        check_enqueue(messages, self.inner.config.limits())?;
        if messages.is_empty() {
            return Ok(());
        }
        // 7 parameters a message, at most 65,535 a statement: longer batches are several
        // statements under a savepoint, so a refused batch still writes nothing.
        let chunked = messages.len() > ENQUEUE_CHUNK;
        savepoint(conn, chunked, "SAVEPOINT").await?;
        let row = "(?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)";
        let mut failed = None;
        for chunk in messages.chunks(ENQUEUE_CHUNK) {
            let sql = format!(
                "INSERT INTO {} (id, destination, partition_key, payload, content_type, \
                 headers, created_at, available_at) VALUES {}",
                self.inner.name,
                vec![row; chunk.len()].join(", ")
            );
            let mut query = sqlx::query(&sql);
            for m in chunk {
                query = query
                    .bind(m.id().as_uuid())
                    .bind(m.destination())
                    .bind(m.partition_key())
                    .bind(m.payload())
                    .bind(m.content_type())
                    .bind(m.headers().to_json())
                    .bind(micros("delay", m.delay())?);
            }
            if let Err(err) = query.execute(&mut *conn).await {
                failed = Some((chunk, err));
                break;
            }
        }
        let Some((messages, err)) = failed else {
            return savepoint(conn, chunked, "RELEASE SAVEPOINT").await;
        };
        savepoint(conn, chunked, "ROLLBACK TO SAVEPOINT").await?;
        if number(&err) != Some(1062) {
            return Err(from_sqlx("enqueue", err));
        }
        let ids: Vec<Uuid> = messages.iter().map(|m| m.id().as_uuid()).collect();
        let sql = with_ids(
            &format!("SELECT id FROM {} WHERE id IN ({{ids}})", self.inner.name),
            ids.len(),
        );
        let query = padded(&ids).fold(sqlx::query_scalar(&sql), |q, id| q.bind(id));
        let stored: Vec<Uuid> = query
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| from_sqlx("naming the stored ids", e))?;
        if stored.is_empty() {
            // Committed by a transaction this one cannot see yet.
            return Err(from_sqlx("enqueue", err));
        }
        Err(Error::already_stored(
            stored.into_iter().map(MessageId::from_uuid).collect(),
        ))
    }

    pub(crate) fn statements(&self) -> &Statements {
        &self.inner.sql
    }

    /// Claim: lock due rows (of `ids`, when given), stamp the lease, commit.
    async fn claim_with(&self, ids: &[Uuid], limit: usize, lease: Duration) -> Result<Claimed> {
        let err = |e| from_sqlx("claim", e);
        let token = LeaseToken::new();
        let sql = &self.inner.sql;
        let select = match ids {
            [] => sql.claim.clone(),
            ids => with_ids(&sql.claim_ids, ids.len()),
        };
        let query = sqlx::query(&select).bind(micros("lease", lease)?);
        let query = padded(ids).fold(query, |q, id| q.bind(id));
        let mut tx = self.relay.begin().await.map_err(err)?;
        let rows = query
            .bind(limit_param(limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        let Some(first) = rows.first() else {
            tx.rollback().await.map_err(err)?;
            return Ok(Claimed::default());
        };
        let expiry: NaiveDateTime = get(first, "lease_expires_at")?;
        let claimed = rows
            .iter()
            .map(|r| get(r, "id"))
            .collect::<Result<Vec<Uuid>>>()?;
        let stamp = with_ids(&sql.lease, claimed.len());
        let query = sqlx::query(&stamp).bind(expiry).bind(token.as_uuid());
        padded(&claimed)
            .fold(query, |q, id| q.bind(id))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        finish_claim(self, token, rows).await
    }

    /// Settle `leases`: lock their rows in id order, apply `write` to those whose lease
    /// holds, commit; the ids applied, with the expiry the lock statement computed.
    async fn settle(
        &self,
        what: &str,
        leases: Vec<&Lease>,
        write: Write,
    ) -> Result<Vec<(Uuid, NaiveDateTime)>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let err = |e| from_sqlx(what, e);
        let sql = &self.inner.sql;
        let ids: Vec<Uuid> = leases.iter().map(|l| l.id.as_uuid()).collect();
        let tokens: HashMap<Uuid, Uuid> = leases
            .iter()
            .map(|l| (l.id.as_uuid(), l.token.as_uuid()))
            .collect();
        let lease_us = if let Write::Renew(us) = write { us } else { 0 };
        let query = sqlx::query_as(&sql.lock)
            .bind(lease_us)
            .bind(json_hex(ids.iter().copied()));
        let mut tx = self.relay.begin().await.map_err(err)?;
        let rows: Vec<(Uuid, Option<Uuid>, bool, NaiveDateTime)> =
            query.fetch_all(&mut *tx).await.map_err(err)?;
        let applied: Vec<(Uuid, NaiveDateTime)> = rows
            .into_iter()
            .filter(|(id, token, undelivered, _)| {
                *undelivered && token.is_some() && tokens.get(id) == token.as_ref()
            })
            .map(|(id, _, _, expiry)| (id, expiry))
            .collect();
        if applied.is_empty() {
            // Roll back now: a dropped transaction is rolled back only when its
            // connection is next used, and until then it keeps the rows locked.
            tx.rollback().await.map_err(err)?;
            return Ok(applied);
        }
        let ids: Vec<Uuid> = applied.iter().map(|(id, _)| *id).collect();
        let text = match &write {
            Write::Complete => sql.complete.clone(),
            Write::Release => with_ids(&sql.release, ids.len()),
            Write::Renew(_) => with_ids(&sql.renew, ids.len()),
            Write::Fail(_) => sql.fail.clone(),
        };
        let by_ids = |q| padded(&ids).fold(q, |q: Query<'_>, id| q.bind(id));
        let query = match &write {
            Write::Fail(rows) => sqlx::query(&text).bind(rows),
            Write::Complete => sqlx::query(&text).bind(json_hex(ids.iter().copied())),
            Write::Renew(_) => by_ids(sqlx::query(&text).bind(applied[0].1)),
            _ => by_ids(sqlx::query(&text)),
        };
        query.execute(&mut *tx).await.map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(applied)
    }

    /// [`settle`](Self::settle) reported as [`Settled`].
    async fn settled(&self, what: &str, leases: &[Lease], write: Write) -> Result<Settled> {
        let applied = self
            .settle(what, in_id_order(leases, |l| l.id), write)
            .await?;
        Ok(Settled::reconcile(
            leases.iter().map(|l| l.id),
            applied.into_iter().map(|(id, _)| MessageId::from_uuid(id)),
        ))
    }
}

// The table, for tools such as the CLI.
outbox_core::backend::schema_from_inherent!(
    MySqlOutbox,
    name = |s| s.qualified_name().to_string(),
    version = crate::SCHEMA_VERSION
);

#[async_trait]
impl OutboxStore for MySqlOutbox {
    fn capabilities(&self) -> StoreCapabilities {
        let config = &self.inner.config;
        let claims = &self.inner.claims;
        StoreCapabilities::new(config.ordering(), config.retention())
            .with_lease_renewal(true)
            .with_claim_mode(claims.claim_mode())
            .with_batches_in_flight(
                self.inner
                    .held
                    .as_ref()
                    .map(|_| usize::try_from(claims.held_connections()).unwrap_or(usize::MAX)),
            )
    }

    async fn claim(&self, request: ClaimRequest) -> Result<Claimed> {
        if let Some(held) = &self.inner.held {
            return held
                .claim(HeldWhich::Due, request.limit(), request.lease())
                .await;
        }
        self.claim_with(&[], request.limit(), request.lease()).await
    }

    async fn claim_ids(&self, request: &ClaimIds) -> Result<Claimed> {
        let ids: Vec<Uuid> = request.ids().iter().map(MessageId::as_uuid).collect();
        if ids.is_empty() {
            return Ok(Claimed::default());
        }
        if let Some(held) = &self.inner.held {
            let which = HeldWhich::Ids(request.ids().to_vec());
            return held.claim(which, ids.len(), request.lease()).await;
        }
        self.claim_with(&ids, ids.len(), request.lease()).await
    }

    async fn complete(&self, leases: &[Lease]) -> Result<Settled> {
        if let Some(held) = &self.inner.held {
            return held.complete(leases).await;
        }
        self.settled("complete", leases, Write::Complete).await
    }

    async fn fail(&self, failures: &[Failure]) -> Result<Settled> {
        if let Some(held) = &self.inner.held {
            return held.fail(failures).await;
        }
        let leases: Vec<Lease> = failures.iter().map(|f| *f.lease()).collect();
        let write = Write::Fail(failure_rows(failures.iter())?);
        self.settled("fail", &leases, write).await
    }

    async fn release(&self, leases: &[Lease]) -> Result<Settled> {
        if let Some(held) = &self.inner.held {
            return held.release(leases).await;
        }
        self.settled("release", leases, Write::Release).await
    }

    /// In held-lock mode, [`HeldBatches::settle_and_claim`]; in lease mode, the trait's
    /// default.
    async fn settle_and_claim(
        &self,
        settlement: Settlement<'_>,
        next: ClaimRequest,
    ) -> Result<SettledAndClaimed> {
        match &self.inner.held {
            Some(held) => held.settle_and_claim(settlement, next).await,
            None => settle_then_claim(self, settlement, next).await,
        }
    }

    async fn renew(&self, leases: &[Lease], lease: Duration) -> Result<Renewed> {
        validate_lease(lease)?;
        if let Some(held) = &self.inner.held {
            return held.renew(leases, lease).await;
        }
        let write = Write::Renew(micros("lease", lease)?);
        let applied = self
            .settle("renew", in_id_order(leases, |l| l.id), write)
            .await?;
        let renewed = applied
            .into_iter()
            .map(|(id, at)| (MessageId::from_uuid(id), at.and_utc().into()));
        Ok(Renewed::reconcile(leases, renewed))
    }
}

/// Dead-lettering a claim's poison rows and giving back a claim that cannot be
/// returned, by primary key on the relay pool.
impl CommittedClaim for MySqlOutbox {
    type Row = MySqlRow;
    type Id = Uuid;

    fn row_id(row: &MySqlRow) -> Result<Uuid> {
        get(row, "id")
    }

    fn decode(&self, token: LeaseToken, rows: &[MySqlRow]) -> Result<DecodedClaim<Uuid>> {
        decode_claimed(rows, token, self.inner.config.limits())
    }

    async fn release_rows(&self, token: LeaseToken, ids: Vec<Uuid>) -> Result<()> {
        let sql = with_ids(&self.inner.sql.release_claim, ids.len());
        padded(&ids)
            .fold(sqlx::query(&sql).bind(token.as_uuid()), |q, id| q.bind(id))
            .execute(&self.relay)
            .await
            .map_err(|e| from_sqlx("releasing an undecodable claim", e))?;
        Ok(())
    }

    /// One statement: the fail statement, every row dead.
    async fn dead_letter_rows(
        &self,
        claim: LeaseToken,
        poison: Vec<(Uuid, String)>,
    ) -> Result<usize> {
        let rows = poison
            .iter()
            .map(|(id, why)| (*id, claim, why.as_str(), true, 0));
        let done = sqlx::query(&self.inner.sql.fail)
            .bind(fail_rows(rows))
            .execute(&self.relay)
            .await
            .map_err(|e| from_sqlx("dead-lettering undeliverable rows", e))?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(0))
    }
}
