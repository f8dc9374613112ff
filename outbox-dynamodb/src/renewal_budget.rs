//! The write budget of the body sweep: a token bucket in write units per second,
//! paid after the fact (a renewal's cost is what DynamoDB reports it consumed, known
//! only once it is written).
//!
//! A renewal waits until the balance is not negative, writes, and is charged what it
//! consumed; the balance refills at the budget's rate up to one second's worth. So the
//! sweep spends the budget on average, and at most one second's worth plus the
//! renewals in flight at once in a burst. Without a budget, a sweep that finds many
//! long-waiting bodies (a backlog after a long broker outage) rewrites them as fast as
//! DynamoDB takes them, billed at their size, and the throttling that follows lands on
//! the callers' enqueues.

use std::sync::Mutex;

use tokio::time::{Duration, Instant};

/// A token bucket of write units (see the module docs).
#[derive(Debug)]
pub(crate) struct RenewalBudget {
    /// Units per second; also the most the balance holds.
    rate: f64,
    /// The balance (units, negative after a renewal that cost more than was left) and
    /// when it was last brought up to date.
    state: Mutex<(f64, Instant)>,
}

impl RenewalBudget {
    /// A full bucket of `rate` units per second (`rate` > 0).
    pub(crate) fn new(rate: u32) -> Self {
        let rate = f64::from(rate.max(1));
        RenewalBudget {
            rate,
            state: Mutex::new((rate, Instant::now())),
        }
    }

    /// The balance now, after refilling it for the time since it was last brought up
    /// to date.
    fn balance(&self, state: &mut (f64, Instant)) -> f64 {
        let now = Instant::now();
        let refill = now.saturating_duration_since(state.1).as_secs_f64() * self.rate;
        state.0 = (state.0 + refill).min(self.rate);
        state.1 = now;
        state.0
    }

    /// Wait until the balance is not negative. Whether it had to wait.
    pub(crate) async fn ready(&self) -> bool {
        let mut waited = false;
        loop {
            let short = {
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                -self.balance(&mut state)
            };
            // Within a millionth of a unit is paid: rounding never makes it spin.
            if short <= 1e-6 {
                return waited;
            }
            waited = true;
            let wait = Duration::from_secs_f64(short / self.rate);
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
        }
    }

    /// Charge `units` that a renewal consumed.
    pub(crate) fn charge(&self, units: f64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.balance(&mut state);
        state.0 -= units.max(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `elapsed` is `expected`, give or take the timer's millisecond.
    fn about(elapsed: Duration, expected: Duration) {
        let slack = Duration::from_millis(2);
        assert!(
            elapsed + slack >= expected && elapsed <= expected + slack,
            "{elapsed:?} is not about {expected:?}"
        );
    }

    /// Virtual time: the waits below are computed, not slept.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_waits_until_what_the_last_overspent_is_refilled() {
        let budget = RenewalBudget::new(10);
        let start = Instant::now();
        assert!(!budget.ready().await, "a full bucket does not wait");
        budget.charge(25.0);
        // 10 - 25 = -15 units: 1.5 s at 10 units per second.
        assert!(budget.ready().await);
        about(start.elapsed(), Duration::from_millis(1500));
        assert!(!budget.ready().await, "paid off");
    }

    #[tokio::test(start_paused = true)]
    async fn the_balance_refills_at_the_rate_up_to_one_seconds_worth() {
        let budget = RenewalBudget::new(10);
        tokio::time::advance(Duration::from_secs(60)).await;
        // A minute idle still leaves one second's worth, not sixty.
        budget.charge(20.0);
        let start = Instant::now();
        assert!(budget.ready().await);
        about(start.elapsed(), Duration::from_secs(1));
        budget.charge(5.0);
        tokio::time::advance(Duration::from_millis(200)).await;
        // -5 + 2 = -3: 0.3 s more.
        let start = Instant::now();
        assert!(budget.ready().await);
        about(start.elapsed(), Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn a_charge_within_the_balance_needs_no_wait() {
        let budget = RenewalBudget::new(10);
        budget.charge(10.0);
        assert!(!budget.ready().await, "a balance of exactly zero is ready");
        budget.charge(-4.0);
        assert!(!budget.ready().await, "a negative charge adds nothing");
        budget.charge(0.5);
        assert!(budget.ready().await);
    }
}
