//! Relay settings.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use crate::store::{validate_lease, MAX_CLAIM_BATCH};

/// How a [`Relay`](super::Relay) claims, publishes and waits.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RelayConfig {
    /// A name for logs and metrics labels. Default `"outbox"`.
    pub name: String,
    /// Messages per claim. Default 100.
    pub batch_size: usize,
    /// Lease per claim; must outlast publishing the whole batch, wave by wave (see
    /// [`validate`](Self::validate)). Default 30 s.
    pub lease: Duration,
    /// Messages per [`Publisher::publish`](crate::Publisher::publish) call. Default 100.
    pub publish_batch_size: usize,
    /// Publish calls in flight at once within one claimed batch. Default 4.
    pub publish_concurrency: usize,
    /// Longest a publish call may take before its messages count as failed (retryable).
    /// Default 10 s.
    pub publish_timeout: Duration,
    /// First wait after a claim found nothing. Default 100 ms.
    pub poll_interval: Duration,
    /// Longest idle wait: each empty claim doubles the wait up to this. A
    /// [`Wakeup`](super::Wakeup) ends any wait at once. Default 5 s.
    pub max_poll_interval: Duration,
    /// Backoff and dead-lettering of failed messages.
    pub retry: RetryPolicy,
    /// How long shutdown waits for publishes in flight before releasing their leases.
    /// Default 10 s.
    pub shutdown_grace: Duration,
    /// Tries for a complete/fail call that hits a retryable storage error, before the
    /// lease is left to expire. Default 3.
    pub settle_attempts: u32,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            name: "outbox".to_owned(),
            batch_size: 100,
            lease: Duration::from_secs(30),
            publish_batch_size: 100,
            publish_concurrency: 4,
            publish_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(100),
            max_poll_interval: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            shutdown_grace: Duration::from_secs(10),
            settle_attempts: 3,
        }
    }
}

impl RelayConfig {
    /// Set the name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
    /// Set messages per claim.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }
    /// Set the lease; the publish timeout is capped to half of it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self.publish_timeout = self.publish_timeout.min(lease / 2);
        self
    }
    /// Set messages per publish call and publish calls in flight.
    pub fn publish(mut self, batch_size: usize, concurrency: usize) -> Self {
        self.publish_batch_size = batch_size;
        self.publish_concurrency = concurrency;
        self
    }
    /// Set the publish timeout.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }
    /// Set the idle wait bounds.
    pub fn poll(mut self, first: Duration, max: Duration) -> Self {
        self.poll_interval = first;
        self.max_poll_interval = max;
        self
    }
    /// Set the retry policy.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }
    /// Set the shutdown grace period.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Publish waves one claimed batch takes: `ceil(ceil(batch / publish batch) /
    /// concurrency)`.
    pub fn publish_waves(&self) -> u32 {
        let calls = self.batch_size.div_ceil(self.publish_batch_size.max(1));
        u32::try_from(calls.div_ceil(self.publish_concurrency.max(1))).unwrap_or(u32::MAX)
    }

    /// Check the values. Besides each value's own bounds, the lease must cover every
    /// publish wave of a batch: `publish_waves() × publish_timeout < lease`.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) naming the first bad value.
    pub fn validate(&self) -> Result<()> {
        if self.batch_size == 0 || self.batch_size > MAX_CLAIM_BATCH {
            return Err(Error::config(format!(
                "batch_size {} is outside 1..={MAX_CLAIM_BATCH}",
                self.batch_size
            )));
        }
        validate_lease(self.lease).map_err(|e| Error::config(e.message().to_owned()))?;
        if self.publish_batch_size == 0 || self.publish_concurrency == 0 {
            return Err(Error::config(
                "publish_batch_size and publish_concurrency must be at least 1",
            ));
        }
        if self.publish_timeout.is_zero() || self.publish_timeout >= self.lease {
            return Err(Error::config(format!(
                "publish_timeout {:?} must be above zero and shorter than the lease {:?}",
                self.publish_timeout, self.lease
            )));
        }
        let budget = self.publish_timeout.saturating_mul(self.publish_waves());
        if budget >= self.lease {
            return Err(Error::config(format!(
                "a batch of {} in publish calls of {} with {} in flight takes {} waves of up to \
                 {:?}, {budget:?} in all, which the lease of {:?} does not cover; raise the \
                 lease or publish_concurrency, or lower batch_size or publish_timeout",
                self.batch_size,
                self.publish_batch_size,
                self.publish_concurrency,
                self.publish_waves(),
                self.publish_timeout,
                self.lease
            )));
        }
        if self.poll_interval.is_zero() || self.poll_interval > self.max_poll_interval {
            return Err(Error::config(
                "poll_interval must be above zero and at most max_poll_interval",
            ));
        }
        if self.settle_attempts == 0 {
            return Err(Error::config("settle_attempts must be at least 1"));
        }
        self.retry.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        RelayConfig::default().validate().unwrap();
    }

    #[test]
    fn lease_caps_publish_timeout() {
        let c = RelayConfig::default().lease(Duration::from_secs(2));
        assert_eq!(c.publish_timeout, Duration::from_secs(1));
        c.validate().unwrap();
    }

    #[test]
    fn rejects_bad_values() {
        let bad = [
            RelayConfig::default().batch_size(0),
            RelayConfig::default().publish(0, 1),
            RelayConfig::default().publish_timeout(Duration::from_secs(60)),
            RelayConfig::default().poll(Duration::from_secs(2), Duration::from_secs(1)),
            // 1000 / 10 / 4 = 25 waves of 10 s against a 30 s lease.
            RelayConfig::default().batch_size(1000).publish(10, 4),
        ];
        for c in bad {
            assert_eq!(
                c.validate().unwrap_err().kind(),
                crate::ErrorKind::Config,
                "{c:?}"
            );
        }
    }
}
