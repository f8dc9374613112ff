//! One backoff schedule for every in-process wait that repeats: [`Backoff`].
//!
//! Settle retries, listener reconnects, the relay's idle poll and test polls all wait
//! longer after each miss, up to a cap, with jitter so processes that missed together
//! do not retry together. (The persisted retry schedule of messages is
//! [`RetryPolicy`](crate::RetryPolicy): it computes a due time stored with the row, not
//! an in-process wait.)

use std::time::Duration;

/// Exponential backoff: `first`, doubling on every [`next_delay`](Self::next_delay) up
/// to `max`, each wait reduced by a random fraction of up to
/// [`jitter`](Self::with_jitter) (default 0.2).
///
/// ```
/// use std::time::Duration;
/// use outbox_core::backend::Backoff;
///
/// let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(35))
///     .with_jitter(0.0);
/// let waits: Vec<_> = (0..4).map(|_| backoff.next_delay()).collect();
/// assert_eq!(waits, [10, 20, 35, 35].map(Duration::from_millis));
/// backoff.reset();
/// assert_eq!(backoff.next_delay(), Duration::from_millis(10));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    jitter: f64,
    next: Duration,
}

impl Backoff {
    /// Start at `first` and double up to `max` (`max` is raised to `first` if lower).
    pub fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max: max.max(first),
            jitter: 0.2,
            next: first,
        }
    }

    /// Take a random fraction of up to `jitter` (clamped to `[0, 1]`) off every wait.
    #[must_use]
    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self
    }

    /// The wait before the next try, then double the one after (up to the cap).
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        base.mul_f64(1.0 - self.jitter * fastrand::f64())
    }

    /// Back to the first wait, after a success.
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// Wait [`next_delay`](Self::next_delay).
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(1), ms(5)).with_jitter(0.0);
        let waits: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(waits, [ms(1), ms(2), ms(4), ms(5), ms(5)]);
        b.reset();
        assert_eq!(b.next_delay(), ms(1));
        let mut low_cap = Backoff::new(ms(3), ms(1)).with_jitter(0.0);
        assert_eq!((low_cap.next_delay(), low_cap.next_delay()), (ms(3), ms(3)));
    }

    #[test]
    fn jitter_only_shortens() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(100)).with_jitter(0.5);
        let mut shorter = false;
        for _ in 0..100 {
            let d = b.next_delay();
            assert!(d <= ms(100) && d >= ms(50), "{d:?}");
            shorter |= d < ms(100);
        }
        assert!(shorter, "jitter never applied");
        for silly in [-1.0, f64::NAN, 7.0] {
            let mut b = Backoff::new(ms(10), ms(10)).with_jitter(silly);
            let d = b.next_delay();
            assert!(d <= ms(10), "{silly}: {d:?}");
        }
    }
}
