//! Waking an idle relay.

use std::sync::Arc;

use tokio::sync::Notify;

/// A handle that ends a relay's idle wait at once.
///
/// Call [`wake`](Self::wake) after committing a transaction that enqueued messages, or
/// hand a clone to a notification listener (Postgres `LISTEN`). Wake-ups are not lost: one
/// that arrives while the relay is busy makes its next wait return immediately. Many
/// wake-ups while busy collapse into one.
#[derive(Debug, Clone, Default)]
pub struct Wakeup(Arc<Notify>);

impl Wakeup {
    /// A new handle, not yet attached to any relay.
    pub fn new() -> Self {
        Self::default()
    }

    /// End the relay's current or next idle wait.
    pub fn wake(&self) {
        self.0.notify_one();
    }

    pub(crate) async fn woken(&self) {
        self.0.notified().await;
    }
}
