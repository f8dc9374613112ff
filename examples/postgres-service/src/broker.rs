//! [`InProcessBroker`]: the stand-in for a real broker client.

use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use outbox::{Message, PublishOutcome, Publisher, Result};

/// Stands in for a broker client: accepts every message, logs it and keeps it, so a
/// test (or a curious reader) can see what was published and how often.
///
/// Real broker publishers come later; any [`Publisher`] can take its place.
#[derive(Debug, Default)]
pub struct InProcessBroker {
    published: Mutex<Vec<Message>>,
}

impl InProcessBroker {
    /// Every message published so far, in publish order, repeats included.
    pub fn published(&self) -> Vec<Message> {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[async_trait]
impl Publisher for InProcessBroker {
    async fn publish(&self, batch: &[Message]) -> Result<Vec<PublishOutcome>> {
        let mut published = self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for m in batch {
            tracing::info!(
                destination = %m.destination,
                id = %m.id,
                payload = %String::from_utf8_lossy(&m.payload),
                "broker <- message"
            );
            published.push(m.clone());
        }
        Ok(vec![PublishOutcome::Published; batch.len()])
    }
}
