//! Relay settings.

use std::time::Duration;

use crate::backend::validate_lease;
use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use crate::store::MAX_CLAIM_BATCH;

/// How a [`Relay`](super::Relay) claims, publishes and waits.
///
/// Setters are independent of each other: none rewrites another field, so their order
/// does not matter. [`validate`](Self::validate) (run by [`Relay::new`](super::Relay::new))
/// checks the combination.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct RelayConfig {
    /// A name for logs and metrics labels. Default `"outbox"`.
    pub name: String,
    /// Messages per claim. Default 100.
    pub batch_size: usize,
    /// Lease per claim; must outlast publishing the whole batch, wave by wave, with a
    /// tenth to spare (see [`lease_allows_publish`](Self::lease_allows_publish)).
    /// Default 30 s.
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
    /// Claimed batches one relay loop may have at once, 1 to [`MAX_PIPELINE_DEPTH`].
    /// Above 1 the loop claims the next batch while earlier ones publish, so database
    /// and broker latency overlap; each batch runs its own
    /// [`publish_concurrency`](Self::publish_concurrency) calls, so up to
    /// `pipeline_depth × publish_concurrency` publish calls are in flight. Default
    /// [`DEFAULT_PIPELINE_DEPTH`].
    ///
    /// It also sets the duplicate window: a relay killed at any point may leave up to
    /// `pipeline_depth × batch_size` messages published but not settled (every batch it
    /// holds, and the settles riding with a claim on the wire), which are published
    /// again once their leases lapse. The chaos suite asserts that bound.
    pub pipeline_depth: usize,
}

/// The most batches one relay loop may have claimed at once
/// ([`RelayConfig::pipeline_depth`]).
pub const MAX_PIPELINE_DEPTH: usize = 16;

/// The default [`RelayConfig::pipeline_depth`]: chosen by measurement (see the README's
/// benchmarks).
pub const DEFAULT_PIPELINE_DEPTH: usize = 2;

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
            pipeline_depth: DEFAULT_PIPELINE_DEPTH,
        }
    }
}

impl RelayConfig {
    /// Set [`name`](Self::name).
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Set [`batch_size`](Self::batch_size), the messages per claim.
    #[must_use]
    pub fn with_batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Set [`lease`](Self::lease), the lease per claim.
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Set [`publish_batch_size`](Self::publish_batch_size), the messages per publish
    /// call.
    #[must_use]
    pub fn with_publish_batch_size(mut self, n: usize) -> Self {
        self.publish_batch_size = n;
        self
    }

    /// Set [`publish_concurrency`](Self::publish_concurrency), the publish calls in
    /// flight at once within one claimed batch.
    #[must_use]
    pub fn with_publish_concurrency(mut self, calls: usize) -> Self {
        self.publish_concurrency = calls;
        self
    }

    /// Set [`publish_timeout`](Self::publish_timeout).
    #[must_use]
    pub fn with_publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Set [`poll_interval`](Self::poll_interval), the first wait after an empty claim.
    #[must_use]
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Set [`max_poll_interval`](Self::max_poll_interval), the longest idle wait.
    #[must_use]
    pub fn with_max_poll_interval(mut self, interval: Duration) -> Self {
        self.max_poll_interval = interval;
        self
    }

    /// Set [`retry`](Self::retry), the retry policy.
    #[must_use]
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Set [`shutdown_grace`](Self::shutdown_grace), the shutdown grace period.
    #[must_use]
    pub fn with_shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Set [`pipeline_depth`](Self::pipeline_depth), the batches one loop may have
    /// claimed at once (1 turns pipelining off).
    #[must_use]
    pub fn with_pipeline_depth(mut self, depth: usize) -> Self {
        self.pipeline_depth = depth;
        self
    }

    /// Publish waves one claimed batch takes: `ceil(ceil(batch / publish batch) /
    /// concurrency)`.
    pub fn publish_waves(&self) -> u32 {
        let calls = self.batch_size.div_ceil(self.publish_batch_size.max(1));
        u32::try_from(calls.div_ceil(self.publish_concurrency.max(1))).unwrap_or(u32::MAX)
    }

    /// The part of the lease kept in reserve: a publish may start only if it would end,
    /// at its timeout, a tenth of the lease before the lease lapses (time for the
    /// complete to land, and for clock drift between relay and storage).
    pub fn lease_margin(&self) -> Duration {
        self.lease / 10
    }

    /// The time [`validate`](Self::validate) leaves for the claim round trip itself, a
    /// twentieth of the lease: the relay counts a batch's time from the moment it sent
    /// the claim (the lease may start as soon as the storage runs it), so a claim is
    /// never free.
    pub fn claim_allowance(&self) -> Duration {
        self.lease / 20
    }

    /// The one rule that decides whether a publish may start `elapsed` after its batch's
    /// claim was sent: `elapsed + publish_timeout + lease_margin() <= lease`.
    ///
    /// The relay releases a chunk (unpublished, attempt given back) when this is false
    /// at the moment its publish would start, and [`validate`](Self::validate) refuses
    /// a config under which it is false for the last wave of a batch whose claim took
    /// [`claim_allowance`](Self::claim_allowance), so a config that validates publishes
    /// whenever its claims answer within that allowance.
    pub fn lease_allows_publish(&self, elapsed: Duration) -> bool {
        elapsed
            .saturating_add(self.publish_timeout)
            .saturating_add(self.lease_margin())
            <= self.lease
    }

    /// Check the values for a store that does not renew leases. Besides each value's
    /// own bounds, the lease must cover every publish wave of a batch:
    /// [`lease_allows_publish`](Self::lease_allows_publish) must hold when the last
    /// wave starts, `claim_allowance() + (publish_waves() - 1) × publish_timeout` after
    /// the claim was sent.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) naming the first bad value.
    pub fn validate(&self) -> Result<()> {
        self.validate_for(false)
    }

    /// Check the values for a store that renews leases (`renewal`,
    /// [`StoreCapabilities::lease_renewal`](crate::store::StoreCapabilities::lease_renewal)) or
    /// not, as [`Relay::new`](super::Relay::new) does. With renewal, a batch renews its
    /// leases before any wave that would not fit in what is left, so only the first
    /// wave must fit: `lease_allows_publish(claim_allowance())`, whatever the number of
    /// waves. Without it, as [`validate`](Self::validate).
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) naming the first bad value.
    pub fn validate_for(&self, renewal: bool) -> Result<()> {
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
        if self.pipeline_depth == 0 || self.pipeline_depth > MAX_PIPELINE_DEPTH {
            return Err(Error::config(format!(
                "pipeline_depth {} is outside 1..={MAX_PIPELINE_DEPTH}",
                self.pipeline_depth
            )));
        }
        if self.publish_timeout.is_zero() {
            return Err(Error::config("publish_timeout must be above zero"));
        }
        let waves_to_cover = if renewal {
            0
        } else {
            self.publish_waves().saturating_sub(1)
        };
        let last_wave_starts = self
            .claim_allowance()
            .saturating_add(self.publish_timeout.saturating_mul(waves_to_cover));
        if !self.lease_allows_publish(last_wave_starts) {
            return Err(Error::config(format!(
                "a batch of {} in publish calls of {} with {} in flight takes {} waves of up to \
                 {:?}; with a twentieth of the lease left for the claim and a tenth kept in \
                 reserve, the lease of {:?} does not cover them; raise the lease or publish_concurrency, or lower batch_size or \
                 publish_timeout",
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
        self.retry.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MAX_LEASE, MIN_LEASE};

    fn kind(c: &RelayConfig) -> Option<crate::ErrorKind> {
        c.validate().err().map(|e| e.kind())
    }

    #[test]
    fn defaults_are_valid() {
        RelayConfig::default().validate().unwrap();
    }

    #[test]
    fn setters_do_not_touch_other_fields() {
        let c = RelayConfig::default().with_lease(Duration::from_secs(2));
        assert_eq!(c.publish_timeout, Duration::from_secs(10));
        assert_eq!(kind(&c), Some(crate::ErrorKind::Config));
        let ordered = RelayConfig::default()
            .with_publish_timeout(Duration::from_secs(1))
            .with_lease(Duration::from_secs(2));
        let reversed = RelayConfig::default()
            .with_lease(Duration::from_secs(2))
            .with_publish_timeout(Duration::from_secs(1));
        assert_eq!(ordered, reversed);
        ordered.validate().unwrap();
    }

    #[test]
    fn the_release_rule_is_the_validation_rule() {
        let lease = Duration::from_secs(10);
        let c = RelayConfig::default()
            .with_lease(lease)
            .with_publish_timeout(Duration::from_millis(8500));
        assert_eq!(c.claim_allowance(), Duration::from_millis(500));
        // 0.5 s claim + 8.5 s + 1 s margin = 10 s: the config validates, and a batch
        // whose claim answered within the allowance publishes; a later one is released.
        c.validate().unwrap();
        assert!(c.lease_allows_publish(Duration::ZERO));
        assert!(c.lease_allows_publish(c.claim_allowance()));
        assert!(!c.lease_allows_publish(c.claim_allowance() + Duration::from_nanos(1)));
        let over = c
            .clone()
            .with_publish_timeout(Duration::from_millis(8500) + Duration::from_nanos(1));
        assert!(!over.lease_allows_publish(over.claim_allowance()));
        assert_eq!(kind(&over), Some(crate::ErrorKind::Config));
        // The bug this rule replaced: 9 s + 1 s margin fits only a claim that took no
        // time, so every real batch would be released unpublished.
        let never = c.clone().with_publish_timeout(Duration::from_secs(9));
        assert!(!never.lease_allows_publish(Duration::from_micros(1)));
        assert_eq!(kind(&never), Some(crate::ErrorKind::Config));
        assert!(
            !c.lease_allows_publish(Duration::MAX),
            "saturates, never overflows"
        );
    }

    #[test]
    fn the_last_wave_must_fit() {
        // 4 calls of 25, 2 at a time: 2 waves. The second starts after one timeout.
        let base = RelayConfig::default()
            .with_batch_size(100)
            .with_publish_batch_size(25)
            .with_publish_concurrency(2)
            .with_lease(Duration::from_secs(10));
        assert_eq!(base.publish_waves(), 2);
        // 0.5 s claim + 4 s + 4 s + 1 s margin <= 10 s.
        base.clone()
            .with_publish_timeout(Duration::from_secs(4))
            .validate()
            .unwrap();
        // 0.5 s + 4.25 s + 4.25 s + 1 s = 10 s: still fits exactly.
        base.clone()
            .with_publish_timeout(Duration::from_millis(4250))
            .validate()
            .unwrap();
        let late = base
            .clone()
            .with_publish_timeout(Duration::from_millis(4251));
        assert_eq!(kind(&late), Some(crate::ErrorKind::Config));
        // 1000 / 10 / 4 = 25 waves of 10 s against a 30 s lease.
        let wide = RelayConfig::default()
            .with_batch_size(1000)
            .with_publish_batch_size(10)
            .with_publish_concurrency(4);
        assert_eq!(wide.publish_waves(), 25);
        assert!(kind(&wide).is_some());
        wide.validate_for(true)
            .expect("with renewal only the first wave must fit");
        assert!(
            RelayConfig::default()
                .with_publish_timeout(Duration::from_secs(27))
                .validate_for(true)
                .is_err(),
            "even with renewal one publish must fit in the lease with the margin"
        );
        assert_eq!(
            RelayConfig::default()
                .with_batch_size(101)
                .with_publish_batch_size(25)
                .with_publish_concurrency(2)
                .publish_waves(),
            3
        );
    }

    #[cfg(feature = "serde")]
    #[test]
    fn configs_round_trip_and_default_missing_fields() {
        let c = RelayConfig::default()
            .with_name("orders")
            .with_batch_size(7);
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<RelayConfig>(&text).unwrap(), c);
        let partial: RelayConfig = serde_json::from_str(r#"{"batch_size": 9}"#).unwrap();
        assert_eq!(partial, RelayConfig::default().with_batch_size(9));
        let retry: RetryPolicy = serde_json::from_str(r#"{"max_attempts": 4}"#).unwrap();
        assert_eq!(retry, RetryPolicy::new(4));
    }

    #[test]
    fn rejects_bad_values() {
        let bad = [
            RelayConfig::default().with_batch_size(0),
            RelayConfig::default().with_batch_size(crate::store::MAX_CLAIM_BATCH + 1),
            RelayConfig::default()
                .with_publish_batch_size(0)
                .with_publish_concurrency(1),
            RelayConfig::default()
                .with_publish_batch_size(1)
                .with_publish_concurrency(0),
            RelayConfig::default().with_pipeline_depth(0),
            RelayConfig::default().with_pipeline_depth(MAX_PIPELINE_DEPTH + 1),
            RelayConfig::default().with_publish_timeout(Duration::ZERO),
            RelayConfig::default().with_publish_timeout(Duration::from_secs(60)),
            RelayConfig::default()
                .with_poll_interval(Duration::ZERO)
                .with_max_poll_interval(Duration::from_secs(1)),
            RelayConfig::default()
                .with_poll_interval(Duration::from_secs(2))
                .with_max_poll_interval(Duration::from_secs(1)),
            RelayConfig::default().with_lease(MIN_LEASE - Duration::from_nanos(1)),
            RelayConfig::default().with_lease(Duration::from_nanos(500)),
            RelayConfig::default().with_lease(MAX_LEASE + Duration::from_secs(1)),
            RelayConfig::default().with_retry(RetryPolicy::new(0)),
        ];
        for c in bad {
            assert_eq!(kind(&c), Some(crate::ErrorKind::Config), "{c:?}");
        }
        RelayConfig::default()
            .with_poll_interval(Duration::from_secs(1))
            .with_max_poll_interval(Duration::from_secs(1))
            .validate()
            .unwrap();
        RelayConfig::default()
            .with_pipeline_depth(1)
            .validate()
            .unwrap();
        RelayConfig::default()
            .with_pipeline_depth(MAX_PIPELINE_DEPTH)
            .validate()
            .unwrap();
        RelayConfig::default()
            .with_batch_size(crate::store::MAX_CLAIM_BATCH)
            .with_publish_batch_size(crate::store::MAX_CLAIM_BATCH)
            .with_publish_concurrency(1)
            .validate()
            .unwrap();
    }
}
