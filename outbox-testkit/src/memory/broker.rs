//! [`MemoryBroker`]: the reference publisher the publisher suite is proven against.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_core::{Message, MessageId, PublishOutcome, Publisher, Result};

use crate::harness::publisher::Received;

/// JetStream's default duplicate window.
const DEFAULT_DEDUP_WINDOW: Duration = Duration::from_secs(120);

#[derive(Debug, Default)]
struct State {
    /// Destination prefixes something is bound to.
    bound: Vec<String>,
    /// What was stored, with its destination, in order.
    stored: Vec<(String, Received)>,
    /// When each id was last stored, for the dedup window.
    seen: HashMap<MessageId, Instant>,
    /// Stopped by [`MemoryBroker::stop`]: every publish is retryable until started.
    down: bool,
}

/// An in-memory broker that behaves the way the publisher contract asks of a real one:
/// the message id is the dedup id, a repeat within the dedup window is dropped (and
/// reported [`Published`](PublishOutcome::Published)), a destination nothing is bound to
/// is [`Permanent`](PublishOutcome::Permanent) for that message alone, and everything
/// else is stored as given.
///
/// Clones share the broker. Unlike [`RecordingPublisher`](crate::RecordingPublisher),
/// which records every publish to test relays, this is the model of a broker, to test
/// the publisher suite itself and code that reads back what reached the broker.
#[derive(Debug, Clone)]
pub struct MemoryBroker {
    dedup_window: Duration,
    state: Arc<Mutex<State>>,
}

impl Default for MemoryBroker {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBroker {
    /// A broker with nothing bound and JetStream's default two-minute dedup window.
    pub fn new() -> Self {
        MemoryBroker {
            dedup_window: DEFAULT_DEDUP_WINDOW,
            state: Arc::default(),
        }
    }

    /// Drop repeats of an id published within `window` of its first store instead.
    #[must_use]
    pub fn with_dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = window;
        self
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Store messages to every destination starting with `prefix`.
    pub fn bind(&self, prefix: impl Into<String>) {
        self.state().bound.push(prefix.into());
    }

    /// Stop the broker: until [`start`](Self::start), every message of every publish is
    /// [`Retryable`](PublishOutcome::Retryable), as with a broker that is restarting.
    /// What it stored is kept.
    pub fn stop(&self) {
        self.state().down = true;
    }

    /// Start a stopped broker again.
    pub fn start(&self) {
        self.state().down = false;
    }

    /// What the broker holds for `destination`, in the order it stored it.
    pub fn received(&self, destination: &str) -> Vec<Received> {
        self.state()
            .stored
            .iter()
            .filter(|(d, _)| d == destination)
            .map(|(_, r)| r.clone())
            .collect()
    }

    fn publish_one(&self, state: &mut State, message: &Message) -> PublishOutcome {
        if state.down {
            return PublishOutcome::Retryable("the broker is down".to_owned());
        }
        if !state
            .bound
            .iter()
            .any(|prefix| message.destination.starts_with(prefix.as_str()))
        {
            return PublishOutcome::Permanent(format!(
                "nothing is bound to destination {:?}",
                message.destination
            ));
        }
        let now = Instant::now();
        if let Some(first) = state.seen.get(&message.id) {
            if now.duration_since(*first) < self.dedup_window {
                return PublishOutcome::Published;
            }
        }
        state.seen.insert(message.id, now);
        let received = Received::new(message.payload.clone())
            .with_dedup_id(Some(message.id.to_string()))
            .with_content_type(message.content_type.clone())
            .with_partition_key(message.partition_key.clone())
            .with_headers(message.headers.clone());
        state.stored.push((message.destination.clone(), received));
        PublishOutcome::Published
    }
}

#[async_trait]
impl Publisher for MemoryBroker {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        let mut state = self.state();
        Ok(batch
            .iter()
            .map(|m| self.publish_one(&mut state, m))
            .collect())
    }
}
