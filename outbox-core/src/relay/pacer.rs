//! When the loop claims: [`Pacer`].

use std::time::Duration;

use tokio::time::Instant;

use super::RelayConfig;
use crate::backoff::Backoff;

/// What the loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Claim now.
    Claim,
    /// Wait for a batch to end, or for the timer (`None`: no timer), or for a wake-up
    /// when `wakeups` is set; a timer or a wake-up asks for a claim
    /// ([`Pacer::asked`]).
    Wait {
        until: Option<Instant>,
        wakeups: bool,
    },
}

/// The loop's claim schedule, as a value: every decision of when to claim, and none of
/// the claiming. Times are on Tokio's clock, so tests may pause it.
///
/// - With no batch in flight, or a finished batch's settle to carry, the loop claims
///   at once (the settle goes with the claim).
/// - With batches in flight and a free slot, it claims when asked: by a wake-up, by the
///   poll (on a schedule of its own, see `busy`), or, while claims come back full,
///   once the newest batch has published for as long as its claim took
///   (`claim_ahead_at`). A publish faster than a claim thus ends first and its settle
///   goes with the next claim, as without pipelining; a slower one gets the next batch
///   claimed while it runs.
/// - With every slot taken, it waits for a batch to end.
/// - When a claim made with batches in flight finds nothing, wake-ups wait for a batch
///   to end or the poll, so a burst of them does not claim back to back against rows
///   still held by the batches in flight.
/// - When a claim made with nothing in flight finds nothing, the loop waits for a
///   wake-up or the idle poll, which doubles on every such claim.
#[derive(Debug)]
pub(super) struct Pacer {
    depth: usize,
    batch_size: usize,
    /// The poll while nothing is in flight: doubles on every claim that finds nothing.
    idle: Backoff,
    /// The poll while batches are in flight, on a schedule of its own so that a wait
    /// cut short by a batch ending does not move the idle schedule.
    busy: Backoff,
    /// When the busy poll comes, once a wait has set it; cleared by each claim.
    poll_at: Option<Instant>,
    /// When to claim ahead of the batches in flight, while claims come back full.
    claim_ahead_at: Option<Instant>,
    /// A wake-up, the poll or `claim_ahead_at` asked for a claim.
    asked: bool,
    /// The last claim, made with batches in flight, found nothing.
    found_nothing: bool,
}

impl Pacer {
    pub(super) fn new(config: &RelayConfig) -> Self {
        Pacer {
            depth: config.pipeline_depth.max(1),
            batch_size: config.batch_size,
            idle: Backoff::new(config.poll_interval, config.max_poll_interval),
            busy: Backoff::new(config.poll_interval, config.max_poll_interval),
            poll_at: None,
            claim_ahead_at: None,
            asked: false,
            found_nothing: false,
        }
    }

    /// What to do with `in_flight` batches publishing, `carrying` a settle or not.
    pub(super) fn next(&mut self, now: Instant, in_flight: usize, carrying: bool) -> Next {
        let may_claim = in_flight < self.depth;
        if may_claim && (in_flight == 0 || carrying || self.asked) {
            return Next::Claim;
        }
        let until = if !may_claim {
            None
        } else if self.claim_ahead_at.is_some() {
            self.claim_ahead_at
        } else {
            let busy = &mut self.busy;
            Some(*self.poll_at.get_or_insert_with(|| now + busy.next_delay()))
        };
        Next::Wait {
            until,
            wakeups: may_claim && !self.found_nothing,
        }
    }

    /// A wake-up or the timer of [`Next::Wait`] came: claim when a slot is free.
    pub(super) fn asked(&mut self) {
        self.asked = true;
    }

    /// A batch ended: its slot may take a claim a wake-up asks for.
    pub(super) fn batch_ended(&mut self) {
        self.found_nothing = false;
    }

    /// A claim goes out: what asked for it is answered.
    pub(super) fn claim_sent(&mut self) {
        self.asked = false;
        self.found_nothing = false;
        self.poll_at = None;
    }

    /// The claim sent at `sent` came back at `now` with `count` messages (at least
    /// one): a full batch means more is probably due, so the next claim goes out once
    /// this batch has published for as long as its claim took.
    pub(super) fn found(&mut self, count: usize, sent: Instant, now: Instant) {
        self.claim_ahead_at =
            (count >= self.batch_size).then(|| now + now.saturating_duration_since(sent));
        self.idle.reset();
        self.busy.reset();
    }

    /// The claim took rows but dead-lettered every one: more may be due at once.
    pub(super) fn all_dead_lettered(&mut self) {
        self.asked = true;
    }

    /// The claim found nothing due. `caught_up`: no batch was in flight, so the loop is
    /// idle and waits for [`idle_delay`](Self::idle_delay) or a wake-up.
    pub(super) fn found_nothing(&mut self, caught_up: bool) {
        self.claim_ahead_at = None;
        self.found_nothing = !caught_up;
    }

    /// The claim failed: the loop waits [`idle_delay`](Self::idle_delay) before the
    /// next.
    pub(super) fn failed(&mut self) {
        self.claim_ahead_at = None;
    }

    /// How long to wait when idle or after a failure; doubles on every call.
    pub(super) fn idle_delay(&mut self) -> Duration {
        self.idle.next_delay()
    }

    /// A wake-up ended the idle wait: the idle poll starts over.
    pub(super) fn woken_while_idle(&mut self) {
        self.idle.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLL: Duration = Duration::from_millis(100);
    const MAX_POLL: Duration = Duration::from_millis(800);

    fn pacer(depth: usize) -> Pacer {
        Pacer::new(
            &RelayConfig::default()
                .with_batch_size(10)
                .with_pipeline_depth(depth)
                .with_poll_interval(POLL)
                .with_max_poll_interval(MAX_POLL),
        )
    }

    fn waits_until(next: Next) -> Option<Instant> {
        match next {
            Next::Wait { until, .. } => until,
            Next::Claim => panic!("expected a wait, got a claim"),
        }
    }

    fn hears_wakeups(next: Next) -> bool {
        match next {
            Next::Wait { wakeups, .. } => wakeups,
            Next::Claim => panic!("expected a wait, got a claim"),
        }
    }

    /// A poll delay: `base` less up to the backoff's jitter of a fifth.
    fn within_jitter(delay: Duration, base: Duration) -> bool {
        delay <= base && delay >= base.mul_f64(0.8)
    }

    #[test]
    fn claims_at_once_with_nothing_in_flight_or_a_settle_to_carry() {
        let now = Instant::now();
        let mut p = pacer(2);
        assert_eq!(p.next(now, 0, false), Next::Claim);
        assert_eq!(p.next(now, 1, true), Next::Claim);
        // The same with pipelining off.
        let mut p = pacer(1);
        assert_eq!(p.next(now, 0, false), Next::Claim);
    }

    #[test]
    fn a_full_pipeline_waits_for_a_batch_with_no_timer_and_no_wakeups() {
        let now = Instant::now();
        let mut p = pacer(2);
        p.asked();
        let next = p.next(now, 2, true);
        assert_eq!(
            next,
            Next::Wait {
                until: None,
                wakeups: false
            }
        );
        // Depth 1: one batch in flight fills it, even with a settle to carry.
        let mut p = pacer(1);
        assert_eq!(waits_until(p.next(now, 1, true)), None);
    }

    #[test]
    fn with_a_batch_in_flight_a_wakeup_or_the_poll_asks_for_a_claim() {
        let now = Instant::now();
        let mut p = pacer(2);
        let next = p.next(now, 1, false);
        assert!(hears_wakeups(next));
        let poll = waits_until(next).expect("a poll timer");
        assert!(within_jitter(poll - now, POLL), "{:?}", poll - now);
        // The poll stays put across waits cut short (a batch ended, a stray wake).
        assert_eq!(waits_until(p.next(now + POLL / 2, 1, false)), Some(poll));
        p.asked();
        assert_eq!(p.next(now, 1, false), Next::Claim);
    }

    #[test]
    fn a_claim_answers_the_ask_and_restarts_the_busy_poll() {
        let now = Instant::now();
        let mut p = pacer(2);
        let first = waits_until(p.next(now, 1, false)).unwrap();
        p.asked();
        p.claim_sent();
        let later = now + POLL;
        let next = waits_until(p.next(later, 1, false)).unwrap();
        assert!(next > first, "a new poll time, from when the wait began");
        assert!(next - later >= POLL.mul_f64(0.8), "{:?}", next - later);
    }

    #[test]
    fn the_busy_poll_doubles_until_work_is_found() {
        let now = Instant::now();
        let mut p = pacer(2);
        let mut delays = Vec::new();
        for _ in 0..5 {
            delays.push(waits_until(p.next(now, 1, false)).unwrap() - now);
            p.asked();
            p.claim_sent();
            p.found_nothing(false);
            p.batch_ended();
        }
        for (delay, base) in delays.iter().zip([100, 200, 400, 800, 800]) {
            assert!(
                within_jitter(*delay, Duration::from_millis(base)),
                "{delays:?}"
            );
        }
        p.found(1, now, now);
        let delay = waits_until(p.next(now, 1, false)).unwrap() - now;
        assert!(within_jitter(delay, POLL), "{delay:?}");
    }

    #[test]
    fn a_full_claim_claims_ahead_after_as_long_as_it_took() {
        let sent = Instant::now();
        let back = sent + Duration::from_millis(7);
        let mut p = pacer(2);
        p.claim_sent();
        p.found(10, sent, back);
        assert_eq!(
            waits_until(p.next(back, 1, false)),
            Some(back + Duration::from_millis(7))
        );
        // A partial claim does not: the poll or a wake-up asks next.
        p.claim_sent();
        p.found(9, sent, back);
        let poll = waits_until(p.next(back, 1, false)).unwrap();
        assert!(within_jitter(poll - back, POLL));
    }

    #[test]
    fn finding_nothing_with_batches_in_flight_mutes_wakeups_until_a_batch_ends() {
        let now = Instant::now();
        let mut p = pacer(2);
        p.claim_sent();
        p.found(10, now, now);
        p.claim_sent();
        p.found_nothing(false);
        let next = p.next(now, 1, false);
        assert!(!hears_wakeups(next));
        assert!(waits_until(next).is_some(), "the poll still runs");
        p.batch_ended();
        assert!(hears_wakeups(p.next(now, 1, false)));
    }

    #[test]
    fn finding_nothing_when_caught_up_leaves_wakeups_on_and_no_claim_ahead() {
        let now = Instant::now();
        let mut p = pacer(2);
        p.claim_sent();
        p.found(10, now, now);
        p.claim_sent();
        p.found_nothing(true);
        let next = p.next(now, 1, false);
        assert!(hears_wakeups(next));
        assert_ne!(waits_until(next), Some(now), "no claim ahead");
    }

    #[test]
    fn a_claim_that_dead_lettered_everything_claims_again() {
        let now = Instant::now();
        let mut p = pacer(2);
        p.claim_sent();
        p.all_dead_lettered();
        assert_eq!(p.next(now, 1, false), Next::Claim);
    }

    #[test]
    fn a_failure_drops_the_claim_ahead() {
        let now = Instant::now();
        let mut p = pacer(2);
        p.claim_sent();
        p.found(10, now, now + Duration::from_millis(3));
        p.claim_sent();
        p.failed();
        let poll = waits_until(p.next(now, 1, false)).unwrap();
        assert!(
            within_jitter(poll - now, POLL),
            "the poll, not the claim ahead"
        );
    }

    #[test]
    fn the_idle_delay_doubles_and_starts_over_on_a_wakeup_or_work() {
        let mut p = pacer(2);
        let first = p.idle_delay();
        let second = p.idle_delay();
        assert!(within_jitter(first, POLL) && within_jitter(second, POLL * 2));
        p.woken_while_idle();
        assert!(within_jitter(p.idle_delay(), POLL));
        p.idle_delay();
        p.found(1, Instant::now(), Instant::now());
        assert!(within_jitter(p.idle_delay(), POLL));
    }
}
