//! [`WalRelay`]: stream committed messages from the slot, publish them, confirm the
//! position once every message up to it was settled.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use metrics::{counter, gauge};
use outbox_core::backend::Backoff;
use outbox_core::{
    DistributedLock, Error, ErrorKind, LockGuard, LockName, Message, MessageId, PublishOutcome,
    Publisher, Result,
};
use outbox_postgres::PgDistributedLock;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig};
use tokio_util::sync::CancellationToken;

use crate::codec;
use crate::config::{ReplicationTarget, WalRelayConfig};
use crate::error::from_wire;
use crate::outbox::{pg_time, DeadLetterRow, WalOutbox};

/// Gauge, bytes: log between the server's current position and the slot's confirmed
/// position (label `slot`).
pub const SLOT_LAG_BYTES: &str = "outbox_wal_slot_lag_bytes";
/// Gauge, seconds: age of the oldest committed message the relay has read but not yet
/// settled, 0 when it is caught up (label `slot`).
pub const SLOT_LAG_SECONDS: &str = "outbox_wal_slot_lag_seconds";
/// Counter: messages the broker accepted (label `slot`).
pub const PUBLISHED: &str = "outbox_wal_messages_published_total";
/// Counter: messages written to the dead letters (label `slot`).
pub const DEAD_LETTERED: &str = "outbox_wal_messages_dead_lettered_total";
/// Counter: stream sessions ended by an error and resumed (label `slot`).
pub const RECONNECTS: &str = "outbox_wal_reconnects_total";

/// Destination recorded for a message with this outbox's prefix whose content does not
/// decode (written by another tool), when it is dead-lettered.
pub const UNDECODABLE_DESTINATION: &str = "outbox-wal.undecodable";

/// What a [`WalRelay::run`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WalRelayReport {
    /// Messages the broker accepted (repeats after a resume count again).
    pub published: u64,
    /// Messages written to the dead letters.
    pub dead_lettered: u64,
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
///    Messages with other prefixes and table changes are skipped.
/// 4. Publish in batches of up to [`batch_size`](WalRelayConfig::batch_size), one
///    batch at a time. A permanent refusal is written to the dead letters; a
///    retryable one is counted against the message (dead-lettered after
///    `retry.max_attempts`).
/// 5. Confirm (standby status update) the end position of the last transaction all of
///    whose messages, and all before them, were published or dead-lettered; a
///    position past which nothing of the outbox is waiting (other transactions,
///    keepalives) is confirmed too.
/// 6. On a retryable publish failure, confirm what is settled, close the session,
///    wait the retry delay and resume at step 2 (keeping the lock): messages after the confirmed position are read
///    and published again. Stream or database errors resume the same way, with
///    [`reconnect_backoff`](WalRelayConfig::reconnect_backoff), taking the lock again
///    first (a server restart ends the lock's session too).
/// 7. An invalidated slot, a missing slot or refused credentials stop the relay with
///    an error; shutdown confirms what is settled and returns.
///
/// Every [`lag_interval`](WalRelayConfig::lag_interval) the relay reads the slot and
/// sets the [`SLOT_LAG_BYTES`] and [`SLOT_LAG_SECONDS`] gauges, and stops if the slot
/// was invalidated meanwhile.
///
/// ## Duplicates
///
/// A relay resumes from the latest of three positions: the one the server received
/// last, the one this relay confirmed (when it survived the failure), and the one
/// relays save in [`POSITIONS_TABLE`](crate::POSITIONS_TABLE) (one upsert per
/// [`status_interval`](WalRelayConfig::status_interval) at most). The saved position
/// matters after a server restart or crash: before PostgreSQL 17 the server writes a
/// logical slot's confirmed position to disk only when the slot's other state moves
/// (and not at a clean shutdown), so on its own it may go back by many seconds.
///
/// So a relay killed (or cut off) publishes again what it published after the last
/// position it reported: the messages of the transaction it was in (positions are
/// confirmed at transaction ends), those settled during the last `status_interval`
/// and the batch in flight. A retryable failure republishes the messages of the
/// failing message's transaction published before it, and the batch's messages after
/// it. Publishers pass the message id as the broker's dedup id; consumers deduplicate.
///
/// ## Ordering
///
/// Messages are published in commit order, and within a transaction in enqueue order,
/// one batch at a time: per-key order holds for every key, and across keys too (a
/// total order). A message that keeps failing holds every later message back until it
/// succeeds or is dead-lettered; dead letters leave the stream (and their key's order).
#[derive(Debug)]
pub struct WalRelay {
    outbox: WalOutbox,
    target: ReplicationTarget,
    publisher: Arc<dyn Publisher>,
    config: WalRelayConfig,
    /// Hand-overs per message not yet settled, across sessions (lost with the process).
    attempts: HashMap<MessageId, u32>,
    report: WalRelayReport,
    slot_label: String,
    /// The highest position this relay confirmed: later sessions start there, as the
    /// server may have gone back to an older one (a restart before PostgreSQL 17).
    resume_from: Lsn,
}

/// Why a session ended without an error that stops the relay.
enum SessionEnd {
    Shutdown,
    /// Resume after this wait.
    Resume(Duration, Error),
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
        let slot_label = outbox.config().slot().to_owned();
        Ok(WalRelay {
            outbox,
            target,
            publisher,
            config,
            attempts: HashMap::new(),
            report: WalRelayReport::default(),
            slot_label,
            resume_from: Lsn::ZERO,
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
            self.config.reconnect_backoff.0,
            self.config.reconnect_backoff.1,
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
                Ok(SessionEnd::Resume(wait, cause)) => {
                    // The database was fine (a publish to retry): keep the lock.
                    held = Some(guard);
                    tracing::info!(error = %cause.report(), ?wait, "wal relay: resuming from the confirmed position");
                    wait
                }
                Err(e) if e.is_retryable() => {
                    // The stream or the database failed: the lock's session may be
                    // gone with it (a server restart). Take the lock again before the
                    // next session.
                    release(guard).await;
                    tracing::warn!(error = %e.report(), "wal relay: stream failed; resuming from the confirmed position");
                    backoff.next_delay()
                }
                Err(e) => {
                    release(guard).await;
                    tracing::error!(error = %e.report(), "wal relay: stopping");
                    return Err(e);
                }
            };
            counter!(RECONNECTS, "slot" => self.slot_label.clone()).increment(1);
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
                        self.export_lag(status.lag_bytes, None);
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
        .with_tls(TlsConfig::disabled())
        // Zero at first: the server starts at the slot's confirmed position. Later, the
        // position this relay confirmed: the server forwards to it when its own is
        // older (a restart may lose a logical slot's unsaved position before 17).
        .with_start_lsn(self.resume_from)
        .with_status_interval(self.config.status_interval)
        .with_wakeup_interval(self.config.status_interval)
        .with_application_name(self.config.application_name.clone())
    }

    /// One replication session; see the protocol.
    async fn session(
        &mut self,
        shutdown: &CancellationToken,
        backoff: &mut Backoff,
    ) -> Result<SessionEnd> {
        self.outbox.check_slot().await?;
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
        let mut lag_tick = tokio::time::interval(self.config.lag_interval);
        let mut published_once = false;
        let mut saved = (self.resume_from, Instant::now());
        loop {
            let event = tokio::select! {
                biased;
                () = shutdown.cancelled() => {
                    self.close(client, &stream).await;
                    return Ok(SessionEnd::Shutdown);
                }
                _ = lag_tick.tick() => {
                    let status = self.outbox.check_slot().await?;
                    self.export_lag(status.lag_bytes, stream.oldest());
                    continue;
                }
                event = client.recv() => event,
            };
            match event {
                Ok(Some(e)) => self.apply(&mut stream, e).await?,
                Ok(None) => {
                    self.close(client, &stream).await;
                    return Ok(SessionEnd::Resume(
                        backoff.next_delay(),
                        Error::new(ErrorKind::Unavailable, "the server ended the stream"),
                    ));
                }
                Err(e) => return Err(from_wire("receive", e)),
            }
            // Take what has arrived already, up to a batch, before publishing.
            while stream.ready.len() < self.config.batch_size {
                match client.recv().now_or_never() {
                    Some(Ok(Some(e))) => self.apply(&mut stream, e).await?,
                    Some(Ok(None)) | None => break,
                    Some(Err(e)) => return Err(from_wire("receive", e)),
                }
            }
            while !stream.ready.is_empty() {
                if let Some(end) = self.publish_batch(&mut stream).await? {
                    self.confirm(&client, &mut stream);
                    self.close(client, &stream).await;
                    return Ok(SessionEnd::Resume(end.0, end.1));
                }
                if !published_once {
                    published_once = true;
                    backoff.reset();
                }
                if stream.ready.len() < self.config.batch_size {
                    break;
                }
            }
            self.confirm(&client, &mut stream);
            if stream.confirmed > saved.0 && saved.1.elapsed() >= self.config.status_interval {
                self.outbox.save_position(stream.confirmed).await?;
                saved = (stream.confirmed, Instant::now());
            }
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
                prefix,
                content,
                ..
            } if prefix == self.outbox.config().prefix() => {
                let at = if transactional {
                    stream.commit_time
                } else {
                    SystemTime::now()
                };
                match codec::decode(&content, at, 1) {
                    Ok(message) => {
                        if transactional {
                            stream.txn.push(message);
                        } else {
                            // Not part of a transaction (not written by `enqueue`):
                            // publishable at once, confirming nothing by itself.
                            stream.push(message, None);
                        }
                    }
                    Err(reason) => {
                        // Not ours to publish, but never skipped silently: it goes to
                        // the dead letters with its raw content.
                        let message = Message::from(outbox_core::message::MessageParts {
                            id: MessageId::new(),
                            destination: UNDECODABLE_DESTINATION.to_owned(),
                            partition_key: None,
                            payload: content.to_vec(),
                            content_type: None,
                            headers: outbox_core::Headers::new(),
                            created_at: at,
                            attempts: 0,
                            last_error: None,
                        });
                        self.outbox
                            .write_dead_letters(&[DeadLetterRow {
                                message,
                                reason: format!("undecodable logical message: {reason}"),
                            }])
                            .await?;
                        self.report.dead_lettered += 1;
                        counter!(DEAD_LETTERED, "slot" => self.slot_label.clone()).increment(1);
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

    /// Publish the first batch of `stream.ready` and settle it. `Some` ends the
    /// session: a retryable failure, to resume after the wait.
    async fn publish_batch(&mut self, stream: &mut Stream) -> Result<Option<(Duration, Error)>> {
        let n = stream.ready.len().min(self.config.batch_size);
        // Count the hand-over: `attempts` says how many times this relay (since it
        // started) has handed the message to the publisher, this time included.
        for message in stream.ready.range_mut(..n) {
            let handed = self.attempts.entry(message.id).or_insert(0);
            *handed += 1;
            message.attempts = *handed;
        }
        let batch = &stream.ready.make_contiguous()[..n];
        let mut outcomes = match self.publisher.publish(batch).await {
            Ok(outcomes) if outcomes.len() == n => outcomes,
            Ok(outcomes) => vec![
                PublishOutcome::Retryable(format!(
                    "publisher returned {} outcomes for {n} messages",
                    outcomes.len()
                ));
                n
            ],
            Err(e) if e.is_retryable() => {
                vec![PublishOutcome::Retryable(e.report().to_string()); n]
            }
            Err(e) => vec![PublishOutcome::Permanent(e.report().to_string()); n],
        };
        // Settled: the prefix before the first message to retry.
        let mut settled = n;
        let mut retry = None;
        for (i, outcome) in outcomes.iter_mut().enumerate() {
            if let PublishOutcome::Retryable(reason) = outcome {
                let attempts = batch[i].attempts;
                if attempts >= self.config.retry.max_attempts {
                    *outcome = PublishOutcome::Permanent(format!(
                        "gave up after {attempts} attempts: {reason}"
                    ));
                } else {
                    settled = i;
                    retry = Some((
                        self.config.retry.delay(attempts),
                        Error::new(
                            ErrorKind::Publish,
                            format!("publish will be retried: {reason}"),
                        )
                        .with_ids(vec![batch[i].id]),
                    ));
                    break;
                }
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
        counter!(PUBLISHED, "slot" => self.slot_label.clone()).increment(published);
        if !dead.is_empty() {
            counter!(DEAD_LETTERED, "slot" => self.slot_label.clone()).increment(dead.len() as u64);
        }
        for _ in 0..settled {
            let message = stream.ready.pop_front().expect("settled within the batch");
            if let Some(end) = stream.ends.pop_front().expect("one end per message") {
                stream.settled_to = Some(end);
            }
            self.attempts.remove(&message.id);
        }
        Ok(retry)
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
    /// confirmed position has been sent, so a resume starts there.
    async fn close(&self, mut client: ReplicationClient, stream: &Stream) {
        if let Err(e) = self.outbox.save_position(stream.confirmed).await {
            tracing::warn!(error = %e.report(), "wal relay: saving the confirmed position failed");
        }
        let metrics = client.metrics();
        let deadline =
            Instant::now() + self.config.status_interval * 2 + Duration::from_millis(500);
        while metrics.last_applied_lsn() < stream.confirmed && Instant::now() < deadline {
            if !client.is_running() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if tokio::time::timeout(Duration::from_secs(5), client.shutdown())
            .await
            .is_err()
        {
            client.abort();
        }
    }

    fn export_lag(&self, bytes: Option<u64>, oldest: Option<SystemTime>) {
        if let Some(bytes) = bytes {
            #[allow(clippy::cast_precision_loss)] // a gauge: f64 is what it takes
            gauge!(SLOT_LAG_BYTES, "slot" => self.slot_label.clone()).set(bytes as f64);
        }
        let age = oldest
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .unwrap_or_default();
        gauge!(SLOT_LAG_SECONDS, "slot" => self.slot_label.clone()).set(age.as_secs_f64());
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
