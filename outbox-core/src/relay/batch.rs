//! One claimed batch, from publish to settled leases: [`Batch`].

use std::any::Any;
use std::collections::HashSet;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use futures::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

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
/// leases as soon as its publish returns. Every count goes through
/// [`Tally::record`](super::Tally) once, when the chunk is settled.
pub(super) struct Batch<'r> {
    inner: &'r Inner,
    claimed: Vec<ClaimedMessage>,
    claimed_at: Instant,
    /// Ids whose publish call started: if shutdown abandons the batch, these are
    /// failed (the broker may have them) and the rest released.
    started: Mutex<HashSet<MessageId>>,
}

impl<'r> Batch<'r> {
    pub(super) fn new(inner: &'r Inner, claimed: Vec<ClaimedMessage>, claimed_at: Instant) -> Self {
        Batch {
            inner,
            claimed,
            claimed_at,
            started: Mutex::default(),
        }
    }

    /// When the leases lapse by the relay's clock (never later than by the storage's:
    /// the claim stamped them after `claimed_at`).
    fn lease_deadline(&self) -> Instant {
        self.claimed_at + self.inner.config.lease
    }

    /// Publish every chunk and settle every lease.
    pub(super) async fn publish(&self) -> DispatchReport {
        let config = &self.inner.config;
        let mut report = DispatchReport {
            claimed: self.claimed.len() as u64,
            ..DispatchReport::default()
        };
        self.inner.tally.record(&report);
        // Chunks as index ranges, not borrowed slices: a closure over borrowed slices
        // would make the loop's future not `Send`.
        let size = config.publish_batch_size.max(1);
        let len = self.claimed.len();
        let chunks = (0..len)
            .step_by(size)
            .map(move |start| start..(start + size).min(len));
        let mut results = futures::stream::iter(chunks)
            .map(|range| self.publish_chunk(range))
            .buffer_unordered(config.publish_concurrency.max(1));
        while let Some(chunk) = results.next().await {
            report.add(&chunk);
        }
        report
    }

    /// Publish until done or until `stop` is cancelled and the shutdown grace has passed;
    /// then abandon what is still in flight (see [`abandon`](Self::abandon)).
    pub(super) async fn publish_until(&self, stop: &CancellationToken) -> DispatchReport {
        let grace = self.inner.config.shutdown_grace;
        tokio::select! {
            report = self.publish() => report,
            () = async {
                stop.cancelled().await;
                tokio::time::sleep(grace).await;
            } => {
                tracing::warn!(count = self.claimed.len(), "shutdown grace expired; abandoning the batch");
                self.abandon().await
            }
        }
    }

    async fn publish_chunk(&self, range: std::ops::Range<usize>) -> DispatchReport {
        let chunk = &self.claimed[range];
        let inner = self.inner;
        let config = &inner.config;
        let leases: Vec<Lease> = chunk.iter().map(|c| c.lease).collect();
        if inner.stop.is_cancelled() {
            return self.release(&leases).await;
        }
        if !config.lease_allows_publish(self.claimed_at.elapsed()) {
            tracing::warn!(
                count = leases.len(),
                "too little lease left to publish safely; releasing (raise the lease or lower \
                 batch_size / publish_timeout)"
            );
            return self.release(&leases).await;
        }
        self.mark_started(&leases);
        let messages: Vec<Message> = chunk.iter().map(|c| c.message.clone()).collect();
        let span = tracing::info_span!(
            "outbox.publish",
            relay = %config.name,
            count = messages.len(),
            first_id = %messages[0].id,
        );
        #[cfg(feature = "otel")]
        crate::otel::link_messages(&span, &messages);
        let mut report = DispatchReport::default();
        let outcomes = self.outcomes(&messages, &mut report).instrument(span).await;

        let now = SystemTime::now();
        let mut done = Vec::new();
        let mut failures = Vec::new();
        for ((message, lease), outcome) in messages.iter().zip(leases).zip(outcomes) {
            match outcome {
                PublishOutcome::Published => {
                    if let Ok(lag) = now.duration_since(message.created_at) {
                        inner
                            .metrics
                            .commit_to_publish_seconds
                            .record(lag.as_secs_f64());
                    }
                    done.push(lease);
                }
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
        report.add(&self.settle_outcomes(&done, &failures).await);
        inner.tally.record(&report);
        report
    }

    /// The publisher's outcome for every message, whatever the publisher does: an
    /// error, a wrong count, a timeout or a panic becomes a failure of every message
    /// (a panic is also counted in `report`).
    async fn outcomes(
        &self,
        messages: &[Message],
        report: &mut DispatchReport,
    ) -> Vec<PublishOutcome> {
        let config = &self.inner.config;
        tracing::debug!(ids = ?messages.iter().map(|m| m.id).collect::<Vec<_>>(), "publishing");
        let publish = AssertUnwindSafe(self.inner.publisher.publish(messages)).catch_unwind();
        let all = |outcome: PublishOutcome| vec![outcome; messages.len()];
        match tokio::time::timeout(config.publish_timeout, publish).await {
            Ok(Ok(Ok(outcomes))) if outcomes.len() == messages.len() => outcomes,
            Ok(Ok(Ok(outcomes))) => {
                let why = format!(
                    "publisher returned {} outcomes for {} messages",
                    outcomes.len(),
                    messages.len()
                );
                tracing::error!("{why}");
                all(PublishOutcome::Retryable(why))
            }
            Ok(Ok(Err(err))) if err.is_retryable() => {
                all(PublishOutcome::Retryable(err.report().to_string()))
            }
            Ok(Ok(Err(err))) => all(PublishOutcome::Permanent(err.report().to_string())),
            Ok(Err(panic)) => {
                let why = format!("publisher panicked: {}", panic_message(&*panic));
                tracing::error!(count = messages.len(), "{why}");
                report.panics += 1;
                all(PublishOutcome::Retryable(why))
            }
            Err(_) => all(PublishOutcome::Retryable(format!(
                "publish timed out after {:?}",
                config.publish_timeout
            ))),
        }
    }

    /// Complete what was published and fail the rest, both at once.
    async fn settle_outcomes(&self, done: &[Lease], failures: &[Failure]) -> DispatchReport {
        let store = &self.inner.store;
        let (completed, failed) = futures::join!(
            self.settle("complete", done.len(), || store.complete(done)),
            self.settle("fail", failures.len(), || store.fail(failures)),
        );
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
            .claimed
            .iter()
            .map(|c| c.lease)
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

    /// Run a settle call of `count` leases, retrying retryable storage errors with
    /// backoff for as long as the leases may still be held: a settle that never lands
    /// means the messages publish again after the lease lapses, and once it has lapsed
    /// the store fences the settle out anyway. `Err(())` when it gave up (logged).
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
        if count == 0 {
            return Ok(SettleOutcome::default());
        }
        let deadline = self.lease_deadline();
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

/// The result of one settle call.
#[derive(Default)]
struct SettleOutcome {
    settled: Settled,
    /// The call was retried after an error: an earlier try may have committed, so ids
    /// reported lost may in fact have been settled by this relay.
    retried: bool,
}

impl SettleOutcome {
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

/// The text of a panic's payload (`panic!("...")` carries a `&str` or a `String`).
pub(super) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}
