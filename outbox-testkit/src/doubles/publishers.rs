//! Publishers for tests: recording, failing, slow, rejecting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{Error, ErrorKind, Message, MessageId, PublishOutcome, Publisher, Result};
use tokio::sync::watch;

/// What a [`RecordingPublisher`] does with each message it is handed.
#[derive(Debug, Clone, Default)]
enum Behaviour {
    #[default]
    Accept,
    /// Retryable failure for the first `n` times each message is seen.
    FailFirst(u32),
    /// Retryable failure for every message to this destination.
    FailDestination(String),
    /// Permanent failure for every message.
    RejectAll,
}

#[derive(Debug, Default)]
struct Log {
    published: Vec<Message>,
    published_ids: std::collections::HashSet<MessageId>,
    seen: HashMap<MessageId, u32>,
    calls: u64,
}

/// A publisher that records what it published, optionally failing or slowing down.
///
/// - [`new`](Self::new) accepts everything;
/// - [`failing_first`](Self::failing_first) fails each message `n` times (retryable),
///   then accepts it;
/// - [`failing_destination`](Self::failing_destination) fails one destination always;
/// - [`rejecting`](Self::rejecting) fails everything permanently;
/// - [`with_delay`](Self::with_delay) makes every call slow;
/// - [`hold_destination`](Self::hold_destination) blocks calls for one destination
///   until the returned [`Gate`] opens.
///
/// Clones share the log. Counting helpers report duplicates (the same id published more
/// than once) and per-key order.
#[derive(Debug, Clone)]
pub struct RecordingPublisher {
    behaviour: Behaviour,
    delay: Duration,
    hold: Option<(String, watch::Receiver<bool>)>,
    log: Arc<Mutex<Log>>,
    /// Number of distinct ids published so far.
    unique: watch::Sender<usize>,
    /// Number of publish calls started so far.
    calls: watch::Sender<u64>,
}

impl Default for RecordingPublisher {
    fn default() -> Self {
        Self::new()
    }
}

impl RecordingPublisher {
    /// Accepts every message.
    pub fn new() -> Self {
        RecordingPublisher {
            behaviour: Behaviour::Accept,
            delay: Duration::ZERO,
            hold: None,
            log: Arc::default(),
            unique: watch::Sender::new(0),
            calls: watch::Sender::new(0),
        }
    }

    /// Fails each message with a retryable error the first `n` times it is seen.
    pub fn failing_first(n: u32) -> Self {
        RecordingPublisher {
            behaviour: Behaviour::FailFirst(n),
            ..Self::new()
        }
    }

    /// Fails every message to `destination` with a retryable error.
    pub fn failing_destination(destination: impl Into<String>) -> Self {
        RecordingPublisher {
            behaviour: Behaviour::FailDestination(destination.into()),
            ..Self::new()
        }
    }

    /// Fails every message permanently.
    pub fn rejecting() -> Self {
        RecordingPublisher {
            behaviour: Behaviour::RejectAll,
            ..Self::new()
        }
    }

    /// Wait `delay` in every publish call before answering.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Block every publish call that includes a message to `destination` until the
    /// returned gate is opened. Calls count as started (see
    /// [`wait_for_calls`](Self::wait_for_calls)) while they wait.
    pub fn hold_destination(mut self, destination: impl Into<String>) -> (Self, Gate) {
        let (open, opened) = watch::channel(false);
        self.hold = Some((destination.into(), opened));
        (self, Gate(open))
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every successful publish, in order, repeats included.
    pub fn published(&self) -> Vec<Message> {
        self.log().published.clone()
    }

    /// Successful publishes, repeats included.
    pub fn published_count(&self) -> usize {
        self.log().published.len()
    }

    /// Distinct ids published.
    pub fn unique_count(&self) -> usize {
        *self.unique.borrow()
    }

    /// Publishes of an id that had already been published.
    pub fn duplicates(&self) -> usize {
        self.published_count() - self.unique_count()
    }

    /// How many times `id` was handed to this publisher, failures included.
    pub fn times_seen(&self, id: MessageId) -> u32 {
        self.log().seen.get(&id).copied().unwrap_or(0)
    }

    /// Publish calls started.
    pub fn calls(&self) -> u64 {
        *self.calls.borrow()
    }

    /// For each partition key, the ids in the order they were first published.
    pub fn first_publish_order_by_key(&self) -> HashMap<String, Vec<MessageId>> {
        let log = self.log();
        let mut seen = std::collections::HashSet::new();
        let mut by_key: HashMap<String, Vec<MessageId>> = HashMap::new();
        for m in &log.published {
            if let Some(key) = &m.partition_key {
                if seen.insert(m.id) {
                    by_key.entry(key.clone()).or_default().push(m.id);
                }
            }
        }
        by_key
    }

    /// Wait until at least `n` distinct ids were published.
    ///
    /// # Errors
    /// [`ErrorKind::Timeout`] after `timeout`, saying how many arrived.
    pub async fn wait_for_unique(&self, n: usize, timeout: Duration) -> Result<()> {
        let mut rx = self.unique.subscribe();
        let reached =
            tokio::time::timeout(timeout, async { rx.wait_for(|u| *u >= n).await.is_ok() }).await;
        match reached {
            Ok(true) => Ok(()),
            _ => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "{} of {n} messages published within {timeout:?}",
                    self.unique_count()
                ),
            )),
        }
    }

    /// Wait until at least `n` publish calls have started.
    ///
    /// # Errors
    /// [`ErrorKind::Timeout`] after `timeout`.
    pub async fn wait_for_calls(&self, n: u64, timeout: Duration) -> Result<()> {
        let mut rx = self.calls.subscribe();
        let reached =
            tokio::time::timeout(timeout, async { rx.wait_for(|c| *c >= n).await.is_ok() }).await;
        match reached {
            Ok(true) => Ok(()),
            _ => Err(Error::new(
                ErrorKind::Timeout,
                format!("{} of {n} publish calls within {timeout:?}", self.calls()),
            )),
        }
    }

    fn outcome(&self, message: &Message, seen: u32) -> PublishOutcome {
        match &self.behaviour {
            Behaviour::Accept => PublishOutcome::Published,
            Behaviour::FailFirst(n) if seen <= *n => {
                PublishOutcome::Retryable(format!("injected failure {seen} of {n}"))
            }
            Behaviour::FailFirst(_) => PublishOutcome::Published,
            Behaviour::FailDestination(d) if *d == message.destination => {
                PublishOutcome::Retryable(format!("broker down for {d}"))
            }
            Behaviour::FailDestination(_) => PublishOutcome::Published,
            Behaviour::RejectAll => PublishOutcome::Permanent("rejected by broker".to_owned()),
        }
    }
}

#[async_trait]
impl Publisher for RecordingPublisher {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        self.calls.send_modify(|c| *c += 1);
        self.log().calls += 1;
        if let Some((destination, opened)) = &self.hold {
            if batch.iter().any(|m| m.destination == *destination) {
                let mut opened = opened.clone();
                let _ = opened.wait_for(|open| *open).await;
            }
        }
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let mut log = self.log();
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut newly_unique = 0;
        for message in batch {
            let seen = {
                let n = log.seen.entry(message.id).or_insert(0);
                *n += 1;
                *n
            };
            let outcome = self.outcome(message, seen);
            if outcome == PublishOutcome::Published {
                if log.published_ids.insert(message.id) {
                    newly_unique += 1;
                }
                log.published.push(message.clone());
            }
            outcomes.push(outcome);
        }
        drop(log);
        if newly_unique > 0 {
            self.unique.send_modify(|u| *u += newly_unique);
        }
        Ok(outcomes)
    }
}

/// Releases the calls a [`RecordingPublisher::hold_destination`] holds.
#[derive(Debug, Clone)]
pub struct Gate(watch::Sender<bool>);

impl Gate {
    /// Let held calls (and all later ones) proceed.
    pub fn open(&self) {
        self.0.send_replace(true);
    }
}
