//! One claimed batch, from publish to settled leases: [`Batch`].

use std::collections::HashSet;
use std::future::Future;
use std::ops::Range;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::report::Counter;
use super::settler::{self, Deferred, SettleOutcome};
use super::{DispatchReport, Inner};
use crate::error::Result;
use crate::message::{Message, MessageId};
use crate::publisher::PublishOutcome;
use crate::store::{ClaimedMessage, Disposition, Failure, Lease, Settled};

/// The messages one claim returned, with the time the claim started (their leases are
/// measured from it, by the relay's clock).
///
/// A batch is published in chunks of [`publish_batch_size`](super::RelayConfig), up to
/// [`publish_concurrency`](super::RelayConfig) at once (a chunk holds its place until
/// its settle returns); each chunk settles its own leases as soon as its publish
/// returns, except that the loop's batches leave the settle of the chunk that finishes
/// publishing last to the next claim (see [`Deferred`]), handed back as a value. That
/// choice is made in one place, [`publish_chunks`](Self::publish_chunks). Every count
/// goes through the batch's [`Counter`] once, when it happens.
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
    /// What the batch counted, fed to the relay's totals as it goes.
    counter: Counter<'r>,
    /// When the leases lapse by the relay's clock: the claim's start plus the lease,
    /// moved on by each renewal (its start plus the lease).
    deadline: Mutex<Instant>,
    /// Ids whose publish call started: if shutdown abandons the batch, these are
    /// failed (the broker may have them) and the rest released.
    started: Mutex<HashSet<MessageId>>,
    /// Ids whose settle was sent (or deferred): renewals leave them out.
    settling: Mutex<HashSet<MessageId>>,
    /// One renewal at a time: chunks that need one wait for it and re-check.
    renewing: tokio::sync::Mutex<()>,
}

/// Who settles the chunk that finishes publishing last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LastSettle {
    /// The batch, like every other chunk (explicit dispatch).
    Own,
    /// The next claim of the loop, which carries it (unless the relay is stopping, or
    /// a chunk of the batch was released: its lease was short, so nothing waits).
    Defer,
}

/// How one chunk's publish ended.
enum Chunk {
    /// Its leases were given back unattempted (counted already).
    Released,
    /// Published: what to complete and what to fail.
    Published {
        done: Vec<Lease>,
        failures: Vec<Failure>,
    },
}

/// A step of [`Batch::publish_chunks`]: a chunk's publish ended, or a settle returned.
enum Step {
    Publish(Chunk),
    Settle,
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
        let (messages, leases) = claimed.into_iter().map(|c| (c.message, c.lease)).unzip();
        Batch {
            inner,
            messages,
            leases,
            exhausted,
            counter: Counter::new(&inner.tally),
            deadline: Mutex::new(claimed_at + inner.config.lease),
            started: Mutex::default(),
            settling: Mutex::default(),
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
    /// batch's unsettled leases first when too little is left.
    async fn lease_for_publish(&self) -> bool {
        if self.lease_allows_publish() {
            return true;
        }
        if !self.inner.renews {
            return false;
        }
        let _one = self.renewing.lock().await;
        if !self.lease_allows_publish() {
            self.renew().await;
        }
        self.lease_allows_publish()
    }

    /// Extend every lease of the batch not yet being settled, fenced by its token. A
    /// failure is logged and counted; the deadline then stays where it was.
    async fn renew(&self) {
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
            return;
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
            }
            Err(err) => {
                tracing::warn!(count = leases.len(), error = %err.report(), "lease renewal failed");
                self.counter.record(&DispatchReport {
                    store_errors: 1,
                    ..DispatchReport::default()
                });
            }
        }
    }

    fn mark_settling(&self, ids: impl Iterator<Item = MessageId>) {
        self.settling
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(ids);
    }

    /// Publish every chunk and settle every lease (for [`Relay::dispatch_ids`](super::Relay::dispatch_ids));
    /// returns what the batch counted.
    pub(super) async fn publish(&self) -> DispatchReport {
        let deferred = self.publish_chunks(LastSettle::Own).await;
        debug_assert!(
            deferred.is_none(),
            "a batch that settles its own defers nothing"
        );
        self.counter.sum()
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
            deferred = self.publish_chunks(LastSettle::Defer) => deferred,
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

    /// Publish the chunks, up to `publish_concurrency` at once, each holding its place
    /// until its settle returns; settle each as its publish ends, but for the last to
    /// end when `last` is [`LastSettle::Defer`], which is returned instead.
    async fn publish_chunks(&self, last: LastSettle) -> Option<Deferred> {
        let config = &self.inner.config;
        self.counter.record(&DispatchReport {
            claimed: (self.messages.len() + self.exhausted.len()) as u64,
            ..DispatchReport::default()
        });
        if !self.exhausted.is_empty() {
            let settled = self.settle_before_lapse(&[], &self.exhausted).await;
            self.counter.record(&settled);
        }
        let size = config.publish_batch_size.max(1);
        let len = self.messages.len();
        let mut ranges = (0..len)
            .step_by(size)
            .map(move |start| start..(start + size).min(len));
        let slots = config.publish_concurrency.max(1);
        let mut running: FuturesUnordered<BoxFuture<'_, Step>> = FuturesUnordered::new();
        let (mut publishing, mut released_any) = (0usize, false);
        loop {
            while running.len() < slots {
                let Some(range) = ranges.next() else { break };
                publishing += 1;
                running.push(self.publish_chunk(range).map(Step::Publish).boxed());
            }
            // Every chunk published and settled: nothing left to defer.
            let step = running.next().await?;
            let (done, failures) = match step {
                Step::Settle => continue,
                Step::Publish(Chunk::Released) => {
                    publishing -= 1;
                    released_any = true;
                    continue;
                }
                Step::Publish(Chunk::Published { done, failures }) => {
                    publishing -= 1;
                    (done, failures)
                }
            };
            let ended_last = publishing == 0 && ranges.len() == 0;
            if ended_last
                && last == LastSettle::Defer
                && !released_any
                && !self.inner.stop.is_cancelled()
            {
                // The other chunks' settles are in `running`: finish them first.
                while running.next().await.is_some() {}
                let deadline = self.lease_deadline();
                return Some(Deferred {
                    done,
                    failures,
                    deadline,
                });
            }
            running.push(
                async move {
                    let settled = self.settle_before_lapse(&done, &failures).await;
                    self.counter.record(&settled);
                    Step::Settle
                }
                .boxed(),
            );
        }
    }

    /// Publish one chunk, or release it when the relay is stopping or too little lease
    /// is left.
    async fn publish_chunk(&self, range: Range<usize>) -> Chunk {
        let messages = &self.messages[range.clone()];
        let leases = &self.leases[range];
        let inner = self.inner;
        let config = &inner.config;
        if inner.stop.is_cancelled() {
            self.release(leases).await;
            return Chunk::Released;
        }
        if !self.lease_for_publish().await {
            tracing::warn!(
                count = leases.len(),
                "too little lease left to publish safely; releasing (raise the lease or lower \
                 batch_size / publish_timeout)"
            );
            self.release(leases).await;
            return Chunk::Released;
        }
        self.mark_started(leases);
        let published = inner.stage.publish(messages).await;
        if published.panicked {
            self.counter.record(&DispatchReport {
                panics: 1,
                ..DispatchReport::default()
            });
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
        Chunk::Published { done, failures }
    }

    /// Complete what was published and fail the rest, both at once, retrying until
    /// this batch's leases lapse; returns the counts (not yet recorded).
    async fn settle_before_lapse(&self, done: &[Lease], failures: &[Failure]) -> DispatchReport {
        settler::settle_outcomes(self.inner, done, failures, self.lease_deadline()).await
    }

    /// Give leases back unattempted, and count it. Leases already settled are fenced
    /// out by the store and not counted.
    async fn release(&self, leases: &[Lease]) {
        let store = &self.inner.store;
        let mut report = DispatchReport::default();
        match self
            .retry_until_lapse("release", leases.len(), || store.release(leases))
            .await
        {
            Ok(released) => report.released = released.settled.applied as u64,
            Err(()) => report.store_errors += 1,
        }
        self.counter.record(&report);
    }

    /// End a batch that shutdown abandoned: publishes that started may have reached the
    /// broker, so they are failed (their attempt counts, and a publish that always hangs
    /// still dead-letters eventually); the rest are released.
    async fn abandon(&self) {
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
        let (failed, ()) = futures::join!(
            self.retry_until_lapse("fail", failures.len(), || store.fail(&failures)),
            self.release(&untouched),
        );
        let mut report = DispatchReport::default();
        match failed {
            Ok(f) => report.retried = f.settled.applied as u64,
            Err(()) => report.store_errors += 1,
        }
        self.counter.record(&report);
    }

    /// [`settler::settle`] until this batch's leases lapse.
    async fn retry_until_lapse<F, Fut>(
        &self,
        what: &'static str,
        count: usize,
        call: F,
    ) -> std::result::Result<SettleOutcome, ()>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Settled>>,
    {
        settler::settle(self.lease_deadline(), what, count, call).await
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

/// The ids of a chunk's settle.
fn leases_of<'a>(
    done: &'a [Lease],
    failures: &'a [Failure],
) -> impl Iterator<Item = MessageId> + 'a {
    done.iter()
        .map(|l| l.id)
        .chain(failures.iter().map(|f| f.lease().id))
}
