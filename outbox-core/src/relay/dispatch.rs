//! Publishing a claimed batch and settling its leases.

use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use tracing::Instrument;

use super::{metrics, DispatchReport, Relay};
use crate::error::Result;
use crate::message::{Message, MessageId};
use crate::publisher::PublishOutcome;
use crate::store::{ClaimedMessage, Disposition, Failure, Lease, Settled};

/// Longest error text recorded on a message.
const MAX_ERROR_LEN: usize = 2000;

impl Relay {
    /// Publish `claimed` in bounded-concurrency chunks and settle every lease.
    pub(super) async fn process(&self, claimed: Vec<ClaimedMessage>) -> DispatchReport {
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
            .map(|(messages, leases)| self.publish_chunk(messages, leases))
            .buffer_unordered(config.publish_concurrency);
        while let Some(chunk) = results.next().await {
            self.inner().counters.add(&chunk);
            report.add(&chunk);
        }
        report
    }

    async fn publish_chunk(&self, messages: Vec<Message>, leases: Vec<Lease>) -> DispatchReport {
        let inner = self.inner();
        let config = &inner.config;
        if *inner.shutdown.borrow() {
            return self.release(&leases).await;
        }
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
                        ::metrics::histogram!(
                            metrics::COMMIT_TO_PUBLISH_SECONDS,
                            "relay" => config.name.clone()
                        )
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
        let name = config.name.clone();
        if let Some(completed) = completed {
            report.dispatched = completed.applied as u64;
            report.leases_lost += completed.lost.len() as u64;
        }
        if let Some(failed) = failed {
            let lost: HashSet<MessageId> = failed.lost.iter().copied().collect();
            for f in failures.iter().filter(|f| !lost.contains(&f.lease.id)) {
                match f.disposition {
                    Disposition::Retry { .. } => report.retried += 1,
                    Disposition::DeadLetter => {
                        tracing::warn!(id = %f.lease.id, error = %f.error, "message dead-lettered");
                        report.dead_lettered += 1;
                    }
                }
            }
            report.leases_lost += lost.len() as u64;
        }
        ::metrics::counter!(metrics::DISPATCHED, "relay" => name.clone())
            .increment(report.dispatched);
        ::metrics::counter!(metrics::RETRIED, "relay" => name.clone()).increment(report.retried);
        ::metrics::counter!(metrics::DEAD_LETTERED, "relay" => name.clone())
            .increment(report.dead_lettered);
        if report.leases_lost > 0 {
            tracing::warn!(
                count = report.leases_lost,
                "leases lost before settling; those messages may publish again"
            );
            ::metrics::counter!(metrics::LEASES_LOST, "relay" => name)
                .increment(report.leases_lost);
        }
        report
    }

    /// Give leases back unattempted. Leases already settled are fenced out by the store
    /// and not counted.
    pub(super) async fn release(&self, leases: &[Lease]) -> DispatchReport {
        let store = &self.inner().store;
        let released = self
            .settle("release", !leases.is_empty(), || store.release(leases))
            .await;
        let released = released.map_or(0, |s| s.applied as u64);
        ::metrics::counter!(metrics::RELEASED, "relay" => self.inner().config.name.clone())
            .increment(released);
        DispatchReport {
            released,
            ..DispatchReport::default()
        }
    }

    /// Run a settle call, retrying transient storage errors a few times: a settle that
    /// never lands means the message is published again after the lease lapses.
    async fn settle<F, Fut>(&self, what: &'static str, needed: bool, call: F) -> Option<Settled>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Settled>>,
    {
        if !needed {
            return Some(Settled::default());
        }
        let attempts = self.inner().config.settle_attempts;
        let mut attempt = 1;
        loop {
            match call().await {
                Ok(settled) => return Some(settled),
                Err(err) if err.is_retryable() && attempt < attempts => {
                    tracing::warn!(error = %err, attempt, "{what} failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50) * attempt).await;
                    attempt += 1;
                }
                Err(err) => {
                    tracing::error!(error = %err, "{what} failed; leases will lapse and messages publish again");
                    ::metrics::counter!(metrics::STORE_ERRORS, "relay" => self.inner().config.name.clone())
                        .increment(1);
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
