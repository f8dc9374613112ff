//! Publishers that stand in for a broker.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use outbox_core::{ErrorKind, Message, PublishOutcome, Publisher};
use tokio::sync::watch;

/// Accepts every message at once: the relay's cost without a broker.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopPublisher;

#[async_trait]
impl Publisher for NoopPublisher {
    async fn publish(&self, batch: &[Message]) -> outbox_core::Result<Vec<PublishOutcome>> {
        Ok(vec![PublishOutcome::Published; batch.len()])
    }
}

/// A [`NoopPublisher`] behind the trait object relays take.
pub fn noop_publisher() -> Arc<dyn Publisher> {
    Arc::new(NoopPublisher)
}

/// Accepts everything and counts it, so a drain knows when it is done
/// ([`Counting::wait_for`]); made [`with_latencies`](Counting::with_latencies), it
/// also keeps each message's time from its `created_at` to the publish call.
#[derive(Debug)]
pub struct Counting {
    count: watch::Sender<u64>,
    latencies: Option<Mutex<Vec<Duration>>>,
}

impl Default for Counting {
    fn default() -> Self {
        Counting::new()
    }
}

impl Counting {
    /// A publisher that counts.
    pub fn new() -> Self {
        Counting {
            count: watch::Sender::new(0),
            latencies: None,
        }
    }

    /// A publisher that counts and keeps every message's commit-to-publish latency
    /// (`created_at` to the publish call, by the wall clock).
    pub fn with_latencies() -> Self {
        Counting {
            latencies: Some(Mutex::new(Vec::new())),
            ..Counting::new()
        }
    }

    /// Messages published so far.
    pub fn count(&self) -> u64 {
        *self.count.borrow()
    }

    /// Wait until at least `n` messages were published; a `Timeout` error naming the
    /// count reached when `timeout` passes first.
    pub async fn wait_for(&self, n: u64, timeout: Duration) -> outbox_core::Result<()> {
        let mut counted = self.count.subscribe();
        // The sender lives in `self`, so the wait ends only by the count or the clock.
        let reached = tokio::time::timeout(timeout, async {
            counted.wait_for(|c| *c >= n).await.is_ok()
        })
        .await
        .unwrap_or(false);
        if reached {
            return Ok(());
        }
        Err(outbox_core::Error::new(
            ErrorKind::Timeout,
            format!("published {} of {n} within {timeout:?}", self.count()),
        ))
    }

    /// The latencies kept so far, in publish order (empty unless made
    /// [`with_latencies`](Counting::with_latencies)).
    pub fn latencies(&self) -> Vec<Duration> {
        self.latencies.as_ref().map_or_else(Vec::new, |l| {
            l.lock().unwrap_or_else(|e| e.into_inner()).clone()
        })
    }
}

#[async_trait]
impl Publisher for Counting {
    async fn publish(&self, batch: &[Message]) -> outbox_core::Result<Vec<PublishOutcome>> {
        if let Some(latencies) = &self.latencies {
            let now = SystemTime::now();
            let mut latencies = latencies.lock().unwrap_or_else(|e| e.into_inner());
            latencies.extend(
                batch
                    .iter()
                    .map(|m| now.duration_since(m.created_at).unwrap_or_default()),
            );
        }
        self.count.send_modify(|n| *n += batch.len() as u64);
        Ok(vec![PublishOutcome::Published; batch.len()])
    }
}
