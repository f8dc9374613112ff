//! Everything about a settle: one call retried until the leases lapse ([`settle`]),
//! a batch's completes and failures together ([`settle_outcomes`]) and what they
//! count ([`count_settled`]), and the settles a loop carries to its next claim
//! ([`Deferred`], [`Settler`], [`settle_and_claim`]).
//!
//! Deadlines are on Tokio's clock, as is everything in the relay, so a test on a
//! paused clock controls both pacing and lease deadlines.

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::{DispatchReport, Inner};
use crate::backoff::Backoff;
use crate::error::Result;
use crate::message::MessageId;
use crate::store::{ClaimRequest, Claimed, Disposition, Failure, Lease, Settled, Settlement};

/// The settle of a batch's last publish call, left for the loop to send together with
/// the next claim ([`OutboxStore::settle_and_claim`](crate::OutboxStore::settle_and_claim)).
#[derive(Debug)]
pub(super) struct Deferred {
    /// Leases to complete.
    pub(super) done: Vec<Lease>,
    /// Failed attempts to record.
    pub(super) failures: Vec<Failure>,
    /// When the leases lapse by the relay's clock: settle retries stop there.
    pub(super) deadline: Instant,
}

impl Deferred {
    /// The number of leases it settles.
    fn len(&self) -> usize {
        self.done.len() + self.failures.len()
    }

    /// Settle on its own (when the relay stops, or after a combined call failed),
    /// retrying retryable errors until the deadline; counts what it did.
    pub(super) async fn settle_alone(self, inner: &Inner) {
        let report = settle_outcomes(inner, &self.done, &self.failures, self.deadline).await;
        inner.tally.record(&report);
    }
}

/// The deferred settles of the loop's finished batches, held as values until the next
/// claim takes them all in one store call.
#[derive(Debug, Default)]
pub(super) struct Settler {
    carried: Vec<Deferred>,
}

impl Settler {
    /// Hold what a finished batch left (a batch that settled everything itself, or
    /// panicked, leaves nothing).
    pub(super) fn hold(&mut self, deferred: Option<Deferred>) {
        self.carried.extend(deferred);
    }

    /// Whether a settle waits for the next claim.
    pub(super) fn is_carrying(&self) -> bool {
        !self.carried.is_empty()
    }

    /// Every held settle as one, for one store call; `None` when none is held. Retries
    /// of the merged settle stop at the latest deadline: leases that lapsed earlier are
    /// fenced out by the store anyway, and stopping at the earliest would give up on
    /// leases still held.
    pub(super) fn take(&mut self) -> Option<Deferred> {
        let mut all = std::mem::take(&mut self.carried).into_iter();
        let mut merged = all.next()?;
        for other in all {
            merged.done.extend(other.done);
            merged.failures.extend(other.failures);
            merged.deadline = merged.deadline.max(other.deadline);
        }
        Some(merged)
    }
}

/// Settle `deferred` and claim the next batch in one store call
/// ([`OutboxStore::settle_and_claim`](crate::OutboxStore::settle_and_claim)). When that
/// call fails the settle is retried on its own, as any settle is, and `Ok(None)` tells
/// the caller to claim as usual.
///
/// # Errors
/// The claim's error, after the settle applied.
pub(super) async fn settle_and_claim(
    inner: &Inner,
    deferred: Deferred,
    request: ClaimRequest,
) -> Result<Option<Claimed>> {
    let settlement = Settlement {
        complete: &deferred.done,
        fail: &deferred.failures,
        release: &[],
    };
    let outcome = inner.store.settle_and_claim(settlement, request).await;
    match outcome {
        Ok(done) => {
            inner.tally.record(&count_settled(
                Ok(SettleOutcome::first_try(done.completed)),
                Ok(SettleOutcome::first_try(done.failed)),
                &deferred.failures,
            ));
            done.claimed.map(Some)
        }
        Err(err) if err.is_retryable() => {
            tracing::warn!(
                count = deferred.len(),
                error = %err.report(),
                "settle and claim failed; retrying the settle on its own"
            );
            // The first try may have applied: leases now reported lost may be ones it
            // settled, so none are counted lost.
            let mut report =
                settle_outcomes(inner, &deferred.done, &deferred.failures, deferred.deadline).await;
            report.leases_lost = 0;
            inner.tally.record(&report);
            Ok(None)
        }
        Err(err) => {
            tracing::error!(
                count = deferred.len(),
                error = %err.report(),
                "settle and claim failed; leases will lapse and the messages publish again"
            );
            inner.tally.record(&DispatchReport {
                store_errors: 1,
                ..DispatchReport::default()
            });
            Ok(None)
        }
    }
}

/// Run a settle call of `count` leases, retrying retryable storage errors with
/// backoff until `deadline`, while the leases may still be held: a settle that never lands
/// means the messages publish again after the lease lapses, and once it has lapsed
/// the store fences the settle out anyway. `Err(())` when it gave up (logged).
pub(super) async fn settle<F, Fut>(
    deadline: Instant,
    what: &'static str,
    count: usize,
    call: F,
) -> std::result::Result<SettleOutcome, ()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Settled>>,
{
    if count == 0 {
        return Ok(SettleOutcome::default());
    }
    let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    let mut retried = false;
    loop {
        match call().await {
            Ok(settled) => {
                if retried && !settled.lost.is_empty() {
                    tracing::info!(
                        count = settled.lost.len(),
                        "{what} retried after an error; an earlier try may have applied \
                         the leases now reported lost"
                    );
                }
                return Ok(SettleOutcome { settled, retried });
            }
            Err(err) if err.is_retryable() => {
                let pause = backoff.next_delay();
                if Instant::now() + pause >= deadline {
                    tracing::error!(
                        count, error = %err.report(),
                        "{what} failed until the leases lapsed; the messages publish again"
                    );
                    return Err(());
                }
                tracing::warn!(count, error = %err.report(), retry_in = ?pause, "{what} failed; retrying");
                tokio::time::sleep(pause).await;
                retried = true;
            }
            Err(err) => {
                tracing::error!(
                    count, error = %err.report(),
                    "{what} failed; leases will lapse and the messages publish again"
                );
                return Err(());
            }
        }
    }
}

/// Complete what was published and fail the rest, both at once, retrying retryable
/// errors until `deadline`.
pub(super) async fn settle_outcomes(
    inner: &Inner,
    done: &[Lease],
    failures: &[Failure],
    deadline: Instant,
) -> DispatchReport {
    let store = &inner.store;
    let (completed, failed) = futures::join!(
        settle(deadline, "complete", done.len(), || store.complete(done)),
        settle(deadline, "fail", failures.len(), || store.fail(failures)),
    );
    count_settled(completed, failed, failures)
}

/// The counts of a complete and a fail call (either given up on: `Err(())`).
fn count_settled(
    completed: std::result::Result<SettleOutcome, ()>,
    failed: std::result::Result<SettleOutcome, ()>,
    failures: &[Failure],
) -> DispatchReport {
    let mut report = DispatchReport::default();
    match completed {
        Ok(c) => {
            report.dispatched = c.settled.applied as u64;
            report.leases_lost += c.unambiguous_lost();
        }
        Err(()) => report.store_errors += 1,
    }
    match failed {
        Ok(f) => {
            let lost: HashSet<MessageId> = f.settled.lost.iter().copied().collect();
            for failure in failures.iter().filter(|f| !lost.contains(&f.lease().id)) {
                match failure.disposition() {
                    Disposition::Retry { .. } => report.retried += 1,
                    Disposition::DeadLetter => {
                        tracing::warn!(id = %failure.lease().id, error = failure.error(), "message dead-lettered");
                        report.dead_lettered += 1;
                    }
                }
            }
            report.leases_lost += f.unambiguous_lost();
        }
        Err(()) => report.store_errors += 1,
    }
    report
}

/// The result of one settle call.
#[derive(Default)]
pub(super) struct SettleOutcome {
    pub(super) settled: Settled,
    /// The call was retried after an error: an earlier try may have committed, so ids
    /// reported lost may in fact have been settled by this relay.
    retried: bool,
}

impl SettleOutcome {
    /// A call that landed at its first try.
    fn first_try(settled: Settled) -> Self {
        SettleOutcome {
            settled,
            retried: false,
        }
    }

    /// Lost leases to count: none when the call was retried, since an earlier try may
    /// have applied them.
    fn unambiguous_lost(&self) -> u64 {
        if self.retried {
            0
        } else {
            self.settled.lost.len() as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::error::{Error, ErrorKind, ErrorStatus};
    use crate::message::MessageId;
    use crate::store::{Disposition, LeaseToken};

    fn refused(status: ErrorStatus) -> Error {
        Error::new(ErrorKind::Unavailable, "storage refused").with_status(status)
    }

    /// A settle whose every try fails retryably stops before the pause to its next
    /// try would cross the lease deadline, not after: its last try is while the
    /// leases are held, and no try is sent once they have lapsed.
    #[tokio::test(start_paused = true)]
    async fn a_settle_failing_until_the_lease_lapses_gives_up_before_the_deadline() {
        let start = Instant::now();
        let deadline = start + Duration::from_millis(500);
        let tries = AtomicUsize::new(0);
        let last_try = std::sync::Mutex::new(start);
        let outcome = tokio::time::timeout(
            Duration::from_secs(60),
            settle(deadline, "complete", 3, || {
                tries.fetch_add(1, Ordering::SeqCst);
                *last_try.lock().unwrap() = Instant::now();
                async { Err::<Settled, _>(refused(ErrorStatus::Temporary)) }
            }),
        )
        .await
        .expect("a settle that keeps failing gives up by itself");
        assert!(outcome.is_err(), "given up on");
        let gave_up = Instant::now();
        assert!(gave_up < deadline, "gave up at {:?}", gave_up - start);
        assert!(*last_try.lock().unwrap() < deadline);
        // 20 ms doubling (less up to a fifth of jitter): several tries fit in 500 ms.
        assert!(tries.load(Ordering::SeqCst) >= 4, "{tries:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_permanent_error_is_not_retried_and_nothing_is_a_noop() {
        let deadline = Instant::now() + Duration::from_secs(30);
        let tries = AtomicUsize::new(0);
        let outcome = settle(deadline, "fail", 2, || {
            tries.fetch_add(1, Ordering::SeqCst);
            async { Err::<Settled, _>(refused(ErrorStatus::Permanent)) }
        })
        .await;
        assert!(outcome.is_err());
        assert_eq!(tries.load(Ordering::SeqCst), 1);
        let none = settle(deadline, "fail", 0, || async {
            panic!("a settle of no leases calls nothing")
        })
        .await;
        assert_eq!(none.expect("nothing to settle").settled, Settled::default());
    }

    /// Lost leases count only when the call landed at its first try: after a retry, an
    /// earlier try may have applied them.
    #[tokio::test(start_paused = true)]
    async fn lost_leases_count_only_without_a_retry() {
        let deadline = Instant::now() + Duration::from_secs(30);
        let lost = vec![MessageId::new()];
        let tries = AtomicUsize::new(0);
        let retried = settle(deadline, "complete", 2, || {
            let first = tries.fetch_add(1, Ordering::SeqCst) == 0;
            let lost = lost.clone();
            async move {
                if first {
                    Err(refused(ErrorStatus::Temporary))
                } else {
                    Ok(Settled { applied: 1, lost })
                }
            }
        })
        .await
        .expect("landed on the second try");
        assert!(retried.retried);
        assert_eq!(retried.unambiguous_lost(), 0);
        let first = SettleOutcome::first_try(Settled {
            applied: 1,
            lost: lost.clone(),
        });
        assert_eq!(first.unambiguous_lost(), 1);
        let failures = [
            Failure::new(
                lease(),
                "again",
                Disposition::Retry {
                    after: Duration::ZERO,
                },
            ),
            Failure::new(lease(), "never", Disposition::DeadLetter),
        ];
        let report = count_settled(
            Ok(first),
            Ok(SettleOutcome::first_try(Settled {
                applied: 1,
                lost: vec![failures[0].lease().id],
            })),
            &failures,
        );
        assert_eq!(
            report,
            DispatchReport {
                dispatched: 1,
                dead_lettered: 1,
                leases_lost: 2,
                ..DispatchReport::default()
            }
        );
        let given_up = count_settled(Err(()), Err(()), &failures);
        assert_eq!(given_up.store_errors, 2);
    }

    fn lease() -> Lease {
        Lease {
            id: MessageId::new(),
            token: LeaseToken::new(),
            expires_at: std::time::SystemTime::now(),
        }
    }

    fn deferred(done: usize, failed: usize, deadline: Instant) -> Deferred {
        Deferred {
            done: (0..done).map(|_| lease()).collect(),
            failures: (0..failed)
                .map(|_| Failure::new(lease(), "no", Disposition::DeadLetter))
                .collect(),
            deadline,
        }
    }

    #[test]
    fn holds_nothing_until_a_batch_leaves_a_settle() {
        let mut settler = Settler::default();
        assert!(!settler.is_carrying());
        settler.hold(None);
        assert!(!settler.is_carrying());
        assert!(settler.take().is_none());
        settler.hold(Some(deferred(1, 0, Instant::now())));
        assert!(settler.is_carrying());
    }

    #[test]
    fn take_merges_every_held_settle_once_with_the_latest_deadline() {
        let now = Instant::now();
        let later = now + Duration::from_secs(5);
        let mut settler = Settler::default();
        let first = deferred(2, 1, later);
        let second = deferred(3, 2, now);
        let ids: Vec<MessageId> = first
            .done
            .iter()
            .chain(&second.done)
            .map(|l| l.id)
            .collect();
        settler.hold(Some(first));
        settler.hold(Some(second));
        let merged = settler.take().expect("a merged settle");
        assert_eq!(merged.done.len(), 5);
        assert_eq!(merged.failures.len(), 3);
        assert_eq!(merged.len(), 8);
        assert_eq!(merged.deadline, later);
        let mut got: Vec<MessageId> = merged.done.iter().map(|l| l.id).collect();
        let mut want = ids;
        got.sort();
        want.sort();
        assert_eq!(got, want);
        assert!(!settler.is_carrying(), "taken once");
        assert!(settler.take().is_none());
    }
}
