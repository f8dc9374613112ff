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
//! In the code, `Relay::run` reads as the path of one batch: the pacer (`pacer.rs`)
//! says when to claim, the claim carries what the settler (`settler.rs`) holds, and
//! the claimed batch (`batch.rs`) publishes and hands back its last settle.
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
//!   ([`StoreCapabilities::lease_renewal`](crate::store::StoreCapabilities::lease_renewal)).
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
mod pacer;
mod publish_stage;
mod report;
mod settler;
mod wake;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use config::{RelayConfig, DEFAULT_PIPELINE_DEPTH, MAX_PIPELINE_DEPTH};
pub use publish_stage::{PublishStage, Published};
pub use report::DispatchReport;
pub use wake::Wakeup;

use crate::error::{Error, ErrorKind, Result};
use crate::message::MessageId;
use crate::publisher::Publisher;
use crate::store::{ClaimIds, ClaimRequest, Claimed, ClaimedMessage, OutboxStore};
use batch::Batch;
use pacer::{Next, Pacer};
use publish_stage::panic_message;
use report::Tally;
use settler::{settle_and_claim, Deferred, Settler};

#[derive(Debug)]
struct Inner {
    store: Arc<dyn OutboxStore>,
    /// The publisher, behind the publish timeout and the panic guard.
    stage: PublishStage,
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
    /// Every count, and the metrics.
    tally: Tally,
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
/// let relay = Relay::new(store, publisher, RelayConfig::default().with_name("orders"))?
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
        let capabilities = store.capabilities();
        let renews = capabilities.lease_renewal;
        config.validate_for(renews)?;
        if let Some(bound) = capabilities.batches_in_flight {
            // The loop holds up to `pipeline_depth` batches; one more for an explicit
            // dispatch beside it.
            let needs = config.pipeline_depth.saturating_add(1);
            if needs > bound {
                return Err(Error::config(format!(
                    "the store holds at most {bound} claimed batches at once (one connection \
                     each, held-lock claims): this relay needs {needs} (pipeline_depth {} plus \
                     one for dispatch_ids); give the store more held connections or lower \
                     pipeline_depth",
                    config.pipeline_depth
                )));
            }
        }
        let metrics = metrics::Handles::new(&config.name);
        Ok(Relay {
            inner: Arc::new(Inner {
                store,
                stage: PublishStage::new(publisher, &config.name, config.publish_timeout),
                config,
                wakeup: Wakeup::new(),
                stop: CancellationToken::new(),
                polls: AtomicU64::new(0),
                idle: watch::Sender::new(0),
                running: AtomicBool::new(false),
                loops_ended: AtomicU64::new(0),
                tally: Tally::new(metrics),
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
        let mut woken = inner.wakeup.subscribe();
        let mut pacer = Pacer::new(&inner.config);
        // Batches claimed and publishing; each yields its deferred settle.
        let mut batches: Batches<'_> = FuturesUnordered::new();
        let mut settler = Settler::default();
        while !inner.stop.is_cancelled() {
            let now = Instant::now();
            if let Next::Wait { until, wakeups } =
                pacer.next(now, batches.len(), settler.is_carrying())
            {
                tokio::select! {
                    Some(deferred) = batches.next() => {
                        settler.hold(deferred);
                        pacer.batch_ended();
                    }
                    () = woken.woken(), if wakeups => pacer.asked(),
                    () = sleep_until(until), if until.is_some() => pacer.asked(),
                    () = inner.stop.cancelled() => {}
                }
                continue;
            }
            pacer.claim_sent();
            let poll = inner.polls.fetch_add(1, AtomicOrdering::SeqCst) + 1;
            woken.seen();
            // With nothing in flight, this claim carries every settle: if it finds
            // nothing, the relay has caught up.
            let caught_up_if_empty = batches.is_empty();
            let claimed_at = Instant::now();
            let claim = self.claim_next(settler.take());
            match drive(&mut batches, &mut settler, claim).await {
                Claim::Found(messages) => {
                    pacer.found(messages.len(), claimed_at, Instant::now());
                    batches.push(self.batch(messages, claimed_at));
                }
                Claim::AllDeadLettered => pacer.all_dead_lettered(),
                Claim::Nothing => {
                    // (Nothing can have joined `batches` during the claim.)
                    pacer.found_nothing(caught_up_if_empty);
                    if caught_up_if_empty {
                        inner.idle.send_replace(poll);
                        tokio::select! {
                            () = woken.woken() => pacer.woken_while_idle(),
                            () = tokio::time::sleep(pacer.idle_delay()) => {}
                            () = inner.stop.cancelled() => {}
                        }
                    }
                }
                Claim::Failed => {
                    pacer.failed();
                    let pause = tokio::time::sleep(pacer.idle_delay());
                    let wait = async {
                        tokio::select! {
                            () = pause => {}
                            () = inner.stop.cancelled() => {}
                        }
                    };
                    drive(&mut batches, &mut settler, wait).await;
                }
            }
        }
        self.stop_settling(batches, settler).await;
        tracing::info!("relay stopped");
        self.report()
    }

    /// The end of the loop: settles already held go at once, on their own, while the
    /// batches in flight finish within the shutdown grace (see `Batch`); a settle one
    /// of them leaves goes as soon as it ends. None waits for another batch's publish,
    /// so no finished batch's leases lapse behind a slow one.
    async fn stop_settling(&self, mut batches: Batches<'_>, mut settler: Settler) {
        let inner = &*self.inner;
        let mut settles = FuturesUnordered::new();
        settles.extend(settler.take().map(|d| d.settle_alone(inner)));
        loop {
            tokio::select! {
                Some(done) = batches.next() => {
                    settles.extend(done.map(|d| d.settle_alone(inner)));
                }
                Some(()) = settles.next() => {}
                else => break,
            }
        }
    }

    /// Claim the loop's next batch, carrying `deferred` settles (in one store call
    /// when there are any); counts what the claim dead-lettered, and a failure. A
    /// panic is caught, logged and counted: the leases of the claim, and of the
    /// settles it carried, lapse.
    async fn claim_next(&self, deferred: Option<Deferred>) -> Claim {
        let inner = &*self.inner;
        let span = tracing::debug_span!("outbox.claim", limit = inner.config.batch_size);
        let claim = AssertUnwindSafe(
            async {
                let request = ClaimRequest::new(inner.config.batch_size, inner.config.lease)?;
                let started = Instant::now();
                let claimed = match deferred {
                    Some(deferred) => match settle_and_claim(inner, deferred, request).await? {
                        Some(claimed) => Ok(claimed),
                        None => self.claim(request).await,
                    },
                    None => self.claim(request).await,
                };
                inner
                    .tally
                    .metrics()
                    .claim_seconds
                    .record(started.elapsed().as_secs_f64());
                claimed
            }
            .instrument(span),
        );
        let (claim, counted) = match claim.catch_unwind().await {
            Ok(Ok(claimed)) => {
                let dead_lettered = claimed.dead_lettered as u64;
                let claim = if !claimed.messages.is_empty() {
                    Claim::Found(claimed.messages)
                } else if dead_lettered > 0 {
                    Claim::AllDeadLettered
                } else {
                    Claim::Nothing
                };
                let counted = DispatchReport {
                    dead_lettered,
                    ..DispatchReport::default()
                };
                (claim, counted)
            }
            Ok(Err(err)) => {
                tracing::warn!(error = %err.report(), "claim failed");
                let counted = DispatchReport {
                    store_errors: 1,
                    ..DispatchReport::default()
                };
                (Claim::Failed, counted)
            }
            Err(panic) => {
                tracing::error!(
                    panic = %panic_message(&*panic),
                    "relay claim panicked; the loop carries on"
                );
                let counted = DispatchReport {
                    panics: 1,
                    ..DispatchReport::default()
                };
                (Claim::Failed, counted)
            }
        };
        if counted != DispatchReport::default() {
            inner.tally.record(&counted);
        }
        claim
    }

    /// Publish a claimed batch of the loop and settle it, but for the settle of its
    /// last publish call, which it yields for the next claim. A panic is caught, logged
    /// and counted; the batch's leases then lapse.
    fn batch(&self, claimed: Vec<ClaimedMessage>, claimed_at: Instant) -> BatchRun<'_> {
        let inner = &*self.inner;
        async move {
            let run = AssertUnwindSafe(async {
                Batch::new(inner, claimed, claimed_at)
                    .publish_deferring_last(&inner.stop)
                    .await
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

    async fn claim(&self, request: ClaimRequest) -> Result<Claimed> {
        self.inner.store.claim(request).await
    }
}

/// What one claim of the loop came back with.
enum Claim {
    /// Messages to publish.
    Found(Vec<ClaimedMessage>),
    /// Rows, every one dead-lettered by the store: more may be due at once.
    AllDeadLettered,
    /// Nothing due.
    Nothing,
    /// The claim failed or panicked (logged and counted).
    Failed,
}

/// One claimed batch of the loop, publishing; yields its deferred settle.
type BatchRun<'a> = BoxFuture<'a, Option<Deferred>>;
/// The loop's batches in flight.
type Batches<'a> = FuturesUnordered<BatchRun<'a>>;

/// Await `work` while the batches in flight go on publishing; the settles of those that
/// finish meanwhile join the settler.
async fn drive<F: Future>(batches: &mut Batches<'_>, settler: &mut Settler, work: F) -> F::Output {
    tokio::pin!(work);
    loop {
        tokio::select! {
            biased;
            out = &mut work => return out,
            Some(done) = batches.next(), if !batches.is_empty() => settler.hold(done),
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
