//! [`WalRelay`]: stream committed messages from the slot, publish them, confirm the
//! position once every message up to it was settled.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use outbox_core::backend::Backoff;
use outbox_core::relay::PublishStage;
use outbox_core::{
    lock::LockGuard, DistributedLock, Error, ErrorKind, LockName, Message, MessageId,
    PublishOutcome, Publisher, Result,
};
use outbox_postgres::PgDistributedLock;
use pgwire_replication::{
    FeedbackObserver, Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::codec;
use crate::config::{ReplicationTarget, WalRelayConfig};
use crate::error::from_wire;
use crate::meters::Meters;
use crate::outbox::{pg_time, DeadLetterRow, WalOutbox};

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

/// Why a session ended without an error that stops the relay.
enum SessionEnd {
    Shutdown,
    /// Resume after `wait`. `keep_lock`: the database session holding the slot lock
    /// was not involved (a publish to retry); otherwise the lock is taken again, as a
    /// server that ended the stream (a restart) ended the lock's session too.
    Resume {
        wait: Duration,
        cause: Error,
        keep_lock: bool,
    },
}

/// How publishing one batch ended.
enum BatchEnd {
    /// Every message of the batch was settled.
    Settled,
    /// A retryable failure: end the session and resume after the wait.
    Retry(Duration, Error),
    /// Shutdown came and the publish outlived the shutdown grace: the batch was
    /// abandoned unsettled (the next relay publishes it again).
    Abandoned,
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
        let lock = PgDistributedLock::new(self.outbox.pool().clone());
        let name = Self::lock_name(self.outbox.config().slot())?;
        let mut backoff = Backoff::new(
            self.config.initial_reconnect_backoff,
            self.config.max_reconnect_backoff,
        );
        let mut held: Option<Box<dyn LockGuard>> = None;
        loop {
            let guard = match held.take() {
                Some(guard) => guard,
                None => match self.acquire(&lock, &name, &shutdown, &mut backoff).await? {
                    Some(guard) => guard,
                    None => return Ok(self.report),
                },
            };
            let outcome = self.session(&shutdown, &mut backoff).await;
            let wait = match outcome {
                Ok(SessionEnd::Shutdown) => {
                    release(guard).await;
                    return Ok(self.report);
                }
                Ok(SessionEnd::Resume {
                    wait,
                    cause,
                    keep_lock,
                }) => {
                    if keep_lock {
                        // The database was fine (a publish to retry): keep the lock.
                        held = Some(guard);
                    } else {
                        // The server ended the stream (a restart or a shutdown): the
                        // lock's session went with it. Take the lock again first.
                        release(guard).await;
                    }
                    tracing::info!(error = %cause.report(), ?wait, "wal relay: resuming from the confirmed position");
                    wait
                }
                Err(e) if e.is_retryable() => {
                    // The stream or the database failed: the lock's session may be
                    // gone with it (a server restart). Take the lock again before the
                    // next session.
                    release(guard).await;
                    // A server error's text does not say whether the slot can still
                    // serve changes: ask the server about the slot instead.
                    if let Err(stop) = self.outbox.check_slot().await {
                        if !stop.is_retryable() {
                            tracing::error!(error = %stop.report(), cause = %e.report(), "wal relay: stopping");
                            return Err(stop);
                        }
                    }
                    tracing::warn!(error = %e.report(), "wal relay: stream failed; resuming from the confirmed position");
                    backoff.next_delay()
                }
                Err(e) => {
                    release(guard).await;
                    tracing::error!(error = %e.report(), "wal relay: stopping");
                    return Err(e);
                }
            };
            self.meters.reconnects.increment(1);
            if sleep_or_shutdown(wait, &shutdown).await {
                if let Some(guard) = held.take() {
                    release(guard).await;
                }
                return Ok(self.report);
            }
        }
    }

    /// Take the slot's lock, waiting as a standby while another relay holds it;
    /// `None` when shutdown came first.
    async fn acquire(
        &self,
        lock: &PgDistributedLock,
        name: &LockName,
        shutdown: &CancellationToken,
        backoff: &mut Backoff,
    ) -> Result<Option<Box<dyn LockGuard>>> {
        loop {
            match lock.try_lock(name).await {
                Ok(Some(guard)) => return Ok(Some(guard)),
                Ok(None) => {
                    // A standby: keep the lag visible while another relay streams.
                    if let Ok(Some(status)) = self.outbox.slot_status().await {
                        self.meters.lag_bytes(status.lag_bytes);
                    }
                    if sleep_or_shutdown(self.config.lock_retry, shutdown).await {
                        return Ok(None);
                    }
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(error = %e.report(), "wal relay: taking the slot lock failed");
                    if sleep_or_shutdown(backoff.next_delay(), shutdown).await {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn replication_config(&self) -> ReplicationConfig {
        let t = &self.target;
        let c = self.outbox.config();
        ReplicationConfig::new(
            t.host(),
            t.user(),
            t.password(),
            t.database(),
            c.slot(),
            c.publication(),
        )
        .with_port(t.port())
        .with_tls(t.tls())
        // Zero at first: the server starts at the slot's confirmed position. Later, the
        // position this relay confirmed: the server forwards to it when its own is
        // older (a restart may lose a logical slot's unsaved position before 17).
        .with_start_lsn(self.resume_from)
        .with_status_interval(self.config.status_interval)
        .with_wakeup_interval(self.config.status_interval)
        .with_application_name(self.config.application_name.clone())
        .with_feedback_observer({
            let feedback = Arc::clone(&self.feedback);
            FeedbackObserver::new(move |_| {
                feedback.send_modify(|n| *n = n.wrapping_add(1));
            })
        })
    }

    /// One replication session; see the protocol.
    async fn session(
        &mut self,
        shutdown: &CancellationToken,
        backoff: &mut Backoff,
    ) -> Result<SessionEnd> {
        let status = self.outbox.check_slot().await?;
        // The slot decodes the pool's database; a replication URL naming another one
        // would be refused by the server on every attempt.
        if status.database.as_deref() != Some(self.target.database()) {
            return Err(Error::config(format!(
                "the replication URL names database {:?}, but replication slot {:?} decodes \
                 database {:?} (the outbox pool's): point both at the same database",
                self.target.database(),
                self.outbox.config().slot(),
                status.database.as_deref().unwrap_or("?")
            )));
        }
        if let Some(saved) = self.outbox.load_position().await? {
            self.resume_from = self.resume_from.max(saved);
        }
        self.report.sessions += 1;
        let mut client = ReplicationClient::connect(self.replication_config())
            .await
            .map_err(|e| from_wire("connect", e))?;
        tokio::select! {
            () = shutdown.cancelled() => return Ok(SessionEnd::Shutdown),
            started = client.wait_started() => started.map_err(|e| from_wire("start replication", e))?,
        }
        let mut stream = Stream::new(self.resume_from);
        let mut lag_tick = lag_ticks(self.config.lag_interval);
        let mut published_once = false;
        let mut saved = (self.resume_from, Instant::now());
        loop {
            // `recv` is cancelled below only while the worker runs: once it ended,
            // `recv` awaits the worker's result, which a cancelled `recv` would lose.
            let event = if client.is_running() {
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => {
                        self.close(client, &stream).await;
                        return Ok(SessionEnd::Shutdown);
                    }
                    _ = lag_tick.tick() => {
                        let status = self.outbox.check_slot().await?;
                        self.meters.lag(status.lag_bytes, stream.oldest());
                        continue;
                    }
                    event = client.recv() => event,
                }
            } else {
                client.recv().await
            };
            match event {
                Ok(Some(e)) => self.apply(&mut stream, e).await?,
                Ok(None) => return Ok(self.stream_ended(client, &stream, backoff).await),
                Err(e) => return Err(from_wire("receive", e)),
            }
            // Take what has arrived already, up to a batch, before publishing.
            while stream.ready.len() < self.config.batch_size && client.is_running() {
                match client.recv().now_or_never() {
                    Some(Ok(Some(e))) => self.apply(&mut stream, e).await?,
                    None => break,
                    Some(Ok(None)) => return Ok(self.stream_ended(client, &stream, backoff).await),
                    Some(Err(e)) => return Err(from_wire("receive", e)),
                }
            }
            // Publish everything ready: a remainder left here would wait for the next
            // event, which on a quiet database is the next keepalive.
            while !stream.ready.is_empty() {
                match self.publish_batch(&mut stream, shutdown).await? {
                    BatchEnd::Settled => {}
                    BatchEnd::Retry(wait, cause) => {
                        self.confirm(&client, &mut stream);
                        self.close(client, &stream).await;
                        return Ok(SessionEnd::Resume {
                            wait,
                            cause,
                            keep_lock: true,
                        });
                    }
                    BatchEnd::Abandoned => {
                        self.confirm(&client, &mut stream);
                        self.close(client, &stream).await;
                        return Ok(SessionEnd::Shutdown);
                    }
                }
                if !published_once {
                    published_once = true;
                    backoff.reset();
                }
                self.confirm(&client, &mut stream);
                if shutdown.is_cancelled() {
                    self.close(client, &stream).await;
                    return Ok(SessionEnd::Shutdown);
                }
            }
            self.confirm(&client, &mut stream);
            if stream.confirmed > saved.0 && saved.1.elapsed() >= self.config.status_interval {
                self.outbox.save_position(stream.confirmed).await?;
                saved = (stream.confirmed, Instant::now());
            }
        }
    }

    /// The server ended the stream (`recv` gave `Ok(None)`): close, and resume after a
    /// backoff with the lock taken again.
    async fn stream_ended(
        &self,
        client: ReplicationClient,
        stream: &Stream,
        backoff: &mut Backoff,
    ) -> SessionEnd {
        self.close(client, stream).await;
        SessionEnd::Resume {
            wait: backoff.next_delay(),
            cause: Error::new(ErrorKind::Unavailable, "the server ended the stream"),
            keep_lock: false,
        }
    }

    /// Fold one event into the stream's state.
    async fn apply(&mut self, stream: &mut Stream, event: ReplicationEvent) -> Result<()> {
        match event {
            ReplicationEvent::Begin {
                commit_time_micros, ..
            } => {
                stream.in_txn = true;
                stream.commit_time = pg_time(commit_time_micros);
            }
            ReplicationEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } if prefix == self.outbox.config().prefix() => {
                if !transactional {
                    // Emitted outside any transaction's commit (not by `enqueue`): it
                    // is decoded even when the emitting transaction rolled back, so it
                    // is never published. Kept as a dead letter for the operator.
                    self.dead_letter_raw(
                        lsn,
                        &content,
                        SystemTime::now(),
                        NON_TRANSACTIONAL_DESTINATION,
                        "non-transactional logical message under the outbox prefix: \
                         it is decoded even if its transaction rolled back, so it is not \
                         published"
                            .to_owned(),
                    )
                    .await?;
                    return Ok(());
                }
                // Content from another tool may decode and still break the message
                // rules (oversize, NUL or control characters): such a message could
                // neither be published nor stored as it is.
                let limits = self.outbox.config().limits();
                let decoded = codec::decode(&content, stream.commit_time, 1)
                    .and_then(|m| m.check_stored(limits).map(|()| m));
                match decoded {
                    Ok(message) => stream.txn.push(message),
                    Err(reason) => {
                        // Not ours to publish, but never skipped silently: it goes to
                        // the dead letters with its raw content.
                        self.dead_letter_raw(
                            lsn,
                            &content,
                            stream.commit_time,
                            UNDECODABLE_DESTINATION,
                            format!("undecodable logical message: {reason}"),
                        )
                        .await?;
                    }
                }
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                stream.in_txn = false;
                let messages = std::mem::take(&mut stream.txn);
                let count = messages.len();
                for (i, message) in messages.into_iter().enumerate() {
                    stream.push(message, (i + 1 == count).then_some(end_lsn));
                }
                if count == 0 {
                    stream.passed(end_lsn);
                }
            }
            ReplicationEvent::KeepAlive { wal_end, .. } if !stream.in_txn => {
                stream.passed(wal_end);
            }
            _ => {}
        }
        Ok(())
    }

    /// Write a log record under the outbox prefix that is not published (undecodable
    /// or non-transactional) to the dead letters, with its raw content as the payload.
    /// Its id is derived from the slot and the record's position, so a record read
    /// again after a resume is the same dead letter, not a second one.
    async fn dead_letter_raw(
        &mut self,
        lsn: Lsn,
        content: &[u8],
        at: SystemTime,
        destination: &str,
        reason: String,
    ) -> Result<()> {
        let message = Message::from(outbox_core::backend::MessageParts {
            id: record_id(self.outbox.config().slot(), lsn),
            destination: destination.to_owned(),
            partition_key: None,
            payload: content.to_vec(),
            content_type: None,
            headers: outbox_core::Headers::new(),
            created_at: at,
            attempts: 0,
            last_error: None,
        });
        tracing::warn!(%lsn, destination, %reason, "wal relay: dead-lettering a log record");
        self.outbox
            .write_dead_letters(&[DeadLetterRow { message, reason }])
            .await?;
        self.report.dead_lettered += 1;
        self.meters.dead_lettered.increment(1);
        Ok(())
    }

    /// Publish the first wave of `stream.ready` and settle it: up to
    /// [`publish_concurrency`](WalRelayConfig::publish_concurrency) calls of
    /// [`batch_size`](WalRelayConfig::batch_size) messages in flight at once, a call
    /// starting as soon as an earlier one answers, the answers taken in order.
    ///
    /// A wave holds at most one message per partition key: it is cut before a key's
    /// second message. A broker accepting a later message of a key while refusing an
    /// earlier one (to retry), or two calls in flight at once, would otherwise put the
    /// later one first.
    async fn publish_batch(
        &mut self,
        stream: &mut Stream,
        shutdown: &CancellationToken,
    ) -> Result<BatchEnd> {
        let wave = self
            .config
            .batch_size
            .saturating_mul(self.config.publish_concurrency);
        let n = batch_len(&stream.ready, wave);
        // `attempts`: this hand-over, counted from 1, after the retryable failures
        // this relay (since it started) met publishing the message.
        for message in stream.ready.range_mut(..n) {
            message.attempts = self.failures.get(&message.id).copied().unwrap_or(0) + 1;
        }
        let oldest = stream.oldest();
        let batch = &stream.ready.make_contiguous()[..n];
        let grace = self.config.shutdown_grace;
        // The publish future borrows the batch: it ends with this block.
        let published = {
            let mut publish = std::pin::pin!(publish_wave(
                &self.stage,
                batch,
                self.config.batch_size,
                self.config.publish_concurrency,
                self.config.retry.max_attempts,
            ));
            let mut grace_over = std::pin::pin!(async {
                shutdown.cancelled().await;
                tokio::time::sleep(grace).await;
            });
            // A publish that hangs (a stalled broker) must not freeze the lag gauges: they
            // matter most then.
            let mut lag_tick = lag_ticks(self.config.lag_interval);
            lag_tick.reset();
            loop {
                tokio::select! {
                    published = &mut publish => break published,
                    () = &mut grace_over => {
                        tracing::warn!(count = n, ?grace, "wal relay: shutdown grace expired; abandoning the publish in flight (its messages are published again by the next relay)");
                        return Ok(BatchEnd::Abandoned);
                    }
                    // Bounded, so the publish and the grace timer wait at most one
                    // interval for it.
                    _ = lag_tick.tick() => match tokio::time::timeout(self.config.lag_interval, self.outbox.check_slot()).await {
                        Ok(Ok(status)) => self.meters.lag(status.lag_bytes, oldest),
                        // The publish goes on (what it carries was read before the loss);
                        // the session's own check stops the relay once it ends.
                        Ok(Err(e)) if !e.is_retryable() => tracing::warn!(error = %e.report(), "wal relay: the slot failed its check during a publish; stopping once the publish ends"),
                        Ok(Err(e)) => tracing::debug!(error = %e.report(), "wal relay: slot check during a publish"),
                        Err(_) => tracing::debug!("wal relay: slot check during a publish timed out"),
                    },
                }
            }
        };
        let Wave {
            mut outcomes,
            panics,
        } = published;
        if panics > 0 {
            self.report.panics += panics;
            self.meters.panics.increment(panics);
        }
        // The messages that got an answer: the calls after a retryable failure were
        // dropped, and theirs are published again after the resume.
        let n = outcomes.len();
        let batch = &batch[..n];
        // Settled: the prefix before the first message to retry.
        let mut settled = n;
        let mut retry = None;
        for (i, outcome) in outcomes.iter_mut().enumerate() {
            let PublishOutcome::Retryable(reason) = outcome else {
                continue;
            };
            let attempts = batch[i].attempts;
            if retry.is_none() && attempts >= self.config.retry.max_attempts {
                *outcome = PublishOutcome::Permanent(format!(
                    "gave up after {attempts} attempts: {reason}"
                ));
                continue;
            }
            // Only a retryable failure counts against a message: one accepted in a
            // batch that failed elsewhere is not charged for the other's failure.
            *self.failures.entry(batch[i].id).or_insert(0) += 1;
            self.report.retried += 1;
            self.meters.retried.increment(1);
            if retry.is_none() {
                settled = i;
                retry = Some((
                    self.config.retry.delay(attempts),
                    Error::new(
                        ErrorKind::Publish,
                        format!("publish will be retried: {reason}"),
                    )
                    .with_ids(vec![batch[i].id]),
                ));
            }
        }
        let dead: Vec<DeadLetterRow> = batch[..settled]
            .iter()
            .zip(&outcomes)
            .filter_map(|(message, outcome)| match outcome {
                PublishOutcome::Permanent(reason) => Some(DeadLetterRow {
                    message: message.clone(),
                    reason: reason.clone(),
                }),
                _ => None,
            })
            .collect();
        // On failure nothing of this batch is confirmed: it is published again after
        // the resume.
        self.outbox.write_dead_letters(&dead).await?;
        let published = (settled - dead.len()) as u64;
        self.report.published += published;
        self.report.dead_lettered += dead.len() as u64;
        self.meters.dispatched.increment(published);
        if !dead.is_empty() {
            self.meters.dead_lettered.increment(dead.len() as u64);
        }
        for _ in 0..settled {
            let message = stream.ready.pop_front().expect("settled within the batch");
            if let Some(end) = stream.ends.pop_front().expect("one end per message") {
                stream.settled_to = Some(end);
            }
            self.failures.remove(&message.id);
        }
        Ok(match retry {
            Some((wait, cause)) => BatchEnd::Retry(wait, cause),
            None => BatchEnd::Settled,
        })
    }

    /// Report the settled position to the server (sent within `status_interval`).
    fn confirm(&mut self, client: &ReplicationClient, stream: &mut Stream) {
        if stream.ready.is_empty() {
            if let Some(passed) = stream.passed.take() {
                stream.settled_to = stream.settled_to.max(Some(passed));
            }
        }
        if let Some(lsn) = stream.settled_to {
            if lsn > stream.confirmed {
                client.update_applied_lsn(lsn);
                stream.confirmed = lsn;
                self.resume_from = self.resume_from.max(lsn);
            }
        }
    }

    /// End the session, first waiting (up to twice the status interval) until the
    /// confirmed position has been sent, so a resume starts there. The wait ends on
    /// the replication worker's report of a sent status update, on the worker's end or
    /// at the deadline.
    async fn close(&self, mut client: ReplicationClient, stream: &Stream) {
        if let Err(e) = self.outbox.save_position(stream.confirmed).await {
            tracing::warn!(error = %e.report(), "wal relay: saving the confirmed position failed");
        }
        let metrics = client.metrics();
        let mut sent = self.feedback.subscribe();
        let deadline = tokio::time::Instant::now()
            + self.config.status_interval * 2
            + Duration::from_millis(500);
        while metrics.last_applied_lsn() < stream.confirmed && client.is_running() {
            // A worker that ends sends no more updates: re-check it at least every
            // status interval.
            let wake = deadline.min(tokio::time::Instant::now() + self.config.status_interval);
            match tokio::time::timeout_at(wake, sent.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => break,
                Err(_) if tokio::time::Instant::now() >= deadline => break,
                Err(_) => {}
            }
        }
        if tokio::time::timeout(Duration::from_secs(5), client.shutdown())
            .await
            .is_err()
        {
            client.abort();
        }
    }
}

/// One session's view of the stream.
struct Stream {
    /// Inside a transaction (between `BEGIN` and `COMMIT`).
    in_txn: bool,
    /// The current transaction's commit time.
    commit_time: SystemTime,
    /// The current transaction's messages, publishable at its commit.
    txn: Vec<Message>,
    /// Committed messages waiting to be published, in commit order.
    ready: VecDeque<Message>,
    /// Per message in `ready`: the position to confirm once it (and all before it) is
    /// settled: its transaction's end for the last message of a transaction.
    ends: VecDeque<Option<Lsn>>,
    /// A position past which nothing is waiting, once `ready` drains.
    passed: Option<Lsn>,
    /// The highest position whose messages are all settled.
    settled_to: Option<Lsn>,
    /// The position last handed to the client.
    confirmed: Lsn,
}

impl Stream {
    fn new(confirmed: Lsn) -> Self {
        Stream {
            in_txn: false,
            commit_time: SystemTime::UNIX_EPOCH,
            txn: Vec::new(),
            ready: VecDeque::new(),
            ends: VecDeque::new(),
            passed: None,
            settled_to: None,
            confirmed,
        }
    }

    fn push(&mut self, message: Message, end: Option<Lsn>) {
        self.ready.push_back(message);
        self.ends.push_back(end);
    }

    /// Everything up to `lsn` was read and holds nothing new of the outbox: confirm it
    /// with the last waiting message, or once nothing waits.
    fn passed(&mut self, lsn: Lsn) {
        match self.ends.back_mut() {
            Some(end) => *end = Some(lsn.max(end.unwrap_or(Lsn::ZERO))),
            None => self.passed = Some(lsn.max(self.passed.unwrap_or(Lsn::ZERO))),
        }
    }

    /// Commit time of the oldest message waiting.
    fn oldest(&self) -> Option<SystemTime> {
        self.ready.front().map(|m| m.created_at)
    }
}

/// The answers of one wave: an outcome for each message from the first up to the end
/// of the first call with a failure to retry (the calls after it are dropped), and
/// the panics caught.
struct Wave {
    outcomes: Vec<PublishOutcome>,
    panics: u64,
}

/// Publish `batch` in calls of `size` messages, `concurrency` in flight at once, the
/// answers taken in order, until a call fails a message retryably that has attempts
/// left (below `max_attempts`): the session then resumes, and the calls after it would
/// only publish again what the resume publishes anyway.
async fn publish_wave(
    stage: &PublishStage,
    batch: &[Message],
    size: usize,
    concurrency: usize,
    max_attempts: u32,
) -> Wave {
    let mut chunks = batch.chunks(size);
    let mut calls = FuturesOrdered::new();
    for chunk in chunks.by_ref().take(concurrency) {
        calls.push_back(publish_call(stage, chunk));
    }
    let mut wave = Wave {
        outcomes: Vec::with_capacity(batch.len()),
        panics: 0,
    };
    while let Some((chunk, published)) = calls.next().await {
        wave.panics += u64::from(published.panicked);
        let retry = chunk
            .iter()
            .zip(&published.outcomes)
            .any(|(m, o)| matches!(o, PublishOutcome::Retryable(_)) && m.attempts < max_attempts);
        wave.outcomes.extend(published.outcomes);
        if retry {
            break;
        }
        if let Some(next) = chunks.next() {
            calls.push_back(publish_call(stage, next));
        }
    }
    wave
}

/// One guarded call, with the messages it carried.
async fn publish_call<'a>(
    stage: &PublishStage,
    chunk: &'a [Message],
) -> (&'a [Message], outbox_core::relay::Published) {
    (chunk, stage.publish(chunk).await)
}

/// A lag interval that skips the ticks it missed (a long publish or a slow check must
/// not be followed by a burst of slot checks).
fn lag_ticks(period: Duration) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    ticks
}

/// How many messages from the front of `ready` make the next batch: at most `max`, and
/// cut before the second message of a partition key (unkeyed messages are not limited).
fn batch_len(ready: &VecDeque<Message>, max: usize) -> usize {
    let mut keys = HashSet::new();
    ready
        .iter()
        .take(max)
        .take_while(|m| m.partition_key.as_deref().is_none_or(|k| keys.insert(k)))
        .count()
}

/// The dead-letter id of the log record at `lsn` read from `slot`: the same every time
/// the record is read (64 bits of the slot name's FNV-1a hash, then the position; the
/// version and variant bits overwrite 6 bits, 2 of them the position's top bits,
/// reached after 2^62 bytes of log).
fn record_id(slot: &str, lsn: Lsn) -> MessageId {
    let hash = slot.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let mut bytes = [0_u8; 16];
    bytes[..8].copy_from_slice(&hash.to_be_bytes());
    bytes[8..].copy_from_slice(&lsn.as_u64().to_be_bytes());
    MessageId::from_uuid(uuid::Builder::from_custom_bytes(bytes).into_uuid())
}

/// Release a slot lock; a lock whose session is gone is released already.
async fn release(guard: Box<dyn LockGuard>) {
    if let Err(e) = guard.unlock().await {
        tracing::debug!(error = %e.report(), "wal relay: releasing the slot lock failed");
    }
}

/// Sleep `wait`; `true` when shutdown came first.
async fn sleep_or_shutdown(wait: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => true,
        () = tokio::time::sleep(wait) => false,
    }
}
