//! [`WalOutbox`]: enqueue as logical decoding messages, install the slot and the
//! publication, read the slot's state, write dead letters.

use std::time::SystemTime;

use outbox_core::backend::check_enqueue;
use outbox_core::backend::MessageParts;
use outbox_core::{Error, ErrorKind, ErrorStatus, Message, NewMessage, Result};
use outbox_postgres::PgOutbox;
use sqlx::{Arguments, Execute, PgConnection, PgPool, Postgres};

use pgwire_replication::Lsn;

use crate::codec;
use crate::config::WalOutboxConfig;
use crate::error::from_sqlx;

/// One statement per batch: each content becomes one transactional logical decoding
/// message, in array order (the function scan reads the array in order and the
/// aggregate consumes it as it comes).
const ENQUEUE: &str =
    "SELECT count(pg_logical_emit_message(true, $1, m))::int8 FROM unnest($2::bytea[]) AS t(m)";

/// One message, the common case, without the array: about 10 µs less of client and
/// server CPU per transaction than [`ENQUEUE`] (`wal_bench`'s enqueue scenario).
const ENQUEUE_ONE: &str = "SELECT pg_logical_emit_message(true, $1, $2)::text";

/// The table (in the dead letters' schema) where relays save each slot's confirmed
/// position.
pub const POSITIONS_TABLE: &str = "outbox_wal_positions";

/// The slot's row, with the lag computed by the server.
const SLOT_STATUS: &str = "SELECT plugin::text, database::text, active, wal_status, \
     (restart_lsn IS NULL) AS no_restart, \
     CASE WHEN pg_is_in_recovery() THEN NULL \
          ELSE (pg_current_wal_lsn() - confirmed_flush_lsn)::int8 END AS lag_bytes \
     FROM pg_replication_slots WHERE slot_name = $1";

/// `SLOT_STATUS`'s columns.
type SlotRow = (
    Option<String>,
    Option<String>,
    bool,
    Option<String>,
    bool,
    Option<i64>,
);

/// The log-tailing outbox: messages enqueued in the caller's transaction as
/// transactional logical decoding messages (`pg_logical_emit_message(true, prefix,
/// content)`), which the server writes to its log at no table's cost and hands to the
/// slot's reader only once that transaction commits.
///
/// Dead letters go to an `outbox-postgres` table ([`dead_letters`](Self::dead_letters)),
/// where `OutboxAdmin` lists, requeues and discards them as for the polling relay.
#[derive(Debug, Clone)]
pub struct WalOutbox {
    pool: PgPool,
    config: WalOutboxConfig,
    dead_letters: PgOutbox,
}

/// A replication slot's state as [`WalOutbox::slot_status`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SlotStatus {
    /// The slot's output plugin (`pgoutput` for slots this crate creates).
    pub plugin: Option<String>,
    /// The database the slot decodes.
    pub database: Option<String>,
    /// Whether a session streams from the slot now.
    pub active: bool,
    /// `pg_replication_slots.wal_status`: `reserved`, `extended`, `unreserved` or
    /// `lost`.
    pub wal_status: Option<String>,
    /// Bytes of log between the server's current position and the slot's confirmed
    /// position: what a relay still has to read. `None` on a standby.
    pub lag_bytes: Option<u64>,
    /// The slot can no longer serve changes: the server removed log it still needed
    /// (`max_slot_wal_keep_size` exceeded). Messages committed after its confirmed
    /// position are gone from the log; see the crate docs.
    pub invalidated: bool,
}

impl WalOutbox {
    /// An outbox on `pool`'s database.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for an invalid config.
    pub fn new(pool: PgPool, config: WalOutboxConfig) -> Result<Self> {
        config.validate()?;
        let dead_letters = PgOutbox::new(pool.clone(), config.dead_letters().clone())?;
        Ok(WalOutbox {
            pool,
            config,
            dead_letters,
        })
    }

    /// The config.
    pub fn config(&self) -> &WalOutboxConfig {
        &self.config
    }

    /// The pool statements run on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The `outbox-postgres` outbox holding the dead letters: list, requeue and discard
    /// them with its `OutboxAdmin`. A requeued dead letter becomes an ordinary row of
    /// that table, delivered by a polling relay (`outbox_core::Relay`) over it.
    pub fn dead_letters(&self) -> &PgOutbox {
        &self.dead_letters
    }

    /// Create what is missing: the dead-letter table (`PgOutbox::install`), the
    /// publication (empty: the relay reads no table changes) and the logical
    /// replication slot (plugin `pgoutput`). Safe to run again and from several
    /// processes at once.
    ///
    /// **Install before the first enqueue.** A slot sees only what is committed after
    /// it was created: messages enqueued before are never streamed.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) when the server's
    /// `wal_level` is not `logical`, or a slot of that name exists with another plugin
    /// or database; [`ErrorKind::Storage`](outbox_core::ErrorKind::Storage) when it is
    /// invalidated; mapped driver errors otherwise (the role needs `REPLICATION` and
    /// `CREATE` on the database).
    pub async fn install(&self) -> Result<()> {
        let wal_level: String = sqlx::query_scalar("SELECT current_setting('wal_level')")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| from_sqlx("read wal_level", e))?;
        if wal_level != "logical" {
            return Err(Error::config(format!(
                "the log-tailing outbox needs wal_level = logical (the server has {wal_level}); \
                 set it in postgresql.conf and restart the server"
            )));
        }
        self.dead_letters.install().await?;
        // Names validated and quoted, as above.
        // `system_identifier` and `slot_created_lsn` tie a row to the server and the
        // slot it was saved for (see `load_position`); added to tables of earlier
        // installs too.
        let positions = format!(
            "CREATE TABLE IF NOT EXISTS {t} (slot text PRIMARY KEY, confirmed_lsn pg_lsn NOT NULL, \
             updated_at timestamptz NOT NULL DEFAULT now()); \
             ALTER TABLE {t} ADD COLUMN IF NOT EXISTS system_identifier text, \
             ADD COLUMN IF NOT EXISTS slot_created_lsn pg_lsn",
            t = self.positions()
        );
        sqlx::raw_sql(&positions)
            .execute(&self.pool)
            .await
            .map_err(|e| from_sqlx("create the positions table", e))?;
        // The name is a validated identifier, quoted: it cannot change the statement.
        let create_publication = format!(
            "DO $$ BEGIN CREATE PUBLICATION \"{}\"; \
             EXCEPTION WHEN duplicate_object THEN NULL; END $$",
            self.config.publication()
        );
        sqlx::raw_sql(&create_publication)
            .execute(&self.pool)
            .await
            .map_err(|e| from_sqlx("create publication", e))?;
        if self.slot_status().await?.is_none() {
            let created: std::result::Result<String, _> = sqlx::query_scalar(
                "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
            )
            .bind(self.config.slot())
            .fetch_one(&self.pool)
            .await;
            match created {
                // A new slot starts where it was created: a position saved for an
                // earlier slot of that name means nothing for it.
                Ok(lsn) => self.reset_position(&lsn).await?,
                // Another installer created it between the check and here.
                Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42710") => {}
                Err(e) => return Err(from_sqlx("create replication slot", e)),
            }
        }
        self.check_slot().await.map(drop)
    }

    /// The slot's state, `None` when it does not exist.
    ///
    /// # Errors
    /// Mapped driver errors.
    pub async fn slot_status(&self) -> Result<Option<SlotStatus>> {
        let row: Option<SlotRow> = sqlx::query_as(SLOT_STATUS)
            .bind(self.config.slot())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| from_sqlx("read replication slot", e))?;
        Ok(row.map(
            |(plugin, database, active, wal_status, no_restart, lag)| SlotStatus {
                invalidated: no_restart || wal_status.as_deref() == Some("lost"),
                plugin,
                database,
                active,
                wal_status,
                lag_bytes: lag.map(|l| u64::try_from(l).unwrap_or(0)),
            },
        ))
    }

    /// The slot's state, or why a relay cannot stream from it: missing, another
    /// plugin, another database ([`ErrorKind::Config`]), or invalidated
    /// ([`ErrorKind::Storage`], permanent).
    pub(crate) async fn check_slot(&self) -> Result<SlotStatus> {
        let slot = self.config.slot();
        let status = self.slot_status().await?.ok_or_else(|| {
            Error::config(format!(
                "replication slot {slot:?} does not exist: run WalOutbox::install first"
            ))
        })?;
        if status.plugin.as_deref() != Some("pgoutput") {
            return Err(Error::config(format!(
                "replication slot {slot:?} uses plugin {:?}, not pgoutput",
                status.plugin
            )));
        }
        let database: String = sqlx::query_scalar("SELECT current_database()::text")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| from_sqlx("read current database", e))?;
        if status.database.as_deref() != Some(database.as_str()) {
            return Err(Error::config(format!(
                "replication slot {slot:?} decodes database {:?}, not {database:?}",
                status.database
            )));
        }
        if status.invalidated {
            return Err(invalidated(slot, status.wal_status.as_deref()));
        }
        Ok(status)
    }

    /// The table holding each slot's last confirmed position, beside the dead letters.
    fn positions(&self) -> outbox_postgres::QualifiedName {
        self.dead_letters.qualified_name().sibling(POSITIONS_TABLE)
    }

    /// The position a relay of this slot last saved, checked against the server: a
    /// row saved on another server (`pg_control_system().system_identifier`, e.g. a
    /// restored copy's table on a new cluster) or ahead of the server's current log
    /// position (a restore or failover to a server that has not written that far) is
    /// refused with a permanent [`ErrorKind::Storage`] error: resuming there would
    /// skip every message committed in between.
    pub(crate) async fn load_position(&self) -> Result<Option<Lsn>> {
        let sql = format!(
            "SELECT p.confirmed_lsn::text, p.system_identifier, s.system_identifier::text, \
             pg_current_wal_lsn()::text, p.confirmed_lsn > pg_current_wal_lsn() \
             FROM {} p, pg_control_system() s WHERE p.slot = $1",
            self.positions()
        );
        let row: Option<(String, Option<String>, String, String, bool)> = sqlx::query_as(&sql)
            .bind(self.config.slot())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| from_sqlx("read the saved position", e))?;
        let Some((saved, saved_system, system, current, ahead)) = row else {
            return Ok(None);
        };
        let slot = self.config.slot();
        let refuse = |why: String| {
            Error::new(
                ErrorKind::Storage,
                format!(
                    "the position saved for replication slot {slot:?} in {} ({saved}) {why}: \
                     resuming there could skip committed messages, so the relay refuses to. \
                     Reconcile what the slot may have missed, then delete that row",
                    self.positions()
                ),
            )
            .with_status(ErrorStatus::Permanent)
        };
        if saved_system.as_deref().is_some_and(|s| s != system) {
            return Err(refuse(format!(
                "was saved on another server (system identifier {}, this one {system})",
                saved_system.unwrap_or_default()
            )));
        }
        if ahead {
            return Err(refuse(format!(
                "is ahead of the server's current log position {current} (a restored or \
                 failed-over server?)"
            )));
        }
        Lsn::parse(&saved)
            .map(Some)
            .map_err(|e| Error::new(ErrorKind::Decode, format!("saved position {saved:?}: {e}")))
    }

    /// Save `lsn` as the slot's confirmed position (never moving it back).
    pub(crate) async fn save_position(&self, lsn: Lsn) -> Result<()> {
        if lsn == Lsn::ZERO {
            return Ok(());
        }
        let sql = format!(
            "INSERT INTO {t} (slot, confirmed_lsn, system_identifier) \
             SELECT $1, $2::pg_lsn, s.system_identifier::text FROM pg_control_system() s \
             ON CONFLICT (slot) DO UPDATE SET confirmed_lsn = greatest({t}.confirmed_lsn, excluded.confirmed_lsn), \
             system_identifier = excluded.system_identifier, updated_at = now()",
            t = self.positions()
        );
        sqlx::query(&sql)
            .bind(self.config.slot())
            .bind(lsn.to_pg_string())
            .execute(&self.pool)
            .await
            .map_err(|e| from_sqlx("save the confirmed position", e))?;
        Ok(())
    }

    /// Start the slot's saved position over at `created` (the slot's creation position,
    /// as `pg_lsn` text), on this server.
    async fn reset_position(&self, created: &str) -> Result<()> {
        let sql = format!(
            "INSERT INTO {t} (slot, confirmed_lsn, system_identifier, slot_created_lsn) \
             SELECT $1, $2::pg_lsn, s.system_identifier::text, $2::pg_lsn FROM pg_control_system() s \
             ON CONFLICT (slot) DO UPDATE SET confirmed_lsn = excluded.confirmed_lsn, \
             system_identifier = excluded.system_identifier, \
             slot_created_lsn = excluded.slot_created_lsn, updated_at = now()",
            t = self.positions()
        );
        sqlx::query(&sql)
            .bind(self.config.slot())
            .bind(created)
            .execute(&self.pool)
            .await
            .map_err(|e| from_sqlx("reset the saved position", e))?;
        Ok(())
    }

    /// Enqueue `messages` in the caller's transaction (`conn` must be inside one:
    /// outside, each message would be committed at once, which is allowed but not what
    /// an outbox is for). One statement per batch; an empty batch sends none. Messages
    /// reach the relay in commit order and, within a transaction, in slice order.
    ///
    /// # Errors
    /// - [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) for a
    ///   message over the config's limits, or one with a delay (the log carries no
    ///   due time); [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict) for an
    ///   id given twice in the batch. Nothing was sent: the transaction is usable.
    /// - Ids are not checked against earlier transactions: nothing is stored to check
    ///   against. Keep ids fresh (`MessageId::new`, the default).
    /// - Mapped driver errors otherwise; after them, roll the transaction back.
    pub async fn enqueue(&self, conn: &mut PgConnection, messages: &[NewMessage]) -> Result<()> {
        let contents = self.contents(messages)?;
        let sent = match contents.as_slice() {
            [] => return Ok(()),
            [one] => sqlx::query(ENQUEUE_ONE)
                .bind(self.config.prefix())
                .bind(one.as_slice())
                .execute(&mut *conn)
                .await
                .map(|_| ()),
            _ => sqlx::query(ENQUEUE)
                .bind(self.config.prefix())
                .bind(contents)
                .execute(&mut *conn)
                .await
                .map(|_| ()),
        };
        sent.map_err(|e| from_sqlx("enqueue", e))
    }

    /// The logical decoding message contents of `messages`, checked as
    /// [`enqueue`](Self::enqueue) checks them, for emitting them in a statement of your
    /// own, where [`enqueue_with`](Self::enqueue_with) cannot write it (a statement
    /// with its own `WITH`, or messages only when the change did something): pass
    /// them with the config's
    /// [`prefix`](WalOutboxConfig::prefix) to `pg_logical_emit_message(true, prefix,
    /// content)`, in order, in the transaction that makes the business change. Emit
    /// each content once: joined with the change's rows, a message would be emitted
    /// once per row.
    ///
    /// ```no_run
    /// # async fn demo(outbox: &outbox_postgres_wal::WalOutbox, tx: &mut sqlx::PgConnection,
    /// #     messages: &[outbox_core::NewMessage]) -> Result<(), Box<dyn std::error::Error>> {
    /// let contents = outbox.contents(messages)?;
    /// // One statement: the business change (a cart becomes an order) and the
    /// // messages, emitted only when the cart had items.
    /// sqlx::query(
    ///     "WITH items AS (DELETE FROM carts WHERE customer = $1 RETURNING item), \
    ///           placed AS (INSERT INTO orders (customer, items) \
    ///                      SELECT $1, array_agg(item) FROM items HAVING count(*) > 0) \
    ///      SELECT pg_logical_emit_message(true, $2, c) FROM unnest($3::bytea[]) AS c \
    ///      WHERE EXISTS (SELECT FROM items)",
    /// )
    /// .bind(42_i64)
    /// .bind(outbox.config().prefix())
    /// .bind(contents)
    /// .execute(&mut *tx)
    /// .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`enqueue`](Self::enqueue)'s checks: nothing is sent.
    pub fn contents(&self, messages: &[NewMessage]) -> Result<Vec<Vec<u8>>> {
        check_enqueue(messages, self.config.limits())?;
        if let Some(delayed) = messages.iter().find(|m| !m.delay().is_zero()) {
            return Err(Error::invalid_input(
                "the log-tailing outbox cannot delay a message: the log carries no due time",
            )
            .with_ids(vec![delayed.id()]));
        }
        Ok(messages.iter().map(codec::encode).collect())
    }

    /// Run `statement`, the transaction's business change, and enqueue `messages` in
    /// the same statement: one round trip fewer than the change followed by
    /// [`enqueue`](Self::enqueue); on a CPU-bound server that round trip costs more
    /// than the message itself (`wal_bench`'s enqueue scenario).
    ///
    /// `statement` must be one `INSERT`, `UPDATE`, `DELETE` or (PostgreSQL 17 and
    /// later) `MERGE`, with its parameters bound as usual (`$1` to `$n`, in bind
    /// order). It runs as a data-modifying `WITH` query of a statement that emits the
    /// messages: it runs once and to completion, and the messages are emitted once
    /// whatever number of rows it changed (none included). Rows it `RETURN`s are not
    /// returned, and its row count is not reported: when the messages depend on them,
    /// run the change first and [`enqueue`](Self::enqueue) after it, or write the
    /// statement yourself with [`contents`](Self::contents). The statement is checked
    /// by its first word, so it cannot start with `WITH` (which could end in a
    /// `SELECT`, and a `WITH` query that only reads is skipped when nothing reads it)
    /// or with a comment. A trailing `;` is dropped, but not one followed by a
    /// comment. PostgreSQL refuses, with an error that aborts the transaction, what it
    /// cannot run inside `WITH`: `MERGE` before 17, a table with `DO ALSO` or
    /// unconditional `DO INSTEAD` rules. Every `$n` in the statement must have a bound
    /// value, so `$` followed by digits inside a literal or an identifier is refused
    /// too.
    ///
    /// ```no_run
    /// # async fn demo(outbox: &outbox_postgres_wal::WalOutbox, pool: &sqlx::PgPool,
    /// #     message: outbox_core::NewMessage) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// let order = sqlx::query("INSERT INTO orders (id, total) VALUES ($1, $2)")
    ///     .bind(42_i64)
    ///     .bind(1_000_i64);
    /// outbox.enqueue_with(&mut tx, order, &[message]).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// - As [`enqueue`](Self::enqueue)'s checks, and
    ///   [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) for a
    ///   statement of another kind or one using a placeholder past its bound values:
    ///   nothing was sent.
    /// - Mapped driver errors, the business statement's included (a unique violation
    ///   is [`ErrorKind::Conflict`](outbox_core::ErrorKind::Conflict)); after them, roll
    ///   the transaction back: neither the change nor the messages were made.
    pub async fn enqueue_with<'q>(
        &self,
        conn: &mut PgConnection,
        mut statement: impl Execute<'q, Postgres>,
        messages: &[NewMessage],
    ) -> Result<()> {
        let business = statement.sql();
        // Before `take_arguments`: some `Execute`s derive it from the arguments.
        let persistent = statement.persistent();
        let mut arguments = statement
            .take_arguments()
            .map_err(|e| Error::invalid_input(format!("the business statement's parameters: {e}")))?
            .unwrap_or_default();
        check_business_statement(business, arguments.len())?;
        let contents = self.contents(messages)?;
        let sql = with_messages(business, arguments.len(), contents.len());
        let bound = match contents.len() {
            0 => Ok(()),
            1 => arguments
                .add(self.config.prefix().to_owned())
                .and_then(|()| arguments.add(contents.into_iter().next().unwrap_or_default())),
            _ => arguments
                .add(self.config.prefix().to_owned())
                .and_then(|()| arguments.add(contents)),
        };
        bound.map_err(|e| Error::invalid_input(format!("binding the messages: {e}")))?;
        sqlx::query_with(&sql, arguments)
            .persistent(persistent)
            .execute(&mut *conn)
            .await
            .map(drop)
            .map_err(|e| from_sqlx("business statement with enqueue", e))
    }

    /// Enqueue one message; see [`enqueue`](Self::enqueue).
    ///
    /// # Errors
    /// As [`enqueue`](Self::enqueue).
    pub async fn enqueue_one(&self, conn: &mut PgConnection, message: &NewMessage) -> Result<()> {
        self.enqueue(conn, std::slice::from_ref(message)).await
    }

    /// Write `letters` (a message and why it is dead) to the dead-letter table in one
    /// statement. A message whose id is there already is left as it is: a relay that
    /// resumed before its position was confirmed meets the same message again.
    pub(crate) async fn write_dead_letters(&self, letters: &[DeadLetterRow]) -> Result<()> {
        // `text` and `jsonb` cannot hold NUL: a message that reached the dead letters
        // must not fail to be written there.
        let messages: Vec<Message> = letters
            .iter()
            .map(|letter| {
                let m = &letter.message;
                let mut headers = outbox_core::Headers::new();
                for (name, value) in m.headers.iter() {
                    headers.insert(storable(name), storable(value));
                }
                Message::from(MessageParts {
                    id: m.id,
                    destination: storable(&m.destination),
                    partition_key: m.partition_key.as_deref().map(storable),
                    payload: m.payload.clone(),
                    content_type: m.content_type.as_deref().map(storable),
                    headers,
                    created_at: m.created_at,
                    attempts: m.attempts,
                    last_error: Some(storable(&letter.reason)),
                })
            })
            .collect();
        self.dead_letters
            .store_dead_letters(&messages)
            .await
            .map(drop)
    }
}

/// A message the relay gives up on, and why.
#[derive(Debug, Clone)]
pub(crate) struct DeadLetterRow {
    pub(crate) message: Message,
    pub(crate) reason: String,
}

/// The error a relay stops with when its slot was invalidated.
pub(crate) fn invalidated(slot: &str, wal_status: Option<&str>) -> Error {
    Error::new(
        ErrorKind::Storage,
        format!(
            "replication slot {slot:?} was invalidated (wal_status {}): the server removed \
             log the slot still needed (max_slot_wal_keep_size exceeded), so messages \
             committed after its confirmed position may be lost. Refusing to skip them: \
             see the crate docs on invalidated slots",
            wal_status.unwrap_or("unknown")
        ),
    )
}

/// Refuse what [`WalOutbox::enqueue_with`] cannot wrap: only a data-modifying `WITH`
/// query is run whether or not the outer statement reads it, so anything but a plain
/// `INSERT`, `UPDATE`, `DELETE` or `MERGE` could be skipped without an error. And a
/// placeholder past the `params` bound values would silently take a message's
/// parameter instead of failing as it would alone.
fn check_business_statement(sql: &str, params: usize) -> Result<()> {
    let first: String = sql
        .trim_start()
        .chars()
        .take_while(char::is_ascii_alphabetic)
        .collect();
    if !["insert", "update", "delete", "merge"]
        .iter()
        .any(|k| first.eq_ignore_ascii_case(k))
    {
        return Err(Error::invalid_input(format!(
            "enqueue_with runs one INSERT, UPDATE, DELETE or MERGE with the messages; \
             this statement starts with {:?}: run it and call enqueue instead",
            sql.trim_start().chars().take(20).collect::<String>()
        )));
    }
    // `$` then digits: a placeholder (or the same text inside a literal, refused too).
    let highest = sql
        .split('$')
        .skip(1)
        .filter_map(|after| {
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<usize>().ok()
        })
        .max()
        .unwrap_or(0);
    if highest > params {
        return Err(Error::invalid_input(format!(
            "the business statement uses ${highest} but binds {params} value(s)"
        )));
    }
    Ok(())
}

/// `business` (with `params` parameters) as the data-modifying `WITH` query of a
/// statement emitting `messages` logical decoding messages, whose prefix and contents
/// are the next parameters. The newlines end a trailing `--` comment of `business`.
fn with_messages(business: &str, params: usize, messages: usize) -> String {
    let business = business
        .trim_end()
        .trim_end_matches([';', ' ', '\n', '\t', '\r']);
    let (prefix, contents) = (params + 1, params + 2);
    match messages {
        0 => business.to_owned(),
        1 => format!(
            "WITH business AS (\n{business}\n) \
             SELECT pg_logical_emit_message(true, ${prefix}, ${contents})::text"
        ),
        _ => format!(
            "WITH business AS (\n{business}\n) \
             SELECT count(pg_logical_emit_message(true, ${prefix}, m))::int8 \
             FROM unnest(${contents}::bytea[]) AS t(m)"
        ),
    }
}

/// Text PostgreSQL can store: NUL (which `text` and `jsonb` cannot hold) replaced.
fn storable(text: &str) -> String {
    text.replace('\0', "\u{FFFD}")
}

/// `SystemTime` of a PostgreSQL timestamp in microseconds since 2000-01-01 UTC.
pub(crate) fn pg_time(micros: i64) -> SystemTime {
    /// 2000-01-01T00:00:00Z in microseconds since the Unix epoch.
    const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;
    let unix = micros.saturating_add(PG_EPOCH_UNIX_MICROS);
    match u64::try_from(unix) {
        Ok(m) => SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(m),
        Err(_) => SystemTime::UNIX_EPOCH,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn business_statements_that_a_with_query_runs() {
        for ok in [
            "INSERT INTO t",
            "  update t",
            "Delete from t",
            "MERGE INTO t",
            "insert(x)",
        ] {
            assert!(check_business_statement(ok, 0).is_ok(), "{ok}");
        }
        for refused in [
            "SELECT f()",
            "WITH x AS (..) INSERT",
            "-- c\nINSERT",
            "",
            "inserts",
        ] {
            let err = check_business_statement(refused, 0).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{refused}");
        }
    }

    #[test]
    fn every_placeholder_of_the_business_statement_is_bound() {
        let sql = "UPDATE t SET a = $2, b = $$x$$ WHERE c = $1 AND d = $1";
        assert!(check_business_statement(sql, 2).is_ok());
        assert!(check_business_statement(sql, 3).is_ok());
        let err = check_business_statement(sql, 1).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("$2"), "{err}");
        assert!(check_business_statement("DELETE FROM t WHERE a = $10", 9).is_err());
        assert!(check_business_statement("DELETE FROM t WHERE a = $10", 10).is_ok());
    }

    #[test]
    fn messages_take_the_parameters_after_the_business_statement() {
        assert_eq!(with_messages("DELETE FROM t ;\n", 0, 0), "DELETE FROM t");
        assert_eq!(
            with_messages("UPDATE t SET a = $1, b = $2 ;;", 2, 1),
            "WITH business AS (\nUPDATE t SET a = $1, b = $2\n) \
             SELECT pg_logical_emit_message(true, $3, $4)::text"
        );
        assert_eq!(
            with_messages("INSERT INTO t VALUES ($1) -- c", 1, 2),
            "WITH business AS (\nINSERT INTO t VALUES ($1) -- c\n) \
             SELECT count(pg_logical_emit_message(true, $2, m))::int8 \
             FROM unnest($3::bytea[]) AS t(m)"
        );
    }

    #[test]
    fn pg_epoch() {
        assert_eq!(
            pg_time(0),
            SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(946_684_800)
        );
        assert_eq!(pg_time(i64::MIN), SystemTime::UNIX_EPOCH);
    }
}
