//! One claimed batch, from publish to settled leases: [`Batch`].

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::settler::Deferred;
use super::{DispatchReport, Inner};
use crate::backoff::Backoff;
use crate::error::Result;
use crate::message::{Message, MessageId};
use crate::publisher::PublishOutcome;
use crate::store::{ClaimedMessage, Disposition, Failure, Lease, Settled};

/// The messages one claim returned, with the time the claim started (their leases are
/// measured from it, by the relay's clock).
///
/// A batch is published in chunks of [`publish_batch_size`](super::RelayConfig), up to
/// [`publish_concurrency`](super::RelayConfig) at once; each chunk settles its own
/// leases as soon as its publish returns, except that the loop's batches leave the
/// settle of the chunk that finishes last to the next claim (see [`Deferred`]), handed
/// back as a value. Every count goes through [`Tally::record`](super::Tally) once, when
/// the chunk is settled (or its settle deferred).
///
/// On a store that renews leases, a chunk about to start renews the batch's unsettled
/// leases when too little lease is left for its publish, so later waves never find
/// their leases lapsing.
pub(super) struct Batch<'r> {
    inner: &'r Inner,
    /// The claimed messages, in claim order, handed to the publisher a chunk at a time
    /// as slices (never copied).
    messages: Vec<Message>,
    /// Their leases, index for index.
    leases: Vec<Lease>,
    /// Claimed messages past the retry policy's last attempt: earlier attempts ended
    /// with no outcome recorded (the relay stopped, or its lease lapsed, during the
    /// publish). They are dead-lettered without being published again, so a message
    /// whose publish kills the relay cannot loop for ever.
    exhausted: Vec<Failure>,
    /// When the leases lapse by the relay's clock: the claim's start plus the lease,
    /// moved on by each renewal (its start plus the lease).
    deadline: Mutex<Instant>,
    /// Ids whose publish call started: if shutdown abandons the batch, these are
    /// failed (the broker may have them) and the rest released.
    started: Mutex<HashSet<MessageId>>,
    /// Ids whose settle was sent (or deferred): renewals leave them out.
    settling: Mutex<HashSet<MessageId>>,
    /// Chunks not yet finished publishing: the one that brings it to zero is the
    /// last, whose settle the loop's batches defer.
    unfinished: AtomicUsize,
    /// One renewal at a time: chunks that need one wait for it and re-check.
    renewing: tokio::sync::Mutex<()>,
}

impl<'r> Batch<'r> {
    pub(super) fn new(inner: &'r Inner, claimed: Vec<ClaimedMessage>, claimed_at: Instant) -> Self {
        let max_attempts = inner.config.retry.max_attempts;
        let (claimed, exhausted): (Vec<ClaimedMessage>, Vec<ClaimedMessage>) = claimed
            .into_iter()
            .partition(|c| c.message.attempts <= max_attempts);
        let exhausted = exhausted
            .into_iter()
            .map(|c| {
                let error = format!(
                    "claimed for attempt {} of at most {max_attempts}: earlier attempts \
                     ended without an outcome (the relay stopped or its lease lapsed \
                     during the publish)",
                    c.message.attempts
                );
                Failure::new(c.lease, error, Disposition::DeadLetter)
            })
            .collect();
        let chunks = claimed
            .len()
            .div_ceil(inner.config.publish_batch_size.max(1));
        let (messages, leases) = claimed.into_iter().map(|c| (c.message, c.lease)).unzip();
        Batch {
            inner,
            messages,
            leases,
            exhausted,
            deadline: Mutex::new(claimed_at + inner.config.lease),
            started: Mutex::default(),
            settling: Mutex::default(),
            unfinished: AtomicUsize::new(chunks),
            renewing: tokio::sync::Mutex::new(()),
        }
    }

    /// When the leases lapse by the relay's clock (never later than by the storage's:
    /// the claim, and each renewal, stamped them after the relay sent it).
    fn lease_deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The one rule of [`RelayConfig::lease_allows_publish`](super::RelayConfig::lease_allows_publish),
    /// applied to the lease left now.
    fn lease_allows_publish(&self) -> bool {
        let config = &self.inner.config;
        let left = self
            .lease_deadline()
            .saturating_duration_since(Instant::now());
        config.lease_allows_publish(config.lease.saturating_sub(left))
    }

    /// Whether a publish may start now; on a store that renews leases, renew the
    /// batch's unsettled leases first when too little is left. Also what the renewal
    /// counted (a failed one is a store error), already recorded in the relay's totals,
    /// for the caller's report.
    async fn lease_for_publish(&self) -> (bool, DispatchReport) {
        let mut counted = DispatchReport::default();
        if self.lease_allows_publish() {
            return (true, counted);
        }
        if !self.inner.renews {
            return (false, counted);
        }
        let _one = self.renewing.lock().await;
        if !self.lease_allows_publish() {
            counted = self.renew().await;
        }
        (self.lease_allows_publish(), counted)
    }

    /// Extend every lease of the batch not yet being settled, fenced by its token. A
    /// failure is logged and counted (in the totals, and in what this returns); the
    /// deadline then stays where it was.
    async fn renew(&self) -> DispatchReport {
        let inner = self.inner;
        let leases: Vec<Lease> = {
            let settling = self.settling.lock().unwrap_or_else(PoisonError::into_inner);
            self.leases
                .iter()
                .copied()
                .filter(|l| !settling.contains(&l.id))
                .collect()
        };
        if leases.is_empty() {
            return DispatchReport::default();
        }
        let sent = Instant::now();
        match inner.store.renew(&leases, inner.config.lease).await {
            Ok(renewed) => {
                if !renewed.lost.is_empty() {
                    tracing::warn!(
                        count = renewed.lost.len(),
                        "leases lost before they could be renewed; their settles will be fenced out"
                    );
                }
                *self.deadline.lock().unwrap_or_else(PoisonError::into_inner) =
                    sent + inner.config.lease;
                tracing::debug!(count = renewed.leases.len(), "renewed leases");
                DispatchReport::default()
            }
            Err(err) => {
                tracing::warn!(count = leases.len(), error = %err.report(), "lease renewal failed");
                let failed = DispatchReport {
                    store_errors: 1,
                    ..DispatchReport::default()
                };
                inner.tally.record(&failed);
                failed
            }
        }
    }

    fn mark_settling(&self, ids: impl Iterator<Item = MessageId>) {
        self.settling
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(ids);
    }

    /// Publish every chunk and settle every lease (for [`Relay::dispatch_ids`](super::Relay::dispatch_ids)).
    pub(super) async fn publish(&self) -> DispatchReport {
        self.publish_chunks(false).await.0
    }

    /// Publish every chunk, settling all but the one that finishes last, whose settle
    /// is returned for the next claim (unless the relay is stopping by then: it then
    /// settles too). Stops when `stop` is cancelled and the shutdown grace has passed,
    /// and abandons what is still in flight (see [`abandon`](Self::abandon)).
    pub(super) async fn publish_deferring_last(
        &self,
        stop: &CancellationToken,
    ) -> Option<Deferred> {
        let grace = self.inner.config.shutdown_grace;
        tokio::select! {
            (_, deferred) = self.publish_chunks(true) => deferred,
            () = async {
                stop.cancelled().await;
                tokio::time::sleep(grace).await;
            } => {
                tracing::warn!(count = self.messages.len(), "shutdown grace expired; abandoning the batch");
                self.abandon().await;
                None
            }
        }
    }

    async fn publish_chunks(&self, defer_last: bool) -> (DispatchReport, Option<Deferred>) {
        let config = &self.inner.config;
        let mut report = DispatchReport {
            claimed: (self.messages.len() + self.exhausted.len()) as u64,
            ..DispatchReport::default()
        };
        self.inner.tally.record(&report);
        if !self.exhausted.is_empty() {
            let settled = self.settle_outcomes(&[], &self.exhausted).await;
            self.inner.tally.record(&settled);
            report.add(&settled);
        }
        // Chunks as index ranges, not borrowed slices: a closure over borrowed slices
        // would make the loop's future not `Send`.
        let size = config.publish_batch_size.max(1);
        let len = self.messages.len();
        let chunks = (0..len)
            .step_by(size)
            .map(move |start| start..(start + size).min(len));
        let mut results = futures::stream::iter(chunks)
            .map(|range| self.publish_chunk(range, defer_last))
            .buffer_unordered(config.publish_concurrency.max(1));
        let mut deferred = None;
        while let Some((chunk, left)) = results.next().await {
            report.add(&chunk);
            deferred = deferred.or(left);
        }
        (report, deferred)
    }

    /// Publish one chunk and settle it; with `defer_last`, the chunk that finishes last
    /// returns its settle instead.
    async fn publish_chunk(
        &self,
        range: std::ops::Range<usize>,
        defer_last: bool,
    ) -> (DispatchReport, Option<Deferred>) {
        let messages = &self.messages[range.clone()];
        let leases = &self.leases[range];
        let inner = self.inner;
        let config = &inner.config;
        if inner.stop.is_cancelled() {
            return (self.release(leases).await, None);
        }
        let (may_publish, renewal) = self.lease_for_publish().await;
        if !may_publish {
            tracing::warn!(
                count = leases.len(),
                "too little lease left to publish safely; releasing (raise the lease or lower \
                 batch_size / publish_timeout)"
            );
            let mut report = self.release(leases).await;
            report.add(&renewal);
            return (report, None);
        }
        self.mark_started(leases);
        let mut report = DispatchReport::default();
        let published = inner.stage.publish(messages).await;
        if published.panicked {
            report.panics += 1;
        }
        let mut done = Vec::with_capacity(leases.len());
        let mut failures = Vec::new();
        for ((message, &lease), outcome) in messages.iter().zip(leases).zip(published.outcomes) {
            match outcome {
                PublishOutcome::Published => done.push(lease),
                PublishOutcome::Retryable(error) => failures.push(Failure::new(
                    lease,
                    error,
                    config.retry.after_failure(message.attempts),
                )),
                PublishOutcome::Permanent(error) => {
                    failures.push(Failure::new(lease, error, Disposition::DeadLetter));
                }
            }
        }
        self.mark_settling(leases_of(&done, &failures));
        let last = self.unfinished.fetch_sub(1, AtomicOrdering::SeqCst) == 1;
        if last && defer_last && !inner.stop.is_cancelled() {
            inner.tally.record(&report);
            report.add(&renewal);
            let deadline = self.lease_deadline();
            return (
                report,
                Some(Deferred {
                    done,
                    failures,
                    deadline,
                }),
            );
        }
        report.add(&self.settle_outcomes(&done, &failures).await);
        inner.tally.record(&report);
        // The renewal's counts are in the totals already: only the report gets them.
        report.add(&renewal);
        (report, None)
    }

    /// Complete what was published and fail the rest, both at once.
    async fn settle_outcomes(&self, done: &[Lease], failures: &[Failure]) -> DispatchReport {
        settle_outcomes(self.inner, done, failures, self.lease_deadline()).await
    }

    /// Give leases back unattempted. Leases already settled are fenced out by the store
    /// and not counted.
    async fn release(&self, leases: &[Lease]) -> DispatchReport {
        let store = &self.inner.store;
        let mut report = DispatchReport::default();
        match self
            .settle("release", leases.len(), || store.release(leases))
            .await
        {
            Ok(released) => report.released = released.settled.applied as u64,
            Err(()) => report.store_errors += 1,
        }
        self.inner.tally.record(&report);
        report
    }

    /// End a batch that shutdown abandoned: publishes that started may have reached the
    /// broker, so they are failed (their attempt counts, and a publish that always hangs
    /// still dead-letters eventually); the rest are released.
    async fn abandon(&self) -> DispatchReport {
        let (attempted, untouched): (Vec<Lease>, Vec<Lease>) = self
            .leases
            .iter()
            .copied()
            .partition(|l| self.was_started(l.id));
        let failures: Vec<Failure> = attempted
            .into_iter()
            .map(|lease| {
                let retry_now = Disposition::Retry {
                    after: Duration::ZERO,
                };
                Failure::new(lease, "publish abandoned at shutdown", retry_now)
            })
            .collect();
        let store = &self.inner.store;
        let (failed, released) = futures::join!(
            self.settle("fail", failures.len(), || store.fail(&failures)),
            self.release(&untouched),
        );
        let mut report = DispatchReport::default();
        match failed {
            Ok(f) => report.retried = f.settled.applied as u64,
            Err(()) => report.store_errors += 1,
        }
        self.inner.tally.record(&report);
        report.add(&released);
        report
    }

    /// [`settle`] until this batch's leases lapse.
    async fn settle<F, Fut>(
        &self,
        what: &'static str,
        count: usize,
        call: F,
    ) -> std::result::Result<SettleOutcome, ()>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Settled>>,
    {
        settle(self.lease_deadline(), what, count, call).await
    }

    fn mark_started(&self, leases: &[Lease]) {
        let mut started = self.started.lock().unwrap_or_else(PoisonError::into_inner);
        started.extend(leases.iter().map(|l| l.id));
    }

    fn was_started(&self, id: MessageId) -> bool {
        self.started
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&id)
    }
}

/// Run a settle call of `count` leases, retrying retryable storage errors with
/// backoff until `deadline`, while the leases may still be held: a settle that never lands
/// means the messages publish again after the lease lapses, and once it has lapsed
/// the store fences the settle out anyway. `Err(())` when it gave up (logged).
pub(super) async fn settle<F, Fut>(
    deadline: Instant,
    what: &'static str,
    count: usize,
    call: F,
) -> std::result::Result<SettleOutcome, ()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Settled>>,
{
    if count == 0 {
        return Ok(SettleOutcome::default());
    }
    let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    let mut retried = false;
    loop {
        match call().await {
            Ok(settled) => {
                if retried && !settled.lost.is_empty() {
                    tracing::info!(
                        count = settled.lost.len(),
                        "{what} retried after an error; an earlier try may have applied \
                         the leases now reported lost"
                    );
                }
                return Ok(SettleOutcome { settled, retried });
            }
            Err(err) if err.is_retryable() => {
                let pause = backoff.next_delay();
                if Instant::now() + pause >= deadline {
                    tracing::error!(
                        count, error = %err.report(),
                        "{what} failed until the leases lapsed; the messages publish again"
                    );
                    return Err(());
                }
                tracing::warn!(count, error = %err.report(), retry_in = ?pause, "{what} failed; retrying");
                tokio::time::sleep(pause).await;
                retried = true;
            }
            Err(err) => {
                tracing::error!(
                    count, error = %err.report(),
                    "{what} failed; leases will lapse and the messages publish again"
                );
                return Err(());
            }
        }
    }
}

/// Complete what was published and fail the rest, both at once, retrying retryable
/// errors until `deadline`.
pub(super) async fn settle_outcomes(
    inner: &Inner,
    done: &[Lease],
    failures: &[Failure],
    deadline: Instant,
) -> DispatchReport {
    let store = &inner.store;
    let (completed, failed) = futures::join!(
        settle(deadline, "complete", done.len(), || store.complete(done)),
        settle(deadline, "fail", failures.len(), || store.fail(failures)),
    );
    count_settled(completed, failed, failures)
}

/// The counts of a complete and a fail call (either given up on: `Err(())`).
pub(super) fn count_settled(
    completed: std::result::Result<SettleOutcome, ()>,
    failed: std::result::Result<SettleOutcome, ()>,
    failures: &[Failure],
) -> DispatchReport {
    let mut report = DispatchReport::default();
    match completed {
        Ok(c) => {
            report.dispatched = c.settled.applied as u64;
            report.leases_lost += c.unambiguous_lost();
        }
        Err(()) => report.store_errors += 1,
    }
    match failed {
        Ok(f) => {
            let lost: HashSet<MessageId> = f.settled.lost.iter().copied().collect();
            for failure in failures.iter().filter(|f| !lost.contains(&f.lease().id)) {
                match failure.disposition() {
                    Disposition::Retry { .. } => report.retried += 1,
                    Disposition::DeadLetter => {
                        tracing::warn!(id = %failure.lease().id, error = failure.error(), "message dead-lettered");
                        report.dead_lettered += 1;
                    }
                }
            }
            report.leases_lost += f.unambiguous_lost();
        }
        Err(()) => report.store_errors += 1,
    }
    report
}

/// The ids of a chunk's settle.
fn leases_of<'a>(
    done: &'a [Lease],
    failures: &'a [Failure],
) -> impl Iterator<Item = MessageId> + 'a {
    done.iter()
        .map(|l| l.id)
        .chain(failures.iter().map(|f| f.lease().id))
}

/// The result of one settle call.
#[derive(Default)]
pub(super) struct SettleOutcome {
    settled: Settled,
    /// The call was retried after an error: an earlier try may have committed, so ids
    /// reported lost may in fact have been settled by this relay.
    retried: bool,
}

impl SettleOutcome {
    /// A call that landed at its first try.
    pub(super) fn first_try(settled: Settled) -> Self {
        SettleOutcome {
            settled,
            retried: false,
        }
    }

    /// Lost leases to count: none when the call was retried, since an earlier try may
    /// have applied them.
    fn unambiguous_lost(&self) -> u64 {
        if self.retried {
            0
        } else {
            self.settled.lost.len() as u64
        }
    }
}
