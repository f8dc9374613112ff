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
//!    dead-lettered. Both calls are fenced by the lease token. The publish call that
//!    finishes last in a batch does not settle on its own: its completes and failures
//!    go with the next claim in one store call,
//!    [`OutboxStore::settle_and_claim`] (one statement on PostgreSQL), so a busy relay
//!    pays one round trip between batches. If that call fails, the settle is retried
//!    on its own and the claim made as usual; when the relay is stopping, the settle
//!    goes on its own.
//! 4. When a claim finds nothing, wait for a [`Wakeup`] or the poll interval, which
//!    doubles on every empty claim up to [`RelayConfig::max_poll_interval`].
//!
//! ## Pipelining
//!
//! One loop may have up to [`RelayConfig::pipeline_depth`] claimed batches at once (2
//! by default). While batches publish, the loop claims the next one when a batch has
//! finished and left the settle of its last publish call (which goes with the claim),
//! when a [`Wakeup`] or the poll interval asks for one (wake-ups wait for a batch to
//! end or the poll after a claim that found nothing), or, while claims come back full
//! (a backlog), once the newest batch has been publishing for as long as its claim
//! took. A publish faster than a
//! claim so ends before the next claim goes out, and the relay pays one statement per
//! batch as without pipelining; a slower one has the next batch claimed while it runs,
//! so database and broker round trips overlap instead of adding up. Nothing else changes: each
//! batch has its own leases and tokens, each runs its own
//! [`RelayConfig::publish_concurrency`] calls, and per-key order still holds because a
//! store hands out only a key's oldest undelivered message, which stays undelivered
//! while an earlier batch holds it. The settles of batches that finish while a claim
//! is in flight are merged into the next claim's call. The loop counts as idle
//! ([`Relay::wait_idle`]) only when a claim made with no batch in flight finds nothing,
//! so every settle has landed by then. Depth 1 turns pipelining off.
//!
//! No lock is held across any of this: explicit [`Relay::dispatch_ids`] calls, other
//! relays in the same or other processes, and this loop coordinate through the store's
//! per-row leases only.
//!
//! # Shutdown
//!
//! [`RelayHandle::shutdown`] (or the signal given to [`Relay::with_shutdown`], such as
//! a `tokio_util::sync::CancellationToken` of the service's shutdown tree) stops
//! claiming at once; publish calls not yet started, in every batch in flight, release
//! their leases unattempted; calls in flight get [`RelayConfig::shutdown_grace`] to finish. After the grace they are dropped: their
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
//! - Leases are renewed only on stores that declare it
//!   ([`StoreCapabilities::lease_renewal`](crate::StoreCapabilities::lease_renewal)).
//!   A claimed batch is published in waves of [`RelayConfig::publish_concurrency`]
//!   calls. One rule, [`RelayConfig::lease_allows_publish`], decides whether a chunk
//!   may start: its remaining lease must cover a publish plus a tenth of the lease.
//!   On a renewing store, a chunk that finds too little left first renews the batch's
//!   unsettled leases ([`OutboxStore::renew`], fenced by token), so only the first wave
//!   must fit in a lease ([`RelayConfig::validate_for`]). On other stores the chunk is
//!   released instead of published, and [`RelayConfig::validate`] refuses a config
//!   under which the last wave could not start after a claim that took a twentieth of
//!   the lease ([`RelayConfig::claim_allowance`]).
//! - Settles that hit retryable storage errors are retried with backoff until the
//!   batch's lease lapses; then the leases are left to lapse and the messages publish
//!   again.
//!
//! # Failures
//!
//! Errors are logged with their whole cause chain ([`Error::report`]). A panic in a
//! publisher fails that publish call's messages (retryable, so a publisher that always
//! panics dead-letters them in the end); a panic anywhere else in a claim or a batch is
//! caught, logged with its message and counted (`outbox_relay_panics_total`,
//! [`DispatchReport::panics`]), and the loop goes on; the batch's leases lapse (for a
//! claim, also those of the settles it carried, from every batch merged into it).
//! [`RelayHandle::is_running`] is a liveness check.
//! - [`Relay::dispatch_ids`] is not cancel-safe: if its future is dropped mid-way, the
//!   messages it claimed wait for their lease to lapse (and may publish twice).
//!
//! # Tracing
//!
//! Spans, for filtering and for trace backends:
//!
//! - `outbox.relay` (info, field `relay`): the loop of [`Relay::spawn`];
//! - `outbox.claim` (debug, field `limit`): one claim of the loop;
//! - `outbox.claim_ids` (info, field `count`): the claim of [`Relay::dispatch_ids`];
//! - `outbox.publish` (info, fields `relay`, `count`, `first_id`): one call to
//!   [`Publisher::publish`]. With the feature `otel` it links to the trace context
//!   each message carries (see the `otel` module).

mod batch;
mod config;
pub mod metrics;
mod wake;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use config::{RelayConfig, DEFAULT_PIPELINE_DEPTH, MAX_PIPELINE_DEPTH};
pub use wake::Wakeup;

use crate::backoff::Backoff;
use crate::error::{Error, ErrorKind, Result};
use crate::message::MessageId;
use crate::publisher::Publisher;
use crate::store::{ClaimIds, ClaimRequest, Claimed, ClaimedMessage, OutboxStore, Settlement};
use batch::{count_settled, panic_message, settle, settle_outcomes, Batch, Deferred};

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
    /// Storage calls that failed for good (a claim, or a settle given up on).
    pub store_errors: u64,
    /// Panics caught (in a claim, a publisher, a batch).
    pub panics: u64,
}

impl DispatchReport {
    fn add(&mut self, other: &DispatchReport) {
        self.claimed += other.claimed;
        self.dispatched += other.dispatched;
        self.retried += other.retried;
        self.dead_lettered += other.dead_lettered;
        self.released += other.released;
        self.leases_lost += other.leases_lost;
        self.store_errors += other.store_errors;
        self.panics += other.panics;
    }
}

/// The one place a relay's counts go: the running totals behind [`Relay::report`] and
/// the `metrics` counters, fed together.
#[derive(Debug)]
struct Tally {
    totals: std::sync::Mutex<DispatchReport>,
    metrics: metrics::Handles,
}

impl Tally {
    fn record(&self, r: &DispatchReport) {
        self.totals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .add(r);
        self.metrics.add(r);
    }

    fn snapshot(&self) -> DispatchReport {
        *self
            .totals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn OutboxStore>,
    publisher: Arc<dyn Publisher>,
    config: RelayConfig,
    wakeup: Wakeup,
    /// Cancelled when the relay is to stop.
    stop: CancellationToken,
    /// Claims started by the loop, numbered from 1.
    polls: AtomicU64,
    /// The number of the latest loop claim that found nothing due.
    idle: watch::Sender<u64>,
    /// Whether a loop is running: one loop per engine.
    running: AtomicBool,
    /// Loops that have ended (however: shutdown, panic, abort); each end also wakes
    /// the watchers of `idle`.
    loops_ended: AtomicU64,
    tally: Tally,
    metrics: metrics::Handles,
    /// The store declares lease renewal: batches renew their leases before a wave
    /// that would not fit in what is left.
    renews: bool,
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
/// // The service's shutdown tree; cancelling it stops the relay too.
/// let shutdown = tokio_util::sync::CancellationToken::new();
/// let relay = Relay::new(store, publisher, RelayConfig::default().name("orders"))?
///     .with_shutdown(shutdown.clone().cancelled_owned());
/// let wakeup = relay.wakeup(); // poke after each commit that enqueued messages
/// let handle = relay.spawn();
/// wakeup.wake();
/// // ... on shutdown (or just `shutdown.cancel()` and await the handle's task):
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
        let renews = store.capabilities().lease_renewal;
        config.validate_for(renews)?;
        let metrics = metrics::Handles::new(&config.name);
        Ok(Relay {
            inner: Arc::new(Inner {
                store,
                publisher,
                config,
                wakeup: Wakeup::new(),
                stop: CancellationToken::new(),
                polls: AtomicU64::new(0),
                idle: watch::Sender::new(0),
                running: AtomicBool::new(false),
                loops_ended: AtomicU64::new(0),
                tally: Tally {
                    totals: std::sync::Mutex::default(),
                    metrics: metrics.clone(),
                },
                metrics,
                renews,
            }),
        })
    }

    /// Stop the relay gracefully when `signal` resolves, as
    /// [`RelayHandle::shutdown`] would: pass a service's shutdown signal, or
    /// `token.cancelled_owned()` of a `tokio_util::sync::CancellationToken` so one
    /// cancellation stops relays, listeners and purgers together.
    ///
    /// Spawns a task that waits for `signal`, so it must be called within a Tokio
    /// runtime.
    #[must_use]
    pub fn with_shutdown(self, signal: impl Future<Output = ()> + Send + 'static) -> Self {
        let stop = self.inner.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = signal => stop.cancel(),
                () = stop.cancelled() => {}
            }
        });
        self
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
    ///
    /// They count what the relay saw acknowledged. After
    /// [`RelayHandle::abort`] (or a crash) they can fall short of what happened in
    /// storage: a complete that landed while the relay was killed waiting for its
    /// answer is not counted. Read [`OutboxAdmin::stats`](crate::OutboxAdmin::stats)
    /// for the store's own figures.
    pub fn report(&self) -> DispatchReport {
        self.inner.tally.snapshot()
    }

    /// Whether the relay was told to stop.
    pub fn is_stopping(&self) -> bool {
        self.inner.stop.is_cancelled()
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

    /// Run the loop in the current task until the relay is told to stop
    /// ([`with_shutdown`](Self::with_shutdown)'s signal, or [`RelayHandle::shutdown`]
    /// of a spawned loop); returns the totals. One loop runs per relay: a second call
    /// while one runs logs an error and returns at once (create another `Relay` for
    /// more loops).
    pub async fn run(&self) -> DispatchReport {
        let inner = &*self.inner;
        if inner.running.swap(true, AtomicOrdering::SeqCst) {
            tracing::error!("this relay's loop is already running; not starting another");
            return self.report();
        }
        // Cleared however the loop ends, including when its task is aborted.
        let _running = RunningGuard(inner);
        let config = &inner.config;
        let depth = config.pipeline_depth.max(1);
        let mut woken = inner.wakeup.subscribe();
        let mut idle = Backoff::new(config.poll_interval, config.max_poll_interval);
        // Batches claimed and publishing; each yields its deferred settle.
        let mut batches: Batches<'_> = FuturesUnordered::new();
        // Settles of finished batches, sent with the next claim.
        let mut carried: Vec<Deferred> = Vec::new();
        // When the next claim should go out ahead of the batches in flight, if they
        // are still publishing then: set while the last claim came back full (more is
        // probably due) to when the newest batch has published for as long as its
        // claim took. A publish faster than a claim thus ends first and its settle goes
        // with the next claim, as without pipelining; a slower one gets the next batch
        // claimed while it runs.
        // On Tokio's clock, as every timer of the loop, so tests may pause it.
        let mut claim_ahead_at: Option<tokio::time::Instant> = None;
        // A wakeup, the poll or `claim_ahead_at` asked for a claim while batches were in
        // flight.
        let mut asked = false;
        // The poll while batches are in flight, on a schedule of its own so that a
        // wait cut short by a batch ending does not move the idle schedule: it doubles
        // on every claim that finds nothing and starts over when one finds work.
        let mut busy = Backoff::new(config.poll_interval, config.max_poll_interval);
        let mut poll_at: Option<tokio::time::Instant> = None;
        // The last claim, made with batches in flight, found nothing: wake-ups wait for
        // a batch to end or the poll, so a burst of them does not claim back to back
        // against rows still blocked behind the batches in flight.
        let mut found_nothing = false;
        while !inner.stop.is_cancelled() {
            let may_claim = batches.len() < depth;
            let claim_now = may_claim && (batches.is_empty() || asked || !carried.is_empty());
            if !claim_now {
                let next = if !may_claim {
                    None
                } else if claim_ahead_at.is_some() {
                    claim_ahead_at
                } else {
                    Some(
                        *poll_at
                            .get_or_insert_with(|| tokio::time::Instant::now() + busy.next_delay()),
                    )
                };
                tokio::select! {
                    Some(done) = batches.next() => {
                        carried.extend(done);
                        // A batch ended: its slot may take a claim a wake-up asked for.
                        found_nothing = false;
                    }
                    () = woken.woken(), if may_claim && !found_nothing => asked = true,
                    () = sleep_until(next), if next.is_some() => asked = true,
                    () = inner.stop.cancelled() => {}
                }
                continue;
            }
            asked = false;
            found_nothing = false;
            poll_at = None;
            let poll = inner.polls.fetch_add(1, AtomicOrdering::SeqCst) + 1;
            woken.seen();
            // With nothing in flight, this claim carries every settle: if it finds
            // nothing, the relay has caught up.
            let caught_up_if_empty = batches.is_empty();
            let claimed_at = Instant::now();
            let sent = tokio::time::Instant::now();
            let deferred = Deferred::merge(std::mem::take(&mut carried));
            let claim = AssertUnwindSafe(async {
                match deferred {
                    Some(deferred) => match self.settle_and_claim(deferred).await? {
                        Some(claimed) => Ok(claimed),
                        None => self.claim().await,
                    },
                    None => self.claim().await,
                }
            })
            .catch_unwind();
            let outcome = drive(&mut batches, &mut carried, claim).await;
            let failed = match outcome.map(|claim| claim.map(|c| self.count_dead_letters(c))) {
                Ok(Ok(Some(claimed))) if !claimed.is_empty() => {
                    let now = tokio::time::Instant::now();
                    claim_ahead_at = (claimed.len() >= config.batch_size)
                        .then(|| now + now.saturating_duration_since(sent));
                    idle.reset();
                    busy.reset();
                    batches.push(self.batch(claimed, claimed_at));
                    continue;
                }
                Ok(Ok(None)) => {
                    // The claim dead-lettered every row it took: more may be due.
                    asked = true;
                    continue;
                }
                Ok(Ok(_)) => {
                    claim_ahead_at = None;
                    found_nothing = !caught_up_if_empty;
                    // (Nothing can have joined `batches` during the claim.)
                    if caught_up_if_empty {
                        inner.idle.send_replace(poll);
                        tokio::select! {
                            () = woken.woken() => idle.reset(),
                            () = idle.wait() => {}
                            () = inner.stop.cancelled() => {}
                        }
                    }
                    continue;
                }
                Ok(Err(err)) => {
                    tracing::warn!(error = %err.report(), "claim failed");
                    DispatchReport {
                        store_errors: 1,
                        ..DispatchReport::default()
                    }
                }
                Err(panic) => {
                    tracing::error!(
                        panic = %panic_message(&*panic),
                        "relay claim panicked; the loop carries on"
                    );
                    DispatchReport {
                        panics: 1,
                        ..DispatchReport::default()
                    }
                }
            };
            claim_ahead_at = None;
            drive(
                &mut batches,
                &mut carried,
                self.after_failure(&mut idle, failed),
            )
            .await;
        }
        // Stopping: settles already waiting go at once, on their own, while the batches
        // in flight finish within the shutdown grace (see `Batch`); a settle one of
        // them left goes as soon as it ends. None waits for another batch's publish,
        // so no finished batch's leases lapse behind a slow one.
        let mut settles = FuturesUnordered::new();
        settles.extend(Deferred::merge(carried).map(|d| self.settle_deferred(d)));
        loop {
            tokio::select! {
                Some(done) = batches.next() => {
                    settles.extend(done.map(|d| self.settle_deferred(d)));
                }
                Some(()) = settles.next() => {}
                else => break,
            }
        }
        tracing::info!("relay stopped");
        self.report()
    }

    /// Settle a deferred settle on its own (when stopping), counting what it did.
    async fn settle_deferred(&self, deferred: Deferred) {
        let inner = &*self.inner;
        let report =
            settle_outcomes(inner, &deferred.done, &deferred.failures, deferred.deadline).await;
        inner.tally.record(&report);
    }

    /// Publish a claimed batch of the loop and settle it, but for the settle of its
    /// last publish call, which it yields for the next claim. A panic is caught, logged
    /// and counted; the batch's leases then lapse.
    fn batch(&self, claimed: Vec<ClaimedMessage>, claimed_at: Instant) -> BatchRun<'_> {
        let inner = &*self.inner;
        async move {
            let run = AssertUnwindSafe(async {
                let batch = Batch::new(inner, claimed, claimed_at).deferring_last_settle();
                batch.publish_until(&inner.stop).await;
                batch.take_deferred()
            });
            match run.catch_unwind().await {
                Ok(deferred) => deferred,
                Err(panic) => {
                    tracing::error!(
                        panic = %panic_message(&*panic),
                        "relay batch panicked; its leases lapse, the loop carries on"
                    );
                    inner.tally.record(&DispatchReport {
                        panics: 1,
                        ..DispatchReport::default()
                    });
                    None
                }
            }
        }
        .boxed()
    }

    /// Settle the last batch's deferred chunk and claim the next batch in one store
    /// call ([`OutboxStore::settle_and_claim`]). When that call fails the settle is
    /// retried on its own, as any settle is, and `Ok(None)` tells the caller to claim
    /// as usual.
    ///
    /// # Errors
    /// The claim's error, after the settle applied.
    async fn settle_and_claim(&self, deferred: Deferred) -> Result<Option<Claimed>> {
        let inner = &*self.inner;
        let config = &inner.config;
        let request = ClaimRequest::new(config.batch_size, config.lease)?;
        let settlement = Settlement {
            complete: &deferred.done,
            fail: &deferred.failures,
            release: &[],
        };
        let started = Instant::now();
        let outcome = inner
            .store
            .settle_and_claim(settlement, request)
            .instrument(tracing::debug_span!(
                "outbox.claim",
                limit = config.batch_size
            ))
            .await;
        inner
            .metrics
            .claim_seconds
            .record(started.elapsed().as_secs_f64());
        match outcome {
            Ok(done) => {
                let report = count_settled(
                    Ok(batch::SettleOutcome::first_try(done.completed)),
                    Ok(batch::SettleOutcome::first_try(done.failed)),
                    &deferred.failures,
                );
                inner.tally.record(&report);
                done.claimed.map(Some)
            }
            Err(err) if err.is_retryable() => {
                tracing::warn!(
                    count = deferred.done.len() + deferred.failures.len(),
                    error = %err.report(),
                    "settle and claim failed; retrying the settle on its own"
                );
                let store = &inner.store;
                let (done, failures) = (&deferred.done, &deferred.failures);
                let (completed, failed) = futures::join!(
                    settle(deferred.deadline, "complete", done.len(), || store
                        .complete(done)),
                    settle(deferred.deadline, "fail", failures.len(), || store
                        .fail(failures)),
                );
                // The first try may have applied: leases now reported lost may be ones
                // it settled.
                let report = count_settled(
                    completed.map(batch::SettleOutcome::retried),
                    failed.map(batch::SettleOutcome::retried),
                    failures,
                );
                inner.tally.record(&report);
                Ok(None)
            }
            Err(err) => {
                tracing::error!(
                    count = deferred.done.len() + deferred.failures.len(),
                    error = %err.report(),
                    "settle and claim failed; leases will lapse and the messages publish again"
                );
                inner.tally.record(&DispatchReport {
                    store_errors: 1,
                    ..DispatchReport::default()
                });
                Ok(None)
            }
        }
    }

    /// Count a failed step and back off before the next claim.
    async fn after_failure(&self, idle: &mut Backoff, counted: DispatchReport) {
        self.inner.tally.record(&counted);
        tokio::select! {
            () = idle.wait() => {}
            () = self.inner.stop.cancelled() => {}
        }
    }

    /// Claim and publish these messages now, for dispatch right after the enqueuing
    /// commit. Runs in the caller's task, in parallel with the loop and other calls;
    /// ids already claimed elsewhere, not yet due or unknown are skipped.
    ///
    /// Not cancel-safe: see the module docs' limitations. Once the relay is stopping
    /// it claims nothing and returns an empty report.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for more than
    /// [`MAX_CLAIM_BATCH`](crate::store::MAX_CLAIM_BATCH) ids; the store's claim error.
    /// Publish failures are not errors: they are retried or dead-lettered as usual and
    /// counted in the report.
    pub async fn dispatch_ids(&self, ids: &[MessageId]) -> Result<DispatchReport> {
        if ids.is_empty() || self.inner.stop.is_cancelled() {
            return Ok(DispatchReport::default());
        }
        let request = ClaimIds::new(ids, self.inner.config.lease)?;
        let claimed_at = Instant::now();
        let claimed = self
            .inner
            .store
            .claim_ids(&request)
            .instrument(tracing::info_span!("outbox.claim_ids", count = ids.len()))
            .await?;
        let dead_lettered = claimed.dead_lettered as u64;
        if dead_lettered > 0 {
            self.inner.tally.record(&DispatchReport {
                dead_lettered,
                ..DispatchReport::default()
            });
        }
        let mut report = Batch::new(&self.inner, claimed.messages, claimed_at)
            .publish()
            .await;
        report.dead_lettered += dead_lettered;
        Ok(report)
    }

    /// Wait until a loop claim that started after this call, with no batch in flight,
    /// finds nothing due (so every settle it or an earlier claim carried has been
    /// sent).
    ///
    /// Wakes the loop first, so this returns as soon as the relay has caught up. Meant
    /// for tests and for draining before a deploy; messages scheduled for later (retry
    /// backoff, delays) do not keep the relay busy.
    ///
    /// # Errors
    /// - [`ErrorKind::Unavailable`] as soon as the loop ends (shut down, panicked,
    ///   aborted) before it became idle.
    /// - [`ErrorKind::Timeout`] when it does not become idle within `timeout` (for
    ///   example because no loop is running).
    pub async fn wait_idle(&self, timeout: Duration) -> Result<()> {
        let inner = &self.inner;
        let target = inner.polls.load(AtomicOrdering::SeqCst) + 1;
        let ended = inner.loops_ended.load(AtomicOrdering::SeqCst);
        let mut idle = inner.idle.subscribe();
        inner.wakeup.wake();
        let reached = tokio::time::timeout(timeout, async {
            let mut outcome = None;
            let _ = idle
                .wait_for(|seen| {
                    if *seen >= target {
                        outcome = Some(true);
                    } else if inner.loops_ended.load(AtomicOrdering::SeqCst) != ended {
                        outcome = Some(false);
                    }
                    outcome.is_some()
                })
                .await;
            outcome
        })
        .await;
        match reached {
            Ok(Some(true)) => Ok(()),
            Ok(Some(false)) => Err(Error::new(
                ErrorKind::Unavailable,
                "the relay loop ended before it became idle",
            )),
            Ok(None) | Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!("relay did not become idle within {timeout:?}"),
            )),
        }
    }

    /// Count the rows a claim dead-lettered, as the relay's own dead letters, and hand
    /// over its messages: `Some` when there are any, `None` when the claim took rows
    /// but dead-lettered every one, and an empty vector when it found nothing.
    fn count_dead_letters(&self, claimed: Claimed) -> Option<Vec<ClaimedMessage>> {
        let dead_lettered = claimed.dead_lettered as u64;
        if dead_lettered > 0 {
            self.inner.tally.record(&DispatchReport {
                dead_lettered,
                ..DispatchReport::default()
            });
        }
        if dead_lettered > 0 && claimed.messages.is_empty() {
            None
        } else {
            Some(claimed.messages)
        }
    }

    async fn claim(&self) -> Result<Claimed> {
        let config = &self.inner.config;
        let request = ClaimRequest::new(config.batch_size, config.lease)?;
        let started = Instant::now();
        let claimed = self
            .inner
            .store
            .claim(request)
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
}

/// One claimed batch of the loop, publishing; yields its deferred settle.
type BatchRun<'a> = BoxFuture<'a, Option<Deferred>>;
/// The loop's batches in flight.
type Batches<'a> = FuturesUnordered<BatchRun<'a>>;

/// Await `work` while the batches in flight go on publishing; the settles of those that
/// finish meanwhile join `carried`.
async fn drive<F: Future>(
    batches: &mut Batches<'_>,
    carried: &mut Vec<Deferred>,
    work: F,
) -> F::Output {
    tokio::pin!(work);
    loop {
        tokio::select! {
            biased;
            out = &mut work => return out,
            Some(done) = batches.next(), if !batches.is_empty() => carried.extend(done),
        }
    }
}

/// Sleep until `at`; `None` never comes.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Marks a relay's loop as stopped when dropped.
struct RunningGuard<'a>(&'a Inner);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.running.store(false, AtomicOrdering::SeqCst);
        self.0.loops_ended.fetch_add(1, AtomicOrdering::SeqCst);
        // Wake `wait_idle` callers: the loop they wait on will not get idle.
        self.0.idle.send_modify(|_| {});
    }
}

/// A relay loop running in its own task. Dropping the handle leaves the loop running
/// (until the relay's [`with_shutdown`](Relay::with_shutdown) signal, if any).
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

    /// Liveness: `true` while the loop's task runs. It ends only after a shutdown
    /// (panics inside the loop are caught and counted), so `false` without one means
    /// the task was aborted or the runtime is shutting down.
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Stop gracefully (see the module docs) and return the totals.
    ///
    /// # Errors
    /// [`ErrorKind::Panicked`] with the panic's message if the loop's task panicked
    /// outside the steps it guards; [`ErrorKind::Unavailable`] if it was aborted.
    pub async fn shutdown(self) -> Result<DispatchReport> {
        self.relay.inner.stop.cancel();
        self.task.await.map_err(|e| {
            if e.is_panic() {
                let message = panic_message(&*e.into_panic());
                Error::new(
                    ErrorKind::Panicked,
                    format!("relay loop panicked: {message}"),
                )
            } else {
                Error::new(ErrorKind::Unavailable, "relay loop was cancelled").with_source(e)
            }
        })
    }

    /// Kill the loop without any cleanup, as a crash would, and wait until its task is
    /// gone: leases it holds are not released and lapse at their expiry, when another
    /// relay publishes their messages again. For a supervisor that cannot wait for
    /// [`shutdown`](Self::shutdown)'s grace period, and for tests of crash recovery.
    pub async fn abort(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}
