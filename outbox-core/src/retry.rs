//! Backoff between attempts: [`RetryPolicy`].

use std::time::Duration;

use crate::error::{Error, Result};
use crate::store::Disposition;

/// Exponential backoff with jitter and a cap, then dead-letter.
///
/// Attempt `n` (1-based) that fails is retried after
/// `min(initial * multiplier^(n-1), max_delay)`, reduced by a random fraction of up to
/// `jitter` so relays that failed together do not retry together. The attempt numbered
/// `max_attempts` is the last: its failure dead-letters the message.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts before dead-lettering (at least 1). Default 10.
    pub max_attempts: u32,
    /// Delay after the first failure. Default 1 s.
    pub initial_delay: Duration,
    /// Growth factor per attempt (at least 1.0). Default 2.0.
    pub multiplier: f64,
    /// Longest delay. Default 5 minutes.
    pub max_delay: Duration,
    /// Fraction of the delay randomly taken off, in `[0, 1]`. Default 0.2.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 10,
            initial_delay: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Duration::from_secs(300),
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// A policy with [`max_attempts`](Self::max_attempts) and the default backoff.
    pub fn new(max_attempts: u32) -> Self {
        RetryPolicy {
            max_attempts,
            ..RetryPolicy::default()
        }
    }

    /// Set [`initial_delay`](Self::initial_delay), the delay after the first failure.
    #[must_use]
    pub fn with_initial_delay(mut self, delay: Duration) -> Self {
        self.initial_delay = delay;
        self
    }

    /// Set [`max_delay`](Self::max_delay), the longest delay.
    #[must_use]
    pub fn with_max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// Set [`jitter`](Self::jitter), the fraction of the delay randomly taken off.
    #[must_use]
    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Check the values.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for zero attempts, a multiplier
    /// below 1, a jitter outside `[0, 1]` or `initial_delay > max_delay`.
    pub fn validate(&self) -> Result<()> {
        if self.max_attempts == 0 {
            return Err(Error::config("retry policy needs at least one attempt"));
        }
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return Err(Error::config(
                "retry multiplier must be a finite number >= 1",
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(Error::config("retry jitter must be within [0, 1]"));
        }
        if self.initial_delay > self.max_delay {
            return Err(Error::config("initial retry delay exceeds the maximum"));
        }
        Ok(())
    }

    /// The delay before the next attempt, without jitter, after attempt `attempt`
    /// (1-based) failed.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(64);
        let factor = self
            .multiplier
            .powi(i32::try_from(exponent).unwrap_or(i32::MAX));
        let secs = self.initial_delay.as_secs_f64() * factor;
        if !secs.is_finite() || secs >= self.max_delay.as_secs_f64() {
            self.max_delay
        } else {
            Duration::from_secs_f64(secs)
        }
    }

    /// The delay with jitter applied.
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self.base_delay(attempt);
        base.mul_f64(1.0 - self.jitter * fastrand::f64())
    }

    /// What to do after attempt number `attempt` (1-based, as counted by the claim)
    /// failed with a retryable error.
    pub fn after_failure(&self, attempt: u32) -> Disposition {
        if attempt >= self.max_attempts {
            Disposition::DeadLetter
        } else {
            Disposition::Retry {
                after: self.delay(attempt),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_up_to_the_cap() {
        let p = RetryPolicy::default()
            .with_initial_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(1));
        assert_eq!(p.base_delay(1), Duration::from_millis(100));
        assert_eq!(p.base_delay(2), Duration::from_millis(200));
        assert_eq!(p.base_delay(4), Duration::from_millis(800));
        assert_eq!(p.base_delay(5), Duration::from_secs(1));
        assert_eq!(p.base_delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let p = RetryPolicy::default()
            .with_initial_delay(Duration::from_secs(10))
            .with_max_delay(Duration::from_secs(10))
            .with_jitter(0.5);
        let mut seen_below = false;
        for _ in 0..200 {
            let d = p.delay(3);
            assert!(
                d <= Duration::from_secs(10) && d >= Duration::from_secs(5),
                "{d:?}"
            );
            seen_below |= d < Duration::from_secs(10);
        }
        assert!(seen_below, "jitter never applied");
        let none = p.clone().with_jitter(0.0);
        assert_eq!(none.delay(3), Duration::from_secs(10));
    }

    #[test]
    fn last_attempt_dead_letters() {
        let p = RetryPolicy::new(3);
        assert!(matches!(p.after_failure(1), Disposition::Retry { .. }));
        assert!(matches!(p.after_failure(2), Disposition::Retry { .. }));
        assert_eq!(p.after_failure(3), Disposition::DeadLetter);
        assert_eq!(p.after_failure(4), Disposition::DeadLetter);
    }

    #[test]
    fn validation() {
        assert!(RetryPolicy::default().validate().is_ok());
        assert!(RetryPolicy::new(0).validate().is_err());
        assert!(RetryPolicy::default().with_jitter(1.5).validate().is_err());
        let inverted = RetryPolicy::default()
            .with_initial_delay(Duration::from_secs(2))
            .with_max_delay(Duration::from_secs(1));
        assert!(inverted.validate().is_err());
    }
}
