//! The relay engine: claims due messages, publishes them, settles their leases.
//!
//! # The loop
//!
//! 1. Claim up to [`RelayConfig::batch_size`] due messages with a lease of
//!    [`RelayConfig::lease`] (one atomic store call; rows held elsewhere are skipped).
//! 2. Split the batch into publish calls of [`RelayConfig::publish_batch_size`] and run
//!    up to [`RelayConfig::publish_concurrency`] of them at once, each bounded by
//!    [`RelayConfig::publish_timeout`].
//! 3. After each publish call, complete the published messages in one store call and
//!    fail the rest in another: retryable failures are scheduled by the
//!    [`RetryPolicy`](crate::RetryPolicy), permanent ones and last attempts are
//!    dead-lettered. Both calls are fenced by the lease token.
//! 4. When a claim finds nothing, wait for a [`Wakeup`] or the poll interval, which
//!    doubles on every empty claim up to [`RelayConfig::max_poll_interval`].
//!
//! No lock is held across any of this: explicit [`Relay::dispatch_ids`] calls, other
//! relays in the same or other processes, and this loop coordinate through the store's
//! per-row leases only.
//!
//! # Shutdown
//!
//! [`RelayHandle::shutdown`] stops claiming at once; publish calls not yet started
//! release their leases unattempted; calls in flight get
//! [`RelayConfig::shutdown_grace`] to finish. After the grace they are dropped: their
//! messages are failed with a zero retry delay (the attempt counts, since the broker may
//! have them) and the rest of the batch released, so another relay can take them at
//! once. Explicit [`Relay::dispatch_ids`] calls in flight are not waited for; after
//! shutdown, new ones return at once.
//!
//! ## Limitations
//!
//! - Publishing is at-least-once. A message is published again when a relay dies after
//!   the broker accepted it but before completing, when publishing outlives the lease
//!   (the complete is then rejected as a lost lease), and when shutdown drops a publish
//!   in flight. Consumers deduplicate by message id.
//! - Leases are not renewed. A claimed batch is published in waves of
//!   [`RelayConfig::publish_concurrency`] calls, so the lease must cover every wave:
//!   [`RelayConfig::validate`] requires `waves × publish_timeout < lease`, and a chunk
//!   whose remaining lease is shorter than a publish plus a tenth of the lease is
//!   released instead of published.
//! - [`Relay::dispatch_ids`] is not cancel-safe: if its future is dropped mid-way, the
//!   messages it claimed wait for their lease to lapse (and may publish twice).

mod config;
mod dispatch;
pub mod metrics;
mod wake;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

pub use config::RelayConfig;
pub use wake::Wakeup;

use crate::error::{Error, ErrorKind, Result};
use crate::message::MessageId;
use crate::publisher::Publisher;
use crate::store::{ClaimRequest, ClaimedMessage, OutboxStore};

/// Counts of what a relay (or one dispatch call) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DispatchReport {
    /// Messages claimed.
    pub claimed: u64,
    /// Messages published and completed.
    pub dispatched: u64,
    /// Failed attempts scheduled for retry.
    pub retried: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
    /// Leases given back unattempted.
    pub released: u64,
    /// Settles rejected because the lease was gone.
    pub leases_lost: u64,
}

impl DispatchReport {
    fn add(&mut self, other: &DispatchReport) {
        self.claimed += other.claimed;
        self.dispatched += other.dispatched;
        self.retried += other.retried;
        self.dead_lettered += other.dead_lettered;
        self.released += other.released;
        self.leases_lost += other.leases_lost;
    }
}

#[derive(Debug, Default)]
struct Counters {
    claimed: AtomicU64,
    dispatched: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    released: AtomicU64,
    leases_lost: AtomicU64,
}

impl Counters {
    fn add(&self, r: &DispatchReport) {
        let relaxed = AtomicOrdering::Relaxed;
        self.claimed.fetch_add(r.claimed, relaxed);
        self.dispatched.fetch_add(r.dispatched, relaxed);
        self.retried.fetch_add(r.retried, relaxed);
        self.dead_lettered.fetch_add(r.dead_lettered, relaxed);
        self.released.fetch_add(r.released, relaxed);
        self.leases_lost.fetch_add(r.leases_lost, relaxed);
    }

    fn snapshot(&self) -> DispatchReport {
        let relaxed = AtomicOrdering::Relaxed;
        DispatchReport {
            claimed: self.claimed.load(relaxed),
            dispatched: self.dispatched.load(relaxed),
            retried: self.retried.load(relaxed),
            dead_lettered: self.dead_lettered.load(relaxed),
            released: self.released.load(relaxed),
            leases_lost: self.leases_lost.load(relaxed),
        }
    }
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn OutboxStore>,
    publisher: Arc<dyn Publisher>,
    config: RelayConfig,
    wakeup: Wakeup,
    shutdown: watch::Sender<bool>,
    /// Claims started by the loop, numbered from 1.
    polls: AtomicU64,
    /// The number of the latest loop claim that found nothing due.
    idle: watch::Sender<u64>,
    /// Whether a loop is running: one loop per engine.
    running: AtomicBool,
    counters: Counters,
    metrics: metrics::Handles,
}

/// Moves messages from an [`OutboxStore`] to a [`Publisher`].
///
/// Cheap to clone: clones share one engine, so a service can keep a clone for
/// [`dispatch_ids`](Self::dispatch_ids) and [`wakeup`](Self::wakeup) while the loop
/// runs in a spawned task.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use outbox_core::{Relay, RelayConfig, OutboxStore, Publisher};
/// # async fn demo(store: Arc<dyn OutboxStore>, publisher: Arc<dyn Publisher>) -> outbox_core::Result<()> {
/// let relay = Relay::new(store, publisher, RelayConfig::default().name("orders"))?;
/// let wakeup = relay.wakeup(); // poke after each commit that enqueued messages
/// let handle = relay.spawn();
/// wakeup.wake();
/// // ... on shutdown:
/// let report = handle.shutdown().await?;
/// println!("dispatched {}", report.dispatched);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Relay {
    inner: Arc<Inner>,
}

impl Relay {
    /// A relay over `store` and `publisher`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] when `config` does not validate.
    pub fn new(
        store: Arc<dyn OutboxStore>,
        publisher: Arc<dyn Publisher>,
        config: RelayConfig,
    ) -> Result<Self> {
        config.validate()?;
        let metrics = metrics::Handles::new(&config.name);
        Ok(Relay {
            inner: Arc::new(Inner {
                store,
                publisher,
                config,
                wakeup: Wakeup::new(),
                shutdown: watch::Sender::new(false),
                polls: AtomicU64::new(0),
                idle: watch::Sender::new(0),
                running: AtomicBool::new(false),
                counters: Counters::default(),
                metrics,
            }),
        })
    }

    /// The handle that ends this relay's idle wait.
    pub fn wakeup(&self) -> Wakeup {
        self.inner.wakeup.clone()
    }

    /// The settings.
    pub fn config(&self) -> &RelayConfig {
        &self.inner.config
    }

    /// Totals since the relay was created, across the loop and explicit dispatches.
    pub fn report(&self) -> DispatchReport {
        self.inner.counters.snapshot()
    }

    /// Run the loop in a new task.
    pub fn spawn(&self) -> RelayHandle {
        let relay = self.clone();
        let span = tracing::info_span!("outbox.relay", relay = %self.inner.config.name);
        let task = tokio::spawn(async move { relay.run().await }.instrument(span));
        RelayHandle {
            relay: self.clone(),
            task,
        }
    }

    /// Run the loop in the current task until [`shutdown`](Self::shutdown) is called;
    /// returns the totals. One loop runs per relay: a second call while one runs logs
    /// an error and returns at once (create another `Relay` for more loops).
    pub async fn run(&self) -> DispatchReport {
        let inner = &*self.inner;
        if inner.running.swap(true, AtomicOrdering::SeqCst) {
            tracing::error!("this relay's loop is already running; not starting another");
            return self.report();
        }
        // Cleared however the loop ends, including when its task is aborted.
        let _running = RunningGuard(&inner.running);
        let config = &inner.config;
        let mut shutdown = inner.shutdown.subscribe();
        let mut idle_wait = config.poll_interval;
        while !*shutdown.borrow() {
            let poll = inner.polls.fetch_add(1, AtomicOrdering::SeqCst) + 1;
            let claimed_at = Instant::now();
            match self.claim().await {
                Ok(claimed) if claimed.is_empty() => {
                    inner.idle.send_replace(poll);
                    tokio::select! {
                        _ = inner.wakeup.woken() => idle_wait = config.poll_interval,
                        _ = tokio::time::sleep(idle_wait) => {
                            idle_wait = (idle_wait * 2).min(config.max_poll_interval);
                        }
                        _ = shutdown.wait_for(|stop| *stop) => {}
                    }
                }
                Ok(claimed) => {
                    idle_wait = config.poll_interval;
                    self.process_until_shutdown(claimed, claimed_at, &mut shutdown)
                        .await;
                }
                Err(err) => {
                    tracing::warn!(error = %err, retry_in = ?idle_wait, "claim failed");
                    inner.metrics.store_errors.increment(1);
                    tokio::select! {
                        _ = tokio::time::sleep(idle_wait) => {}
                        _ = shutdown.wait_for(|stop| *stop) => {}
                    }
                    idle_wait = (idle_wait * 2).min(config.max_poll_interval);
                }
            }
        }
        tracing::info!("relay stopped");
        self.report()
    }

    /// Ask the loop to stop (see the module docs on shutdown). Returns at once; await
    /// [`RelayHandle::shutdown`] to wait for the loop to finish.
    pub fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
        self.inner.wakeup.wake();
    }

    /// Claim and publish these messages now, for dispatch right after the enqueuing
    /// commit. Runs in the caller's task, in parallel with the loop and other calls;
    /// ids already claimed elsewhere, not yet due or unknown are skipped.
    ///
    /// Not cancel-safe: see the module docs' limitations. After
    /// [`shutdown`](Self::shutdown) it claims nothing and returns an empty report.
    ///
    /// # Errors
    /// The store's claim error. Publish failures are not errors: they are retried or
    /// dead-lettered as usual and counted in the report.
    pub async fn dispatch_ids(&self, ids: &[MessageId]) -> Result<DispatchReport> {
        if ids.is_empty() || *self.inner.shutdown.borrow() {
            return Ok(DispatchReport::default());
        }
        let claimed_at = Instant::now();
        let claimed = self
            .inner
            .store
            .claim_ids(ids, self.inner.config.lease)
            .instrument(tracing::info_span!("outbox.claim_ids", count = ids.len()))
            .await?;
        Ok(self
            .process(claimed, claimed_at, &dispatch::Started::default())
            .await)
    }

    /// Wait until a loop claim that started after this call finds nothing due.
    ///
    /// Wakes the loop first, so this returns as soon as the relay has caught up. Meant
    /// for tests and for draining before a deploy; messages scheduled for later (retry
    /// backoff, delays) do not keep the relay busy.
    ///
    /// # Errors
    /// [`ErrorKind::Timeout`] when that does not happen within `timeout` (for example
    /// because the loop is not running).
    pub async fn wait_idle(&self, timeout: Duration) -> Result<()> {
        let target = self.inner.polls.load(AtomicOrdering::SeqCst) + 1;
        let mut idle = self.inner.idle.subscribe();
        self.inner.wakeup.wake();
        let reached = tokio::time::timeout(timeout, async {
            idle.wait_for(|seen| *seen >= target).await.is_ok()
        })
        .await;
        match reached {
            Ok(true) => Ok(()),
            Ok(false) | Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!("relay did not become idle within {timeout:?}"),
            )),
        }
    }

    async fn claim(&self) -> Result<Vec<ClaimedMessage>> {
        let config = &self.inner.config;
        let started = Instant::now();
        let claimed = self
            .inner
            .store
            .claim(ClaimRequest::new(config.batch_size, config.lease))
            .instrument(tracing::debug_span!(
                "outbox.claim",
                limit = config.batch_size
            ))
            .await;
        self.inner
            .metrics
            .claim_seconds
            .record(started.elapsed().as_secs_f64());
        claimed
    }

    async fn process_until_shutdown(
        &self,
        claimed: Vec<ClaimedMessage>,
        claimed_at: Instant,
        shutdown: &mut watch::Receiver<bool>,
    ) {
        let leases: Vec<_> = claimed.iter().map(|c| c.lease).collect();
        let grace = self.inner.config.shutdown_grace;
        let started = dispatch::Started::default();
        tokio::select! {
            _ = self.process(claimed, claimed_at, &started) => {}
            _ = async {
                let _ = shutdown.wait_for(|stop| *stop).await;
                tokio::time::sleep(grace).await;
            } => {
                tracing::warn!(count = leases.len(), "shutdown grace expired; abandoning the batch");
                let report = self.abandon(&leases, &started).await;
                self.inner.counters.add(&report);
            }
        }
    }

    /// Handle to the engine for the dispatch module.
    fn inner(&self) -> &Inner {
        &self.inner
    }
}

/// Marks a relay's loop as stopped when dropped.
struct RunningGuard<'a>(&'a AtomicBool);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, AtomicOrdering::SeqCst);
    }
}

/// A relay loop running in its own task. Dropping the handle leaves the loop running;
/// call [`shutdown`](Self::shutdown) to stop it.
#[derive(Debug)]
#[must_use = "dropping the handle leaves the relay running with no way to stop it gracefully"]
pub struct RelayHandle {
    relay: Relay,
    task: JoinHandle<DispatchReport>,
}

impl RelayHandle {
    /// The relay, for [`Relay::dispatch_ids`], [`Relay::wait_idle`] and friends.
    pub fn relay(&self) -> &Relay {
        &self.relay
    }

    /// End the loop's idle wait.
    pub fn wake(&self) {
        self.relay.inner.wakeup.wake();
    }

    /// Stop gracefully (see the module docs) and return the totals.
    ///
    /// # Errors
    /// [`ErrorKind::Storage`] if the loop's task panicked.
    pub async fn shutdown(self) -> Result<DispatchReport> {
        self.relay.shutdown();
        self.task
            .await
            .map_err(|e| Error::new(ErrorKind::Storage, "relay task failed").with_source(e))
    }

    /// Kill the loop without any cleanup, as a crash would, and wait until its task is
    /// gone: leases it holds lapse at their expiry. For tests of crash recovery.
    pub async fn abort(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}
