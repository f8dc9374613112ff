//! [`WalRelay`]: stream committed messages from the slot, publish them, confirm the
//! position once every message up to it was settled.
//!
//! This file holds the public type, its protocol, its [`WalRelayReport`] and
//! [`run`](WalRelay::run); the relay's work is in the child modules:
//!
//! - `session`: the one-relay-per-slot lock, connecting, the replication session loop,
//!   closing a session, and resuming after one ended (reconnect backoff, keeping or
//!   taking the lock again);
//! - `stream`: decoding the stream into committed messages, the log records dead-lettered
//!   instead of published, and the positions that may be confirmed to the server;
//! - `publish`: publishing a wave of ready messages through the [`PublishStage`], with
//!   retries and dead letters, and settling what was answered;
//! - `lag`: the lag ticks and the slot reads behind the lag gauges.

mod lag;
mod publish;
mod session;
mod stream;

use std::collections::HashMap;
use std::sync::Arc;

use outbox_core::relay::PublishStage;
use outbox_core::{LockName, MessageId, Publisher, Result};
use pgwire_replication::Lsn;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::{ReplicationTarget, WalRelayConfig};
use crate::meters::Meters;
use crate::outbox::WalOutbox;

/// Destination recorded for a message with this outbox's prefix whose content does not
/// decode (written by another tool), when it is dead-lettered.
pub const UNDECODABLE_DESTINATION: &str = "outbox-wal.undecodable";

/// Destination recorded for a *non-transactional* logical decoding message with this
/// outbox's prefix (`pg_logical_emit_message(false, ..)`, never written by `enqueue`),
/// when it is dead-lettered. Such a message is decoded even when the transaction that
/// emitted it rolled back, so the relay never publishes it.
pub const NON_TRANSACTIONAL_DESTINATION: &str = "outbox-wal.non-transactional";

/// What a [`WalRelay::run`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WalRelayReport {
    /// Messages the broker accepted (repeats after a resume count again).
    pub published: u64,
    /// Messages written to the dead letters.
    pub dead_lettered: u64,
    /// Retryable publish failures (each counts as an attempt of its message).
    pub retried: u64,
    /// Publisher panics caught (each fails its call's messages retryably).
    pub panics: u64,
    /// Stream sessions opened.
    pub sessions: u64,
}

/// The log-tailing relay: one per replication slot.
///
/// # Protocol
///
/// 1. Take the slot's lock (`outbox-wal:<slot>`, a `PgDistributedLock`): one active
///    relay per slot. A relay that finds it held waits, retrying every
///    [`lock_retry`](WalRelayConfig::lock_retry): a hot standby.
/// 2. Check the slot (exists, `pgoutput`, this database, not invalidated) and open a
///    replication session from its confirmed position (see *Duplicates* for which),
///    `pgoutput` with `messages 'true'`.
/// 3. Read events. A transactional logical decoding message with the outbox's prefix
///    is decoded into a [`Message`] stamped with its transaction's commit time; the
///    transaction's messages become publishable at its `COMMIT`, in commit order.
///    Messages with other prefixes and table changes are skipped. A message with the
///    prefix that does not decode or breaks the message rules
///    ([`Message::check_stored`]), and any *non-transactional* message with the prefix
///    (decoded even when its transaction rolled back), is written to the dead letters
///    at once ([`UNDECODABLE_DESTINATION`], [`NON_TRANSACTIONAL_DESTINATION`]) and
///    never published.
/// 4. Publish in batches of up to [`batch_size`](WalRelayConfig::batch_size), up to
///    [`publish_concurrency`](WalRelayConfig::publish_concurrency) calls in flight at
///    once (the next batch goes out while earlier ones await the broker), the answers
///    taken in order, until nothing is ready. The calls in flight together hold at
///    most one message per partition key. A permanent refusal is written to the dead letters; a
///    retryable one is counted against that message (dead-lettered after
///    `retry.max_attempts`). Every call goes through the guards the polling relay's
///    calls do ([`PublishStage`]): a call unanswered after
///    [`publish_timeout`](WalRelayConfig::publish_timeout), a panicking publisher
///    (counted in [`WalRelayReport::panics`]) and a wrong number of outcomes fail
///    every message of the batch retryably.
/// 5. Confirm (standby status update) the end position of the last transaction all of
///    whose messages, and all before them, were published or dead-lettered; a
///    position past which nothing of the outbox is waiting (other transactions,
///    keepalives) is confirmed too.
/// 6. On a retryable publish failure, confirm what is settled, close the session,
///    wait the retry delay and resume at step 2 (keeping the lock): messages after the confirmed position are read
///    and published again. Stream or database errors resume the same way, with
///    [`initial_reconnect_backoff`](WalRelayConfig::initial_reconnect_backoff) up to
///    [`max_reconnect_backoff`](WalRelayConfig::max_reconnect_backoff), taking the lock
///    again first (a server restart ends the lock's session too).
/// 7. An invalidated slot, a missing slot, refused credentials, a replication URL
///    for another database or a saved position that does not fit the server stop the
///    relay with an error; shutdown confirms what is settled and returns, waiting at
///    most [`shutdown_grace`](WalRelayConfig::shutdown_grace) for a publish in flight.
///
/// Every [`lag_interval`](WalRelayConfig::lag_interval) the relay reads the slot and
/// sets the [`SLOT_LAG_BYTES`](crate::SLOT_LAG_BYTES) and
/// [`SLOT_LAG_SECONDS`](crate::SLOT_LAG_SECONDS) gauges, also while a publish hangs,
/// and stops if the slot was invalidated meanwhile (a publish in flight ends first: what
/// it carries was read before the loss; until then the relay logs a warning).
///
/// ## Duplicates
///
/// A relay resumes from the latest of three positions: the one the server received
/// last, the one this relay confirmed (when it survived the failure), and the one
/// relays save in [`POSITIONS_TABLE`](crate::POSITIONS_TABLE) (one upsert per
/// [`status_interval`](WalRelayConfig::status_interval) at most). The saved position
/// matters after a server restart or crash: before PostgreSQL 17 the server writes a
/// logical slot's confirmed position to disk only when the slot's other state moves
/// (and not at a clean shutdown), so on its own it may go back by many seconds. The
/// saved row carries the server's system identifier and is started over when
/// [`WalOutbox::install`] creates the slot; a row from another server or ahead of the
/// server's current log position stops the relay (permanent
/// [`ErrorKind::Storage`]) instead of skipping what was committed in between.
///
/// So a relay killed (or cut off) publishes again what it published after the last
/// position it reported: the messages of the transaction it was in (positions are
/// confirmed at transaction ends), those settled during the last `status_interval`
/// and the calls in flight (up to `batch_size × publish_concurrency` messages). A
/// retryable failure republishes the messages of the failing message's transaction
/// published before it, and the messages after it that were in flight. Publishers pass the message id as the broker's dedup id; consumers deduplicate.
///
/// ## Ordering
///
/// Messages are handed to the publisher in commit order, and within a transaction in
/// enqueue order; what is in flight at once (one or several calls) is cut before a
/// partition key's second message. Per-key order holds for every key, also when the
/// broker accepts part of a batch: a key's next message is published only after the
/// earlier one settled.
/// Across keys, first publishes are in commit order; when a batch partly fails, its
/// other keys' messages accepted by the broker may precede the retried one (and are
/// published again after the resume). A message that keeps failing holds every later
/// message back until it succeeds or is dead-lettered; dead letters leave the stream
/// (and their key's order).
///
/// [`Message`]: outbox_core::Message
/// [`Message::check_stored`]: outbox_core::Message::check_stored
/// [`ErrorKind::Storage`]: outbox_core::ErrorKind::Storage
#[derive(Debug)]
pub struct WalRelay {
    outbox: WalOutbox,
    target: ReplicationTarget,
    /// The publisher behind the publish timeout and the panic guard the polling relay
    /// uses too.
    stage: PublishStage,
    config: WalRelayConfig,
    /// Retryable failures per message not yet settled, across sessions (lost with the
    /// process).
    failures: HashMap<MessageId, u32>,
    report: WalRelayReport,
    meters: Meters,
    /// The highest position this relay confirmed: later sessions start there, as the
    /// server may have gone back to an older one (a restart before PostgreSQL 17).
    resume_from: Lsn,
    /// Bumped by the replication worker after each standby status update that moved the
    /// position reported to the server: what [`close`](Self::close) waits on.
    feedback: Arc<watch::Sender<u64>>,
}

impl WalRelay {
    /// A relay reading `outbox`'s slot over a replication connection to `target`,
    /// publishing to `publisher`.
    ///
    /// `outbox`'s pool runs the lock (one connection held while running), the slot
    /// checks and the dead-letter writes: give it at least 2 connections.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for an invalid config.
    pub fn new(
        outbox: WalOutbox,
        target: ReplicationTarget,
        publisher: Arc<dyn Publisher>,
        config: WalRelayConfig,
    ) -> Result<Self> {
        config.validate()?;
        let slot = outbox.config().slot();
        let meters = Meters::new(slot);
        let stage = PublishStage::new(publisher, slot, config.publish_timeout);
        Ok(WalRelay {
            outbox,
            target,
            stage,
            config,
            failures: HashMap::new(),
            report: WalRelayReport::default(),
            meters,
            resume_from: Lsn::ZERO,
            feedback: Arc::new(watch::channel(0).0),
        })
    }

    /// The lock name a relay of `slot` holds.
    ///
    /// # Errors
    /// Never for a validated slot name.
    pub fn lock_name(slot: &str) -> Result<LockName> {
        LockName::new(format!("outbox-wal:{slot}"))
    }

    /// Run until `shutdown` is cancelled (returning what was done) or a permanent
    /// failure (an invalidated or missing slot, refused credentials).
    ///
    /// # Errors
    /// The permanent failure; see the protocol.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<WalRelayReport> {
        self.run_sessions(&shutdown).await?;
        Ok(self.report)
    }
}
