//! Waking an idle relay.

use std::sync::Arc;

use tokio::sync::watch;

/// A handle that ends a relay's idle wait at once.
///
/// Call [`wake`](Self::wake) after committing a transaction that enqueued messages, or
/// hand a clone to a notification listener (Postgres `LISTEN`). A wake-up means "work
/// may have been committed before this call": it ends the idle wait of every relay
/// sharing the handle, unless the relay has started a claim since (which sees that
/// work). So a wake-up that arrives while the relay is busy is not lost, many of them
/// collapse into one claim, and one that a claim already covered does not cause an
/// extra claim.
#[derive(Debug, Clone)]
pub struct Wakeup(Arc<watch::Sender<u64>>);

impl Default for Wakeup {
    fn default() -> Self {
        Wakeup(Arc::new(watch::Sender::new(0)))
    }
}

impl Wakeup {
    /// A new handle, not yet attached to any relay.
    pub fn new() -> Self {
        Self::default()
    }

    /// End the idle wait of every relay sharing this handle, unless it claims anew
    /// first.
    pub fn wake(&self) {
        self.0
            .send_modify(|generation| *generation = generation.wrapping_add(1));
    }

    /// A receiver for one relay loop: [`Receiver::seen`] before each claim,
    /// [`Receiver::woken`] while idle.
    pub(crate) fn subscribe(&self) -> Receiver {
        Receiver(self.0.subscribe())
    }
}

/// One relay loop's view of a [`Wakeup`].
#[derive(Debug)]
pub(crate) struct Receiver(watch::Receiver<u64>);

impl Receiver {
    /// Mark every wake-up so far as covered (called as a claim starts).
    pub(crate) fn seen(&mut self) {
        self.0.borrow_and_update();
    }

    /// Resolve at the first wake-up after the last [`seen`](Self::seen).
    pub(crate) async fn woken(&mut self) {
        if self.0.changed().await.is_err() {
            // Every sender is gone, which cannot happen while the relay holds one.
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn resolves(rx: &mut Receiver) -> bool {
        tokio::time::timeout(Duration::from_millis(20), rx.woken())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_wake_before_a_claim_is_covered_by_it() {
        let wakeup = Wakeup::new();
        let mut rx = wakeup.subscribe();
        wakeup.wake();
        rx.seen();
        assert!(!resolves(&mut rx).await, "the claim already saw that work");
        wakeup.wake();
        wakeup.wake();
        assert!(
            resolves(&mut rx).await,
            "a wake after the claim ends the wait"
        );
        assert!(!resolves(&mut rx).await, "many wakes collapse into one");
    }

    #[tokio::test]
    async fn every_relay_sharing_a_handle_wakes() {
        let wakeup = Wakeup::new();
        let (mut a, mut b) = (wakeup.subscribe(), wakeup.clone().subscribe());
        wakeup.wake();
        assert!(resolves(&mut a).await && resolves(&mut b).await);
    }
}
