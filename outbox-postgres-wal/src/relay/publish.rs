//! Publishing what is ready (protocol step 4 of [`WalRelay`]): the next wave of
//! committed messages goes through the [`PublishStage`] (calls of `batch_size`,
//! `publish_concurrency` in flight at once, cut before a partition key's second
//! message), retryable failures are counted per message and end the session for a
//! retry, permanent refusals and exhausted messages go to the dead letters, and what
//! was answered is settled in the [`Stream`]. A publish in flight gets the lag ticks
//! and the shutdown grace.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use futures::stream::FuturesOrdered;
use futures::StreamExt;
use outbox_core::relay::PublishStage;
use outbox_core::{Error, ErrorKind, Message, PublishOutcome, Result};
use tokio_util::sync::CancellationToken;

use super::lag::lag_ticks;
use super::stream::Stream;
use super::WalRelay;
use crate::outbox::DeadLetterRow;

/// How publishing one batch ended.
pub(super) enum BatchEnd {
    /// Every message of the batch was settled.
    Settled,
    /// A retryable failure: end the session and resume after the wait.
    Retry(Duration, Error),
    /// Shutdown came and the publish outlived the shutdown grace: the batch was
    /// abandoned unsettled (the next relay publishes it again).
    Abandoned,
}

impl WalRelay {
    /// Publish the first wave of `stream.ready` and settle it: up to
    /// [`publish_concurrency`](crate::WalRelayConfig::publish_concurrency) calls of
    /// [`batch_size`](crate::WalRelayConfig::batch_size) messages in flight at once, a
    /// call starting as soon as an earlier one answers, the answers taken in order.
    ///
    /// A wave holds at most one message per partition key: it is cut before a key's
    /// second message. A broker accepting a later message of a key while refusing an
    /// earlier one (to retry), or two calls in flight at once, would otherwise put the
    /// later one first.
    pub(super) async fn publish_batch(
        &mut self,
        stream: &mut Stream,
        shutdown: &CancellationToken,
    ) -> Result<BatchEnd> {
        let wave = self
            .config
            .batch_size
            .saturating_mul(self.config.publish_concurrency);
        let n = batch_len(&stream.ready, wave);
        // `attempts`: this hand-over, counted from 1, after the retryable failures
        // this relay (since it started) met publishing the message.
        for message in stream.ready.range_mut(..n) {
            message.attempts = self.failures.get(&message.id).copied().unwrap_or(0) + 1;
        }
        let oldest = stream.oldest();
        let batch = &stream.ready.make_contiguous()[..n];
        let grace = self.config.shutdown_grace;
        // The publish future borrows the batch: it ends with this block.
        let published = {
            let mut publish = std::pin::pin!(publish_wave(
                &self.stage,
                batch,
                self.config.batch_size,
                self.config.publish_concurrency,
                self.config.retry.max_attempts,
            ));
            let mut grace_over = std::pin::pin!(async {
                shutdown.cancelled().await;
                tokio::time::sleep(grace).await;
            });
            // A publish that hangs (a stalled broker) must not freeze the lag gauges: they
            // matter most then.
            let mut lag_tick = lag_ticks(self.config.lag_interval);
            lag_tick.reset();
            loop {
                tokio::select! {
                    published = &mut publish => break published,
                    () = &mut grace_over => {
                        tracing::warn!(count = n, ?grace, "wal relay: shutdown grace expired; abandoning the publish in flight (its messages are published again by the next relay)");
                        return Ok(BatchEnd::Abandoned);
                    }
                    // Bounded, so the publish and the grace timer wait at most one
                    // interval for it.
                    _ = lag_tick.tick() => self.publish_lag(oldest).await,
                }
            }
        };
        let Wave {
            mut outcomes,
            panics,
        } = published;
        if panics > 0 {
            self.report.panics += panics;
            self.meters.panics.increment(panics);
        }
        // The messages that got an answer: the calls after a retryable failure were
        // dropped, and theirs are published again after the resume.
        let n = outcomes.len();
        let batch = &batch[..n];
        // Settled: the prefix before the first message to retry.
        let mut settled = n;
        let mut retry = None;
        for (i, outcome) in outcomes.iter_mut().enumerate() {
            let PublishOutcome::Retryable(reason) = outcome else {
                continue;
            };
            let attempts = batch[i].attempts;
            if retry.is_none() && attempts >= self.config.retry.max_attempts {
                *outcome = PublishOutcome::Permanent(format!(
                    "gave up after {attempts} attempts: {reason}"
                ));
                continue;
            }
            // Only a retryable failure counts against a message: one accepted in a
            // batch that failed elsewhere is not charged for the other's failure.
            *self.failures.entry(batch[i].id).or_insert(0) += 1;
            self.report.retried += 1;
            self.meters.retried.increment(1);
            if retry.is_none() {
                settled = i;
                retry = Some((
                    self.config.retry.delay(attempts),
                    Error::new(
                        ErrorKind::Publish,
                        format!("publish will be retried: {reason}"),
                    )
                    .with_ids(vec![batch[i].id]),
                ));
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
        self.meters.dispatched.increment(published);
        if !dead.is_empty() {
            self.meters.dead_lettered.increment(dead.len() as u64);
        }
        for _ in 0..settled {
            let message = stream.settle_front();
            self.failures.remove(&message.id);
        }
        Ok(match retry {
            Some((wait, cause)) => BatchEnd::Retry(wait, cause),
            None => BatchEnd::Settled,
        })
    }
}

/// The answers of one wave: an outcome for each message from the first up to the end
/// of the first call with a failure to retry (the calls after it are dropped), and
/// the panics caught.
struct Wave {
    outcomes: Vec<PublishOutcome>,
    panics: u64,
}

/// Publish `batch` in calls of `size` messages, `concurrency` in flight at once, the
/// answers taken in order, until a call fails a message retryably that has attempts
/// left (below `max_attempts`): the session then resumes, and the calls after it would
/// only publish again what the resume publishes anyway.
async fn publish_wave(
    stage: &PublishStage,
    batch: &[Message],
    size: usize,
    concurrency: usize,
    max_attempts: u32,
) -> Wave {
    let mut chunks = batch.chunks(size);
    let mut calls = FuturesOrdered::new();
    for chunk in chunks.by_ref().take(concurrency) {
        calls.push_back(publish_call(stage, chunk));
    }
    let mut wave = Wave {
        outcomes: Vec::with_capacity(batch.len()),
        panics: 0,
    };
    while let Some((chunk, published)) = calls.next().await {
        wave.panics += u64::from(published.panicked);
        let retry = chunk
            .iter()
            .zip(&published.outcomes)
            .any(|(m, o)| matches!(o, PublishOutcome::Retryable(_)) && m.attempts < max_attempts);
        wave.outcomes.extend(published.outcomes);
        if retry {
            break;
        }
        if let Some(next) = chunks.next() {
            calls.push_back(publish_call(stage, next));
        }
    }
    wave
}

/// One guarded call, with the messages it carried.
async fn publish_call<'a>(
    stage: &PublishStage,
    chunk: &'a [Message],
) -> (&'a [Message], outbox_core::relay::Published) {
    (chunk, stage.publish(chunk).await)
}

/// How many messages from the front of `ready` make the next batch: at most `max`, and
/// cut before the second message of a partition key (unkeyed messages are not limited).
fn batch_len(ready: &VecDeque<Message>, max: usize) -> usize {
    let mut keys = HashSet::new();
    ready
        .iter()
        .take(max)
        .take_while(|m| m.partition_key.as_deref().is_none_or(|k| keys.insert(k)))
        .count()
}
