//! What a relay counts: [`DispatchReport`], the relay-wide [`Tally`] behind
//! [`Relay::report`](super::Relay::report) and the metrics, and the per-batch
//! [`Counter`] that feeds it.

use std::sync::{Mutex, PoisonError};

use super::metrics;

/// Counts of what a relay (or one dispatch call) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DispatchReport {
    /// Messages claimed.
    pub claimed: u64,
    /// Messages published and completed.
    pub dispatched: u64,
    /// Failed attempts scheduled for retry.
    pub retried: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
    /// Leases given back unattempted.
    pub released: u64,
    /// Settles rejected because the lease was gone.
    pub leases_lost: u64,
    /// Storage calls that failed for good (a claim, or a settle given up on).
    pub store_errors: u64,
    /// Panics caught (in a claim, a publisher, a batch).
    pub panics: u64,
}

impl DispatchReport {
    pub(super) fn add(&mut self, other: &DispatchReport) {
        self.claimed += other.claimed;
        self.dispatched += other.dispatched;
        self.retried += other.retried;
        self.dead_lettered += other.dead_lettered;
        self.released += other.released;
        self.leases_lost += other.leases_lost;
        self.store_errors += other.store_errors;
        self.panics += other.panics;
    }
}

/// The one place a relay's counts go: the running totals behind
/// [`Relay::report`](super::Relay::report) and the `metrics` counters, fed together.
#[derive(Debug)]
pub(super) struct Tally {
    totals: Mutex<DispatchReport>,
    metrics: metrics::Handles,
}

impl Tally {
    pub(super) fn new(metrics: metrics::Handles) -> Self {
        Tally {
            totals: Mutex::default(),
            metrics,
        }
    }

    /// Count `r` in the totals and the metrics.
    pub(super) fn record(&self, r: &DispatchReport) {
        self.totals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(r);
        self.metrics.add(r);
    }

    /// The totals so far.
    pub(super) fn snapshot(&self) -> DispatchReport {
        *self.totals.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The metric handles, for what is not a count (claim durations).
    pub(super) fn metrics(&self) -> &metrics::Handles {
        &self.metrics
    }
}

/// One batch's counts: each is recorded in the relay's [`Tally`] as it happens and
/// summed here, so the report of a [`Relay::dispatch_ids`](super::Relay::dispatch_ids)
/// call is exactly what it added to the totals.
#[derive(Debug)]
pub(super) struct Counter<'t> {
    tally: &'t Tally,
    sum: Mutex<DispatchReport>,
}

impl<'t> Counter<'t> {
    pub(super) fn new(tally: &'t Tally) -> Self {
        Counter {
            tally,
            sum: Mutex::default(),
        }
    }

    /// Count `r` in the relay's totals and in this batch's sum.
    pub(super) fn record(&self, r: &DispatchReport) {
        if *r == DispatchReport::default() {
            return;
        }
        self.tally.record(r);
        self.sum
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(r);
    }

    /// What this batch counted.
    pub(super) fn sum(&self) -> DispatchReport {
        *self.sum.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(dispatched: u64, panics: u64) -> DispatchReport {
        DispatchReport {
            dispatched,
            panics,
            ..DispatchReport::default()
        }
    }

    #[test]
    fn a_counter_feeds_the_tally_and_sums_only_its_own_counts() {
        let tally = Tally::new(metrics::Handles::new("report-test"));
        tally.record(&report(5, 0));
        let counter = Counter::new(&tally);
        counter.record(&report(2, 0));
        counter.record(&report(0, 1));
        counter.record(&DispatchReport::default());
        assert_eq!(counter.sum(), report(2, 1));
        assert_eq!(tally.snapshot(), report(7, 1));
    }

    #[test]
    fn add_sums_every_field() {
        let one = DispatchReport {
            claimed: 1,
            dispatched: 2,
            retried: 3,
            dead_lettered: 4,
            released: 5,
            leases_lost: 6,
            store_errors: 7,
            panics: 8,
        };
        let mut sum = one;
        sum.add(&one);
        assert_eq!(
            sum,
            DispatchReport {
                claimed: 2,
                dispatched: 4,
                retried: 6,
                dead_lettered: 8,
                released: 10,
                leases_lost: 12,
                store_errors: 14,
                panics: 16,
            }
        );
    }
}
