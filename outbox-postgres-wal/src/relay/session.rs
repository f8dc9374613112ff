//! The relay's sessions, one after another: the one-relay-per-slot lock (a standby
//! waits for it), connecting to the replication slot, the session loop (read, publish,
//! confirm), closing a session, and what follows its end: stop, or resume after the
//! retry delay or the reconnect backoff, keeping the lock or taking it again
//! (protocol steps 1, 2, 6 and 7 of [`WalRelay`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use outbox_core::backend::Backoff;
use outbox_core::{lock::LockGuard, DistributedLock, Error, ErrorKind, LockName, Result};
use outbox_postgres::PgDistributedLock;
use pgwire_replication::{FeedbackObserver, ReplicationClient, ReplicationConfig};
use tokio_util::sync::CancellationToken;

use super::lag::lag_ticks;
use super::publish::BatchEnd;
use super::stream::Stream;
use super::WalRelay;
use crate::error::from_wire;

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

impl WalRelay {
    /// Take the slot's lock and run sessions one after another, until shutdown (`Ok`)
    /// or a permanent failure; see the protocol.
    pub(super) async fn run_sessions(&mut self, shutdown: &CancellationToken) -> Result<()> {
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
                None => match self.acquire(&lock, &name, shutdown, &mut backoff).await? {
                    Some(guard) => guard,
                    None => return Ok(()),
                },
            };
            let outcome = self.session(shutdown, &mut backoff).await;
            let wait = match outcome {
                Ok(SessionEnd::Shutdown) => {
                    release(guard).await;
                    return Ok(());
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
            if sleep_or_shutdown(wait, shutdown).await {
                if let Some(guard) = held.take() {
                    release(guard).await;
                }
                return Ok(());
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
                    self.standby_lag().await;
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
                        self.session_lag(stream.oldest()).await?;
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
