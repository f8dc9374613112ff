//! Publishing a claimed batch and settling its leases.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use tracing::Instrument;

use super::{DispatchReport, Relay};
use crate::error::Result;
use crate::message::{Message, MessageId};
use crate::publisher::PublishOutcome;
use crate::store::{ClaimedMessage, Disposition, Failure, Lease, Settled};

/// Longest error text recorded on a message.
const MAX_ERROR_LEN: usize = 2000;

/// Ids of a batch whose publish call has started: if shutdown abandons the batch, these
/// are failed (the attempt counts: the broker may have them) and the rest released.
#[derive(Debug, Default)]
pub(super) struct Started(Mutex<HashSet<MessageId>>);

impl Started {
    fn mark(&self, leases: &[Lease]) {
        let mut started = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        started.extend(leases.iter().map(|l| l.id));
    }

    pub(super) fn contains(&self, id: MessageId) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&id)
    }
}

/// The result of one settle call.
struct SettleOutcome {
    settled: Settled,
    /// The call was retried after an error: an earlier try may have committed, so ids
    /// reported lost may in fact have been settled by this relay.
    ambiguous: bool,
}

impl Relay {
    /// Publish `claimed` in bounded-concurrency chunks and settle every lease.
    ///
    /// `claimed_at` is taken just before the claim call: the lease is measured from it.
    pub(super) async fn process(
        &self,
        claimed: Vec<ClaimedMessage>,
        claimed_at: Instant,
        started: &Started,
    ) -> DispatchReport {
        let config = &self.inner().config;
        let mut report = DispatchReport {
            claimed: claimed.len() as u64,
            ..DispatchReport::default()
        };
        self.inner().counters.add(&report);
        let mut chunks = Vec::with_capacity(claimed.len().div_ceil(config.publish_batch_size));
        let mut claimed = claimed.into_iter().peekable();
        while claimed.peek().is_some() {
            let (messages, leases): (Vec<Message>, Vec<Lease>) = claimed
                .by_ref()
                .take(config.publish_batch_size)
                .map(|c| (c.message, c.lease))
                .unzip();
            chunks.push((messages, leases));
        }
        let mut results = futures::stream::iter(chunks)
            .map(|(messages, leases)| self.publish_chunk(messages, leases, claimed_at, started))
            .buffer_unordered(config.publish_concurrency);
        while let Some(chunk) = results.next().await {
            self.inner().counters.add(&chunk);
            report.add(&chunk);
        }
        report
    }

    async fn publish_chunk(
        &self,
        messages: Vec<Message>,
        leases: Vec<Lease>,
        claimed_at: Instant,
        started: &Started,
    ) -> DispatchReport {
        let inner = self.inner();
        let config = &inner.config;
        if *inner.shutdown.borrow() {
            return self.release(&leases).await;
        }
        // Publishing with less lease left than a publish may take would let another
        // relay claim and publish the same messages meanwhile.
        if claimed_at.elapsed() + config.publish_timeout + config.lease / 10 > config.lease {
            tracing::warn!(
                count = leases.len(),
                "too little lease left to publish safely; releasing (raise the lease or lower \
                 batch_size / publish_timeout)"
            );
            return self.release(&leases).await;
        }
        started.mark(&leases);
        let span = tracing::info_span!(
            "outbox.publish",
            relay = %config.name,
            count = messages.len(),
            first_id = %messages[0].id,
        );
        tracing::debug!(parent: &span, ids = ?messages.iter().map(|m| m.id).collect::<Vec<_>>(), "publishing");
        let published =
            tokio::time::timeout(config.publish_timeout, inner.publisher.publish(&messages))
                .instrument(span)
                .await;
        let outcomes = match published {
            Ok(Ok(outcomes)) if outcomes.len() == messages.len() => outcomes,
            Ok(Ok(outcomes)) => {
                let why = format!(
                    "publisher returned {} outcomes for {} messages",
                    outcomes.len(),
                    messages.len()
                );
                tracing::error!("{why}");
                vec![PublishOutcome::Retryable(why); messages.len()]
            }
            Ok(Err(err)) if err.is_retryable() => {
                vec![PublishOutcome::Retryable(error_chain(&err)); messages.len()]
            }
            Ok(Err(err)) => vec![PublishOutcome::Permanent(error_chain(&err)); messages.len()],
            Err(_) => {
                let why = format!("publish timed out after {:?}", config.publish_timeout);
                vec![PublishOutcome::Retryable(why); messages.len()]
            }
        };

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
                PublishOutcome::Retryable(error) => failures.push(Failure {
                    lease,
                    error: truncate(error),
                    disposition: config.retry.after_failure(message.attempts),
                }),
                PublishOutcome::Permanent(error) => failures.push(Failure {
                    lease,
                    error: truncate(error),
                    disposition: Disposition::DeadLetter,
                }),
            }
        }

        let store = &inner.store;
        let (completed, failed) = futures::join!(
            self.settle("complete", !done.is_empty(), || store.complete(&done)),
            self.settle("fail", !failures.is_empty(), || store.fail(&failures)),
        );
        let mut report = DispatchReport::default();
        if let Some(completed) = completed {
            report.dispatched = completed.settled.applied as u64;
            if !completed.ambiguous {
                report.leases_lost += completed.settled.lost.len() as u64;
            }
        }
        if let Some(failed) = failed {
            let lost: HashSet<MessageId> = failed.settled.lost.iter().copied().collect();
            for f in failures.iter().filter(|f| !lost.contains(&f.lease.id)) {
                match f.disposition {
                    Disposition::Retry { .. } => report.retried += 1,
                    Disposition::DeadLetter => {
                        tracing::warn!(id = %f.lease.id, error = %f.error, "message dead-lettered");
                        report.dead_lettered += 1;
                    }
                }
            }
            if !failed.ambiguous {
                report.leases_lost += lost.len() as u64;
            }
        }
        inner.metrics.dispatched.increment(report.dispatched);
        inner.metrics.retried.increment(report.retried);
        inner.metrics.dead_lettered.increment(report.dead_lettered);
        if report.leases_lost > 0 {
            tracing::warn!(
                count = report.leases_lost,
                "leases lost before settling; those messages may publish again"
            );
            inner.metrics.leases_lost.increment(report.leases_lost);
        }
        report
    }

    /// Give leases back unattempted. Leases already settled are fenced out by the store
    /// and not counted.
    pub(super) async fn release(&self, leases: &[Lease]) -> DispatchReport {
        let store = &self.inner().store;
        let released = self
            .settle("release", !leases.is_empty(), || store.release(leases))
            .await
            .map_or(0, |s| s.settled.applied as u64);
        self.inner().metrics.released.increment(released);
        DispatchReport {
            released,
            ..DispatchReport::default()
        }
    }

    /// End a batch that shutdown abandoned: publishes that started may have reached the
    /// broker, so they are failed (their attempt counts, and a publish that always hangs
    /// still dead-letters eventually); the rest are released.
    pub(super) async fn abandon(&self, leases: &[Lease], started: &Started) -> DispatchReport {
        let (attempted, untouched): (Vec<Lease>, Vec<Lease>) =
            leases.iter().partition(|l| started.contains(l.id));
        let failures: Vec<Failure> = attempted
            .into_iter()
            .map(|lease| Failure {
                lease,
                error: "publish abandoned at shutdown".to_owned(),
                disposition: Disposition::Retry {
                    after: Duration::ZERO,
                },
            })
            .collect();
        let store = &self.inner().store;
        let (failed, mut report) = futures::join!(
            self.settle("fail", !failures.is_empty(), || store.fail(&failures)),
            self.release(&untouched),
        );
        report.retried = failed.map_or(0, |f| f.settled.applied as u64);
        self.inner().metrics.retried.increment(report.retried);
        report
    }

    /// Run a settle call, retrying transient storage errors a few times: a settle that
    /// never lands means the message is published again after the lease lapses.
    async fn settle<F, Fut>(
        &self,
        what: &'static str,
        needed: bool,
        call: F,
    ) -> Option<SettleOutcome>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Settled>>,
    {
        if !needed {
            return Some(SettleOutcome {
                settled: Settled::default(),
                ambiguous: false,
            });
        }
        let attempts = self.inner().config.settle_attempts;
        let mut attempt = 1;
        loop {
            match call().await {
                Ok(settled) => {
                    let ambiguous = attempt > 1;
                    if ambiguous && !settled.lost.is_empty() {
                        tracing::info!(
                            count = settled.lost.len(),
                            "{what} retried after an error; an earlier try may have applied \
                             the leases now reported lost"
                        );
                    }
                    return Some(SettleOutcome { settled, ambiguous });
                }
                Err(err) if err.is_retryable() && attempt < attempts => {
                    tracing::warn!(error = %err, attempt, "{what} failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50) * attempt).await;
                    attempt += 1;
                }
                Err(err) => {
                    tracing::error!(error = %err, "{what} failed; leases will lapse and messages publish again");
                    self.inner().metrics.store_errors.increment(1);
                    return None;
                }
            }
        }
    }
}

fn error_chain(err: &crate::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn truncate(mut text: String) -> String {
    if text.len() > MAX_ERROR_LEN {
        let mut cut = MAX_ERROR_LEN;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_on_char_boundary() {
        let long = "é".repeat(MAX_ERROR_LEN);
        let cut = truncate(long);
        assert!(cut.len() <= MAX_ERROR_LEN);
        assert!(cut.chars().all(|c| c == 'é'));
        assert_eq!(truncate("short".into()), "short");
    }
}
