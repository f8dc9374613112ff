//! The settles a loop carries to its next claim: [`Deferred`] and [`Settler`].

use std::time::Instant;

use tracing::Instrument;

use super::batch::{count_settled, settle_outcomes, SettleOutcome};
use super::{DispatchReport, Inner};
use crate::error::Result;
use crate::store::{ClaimRequest, Claimed, Failure, Lease, Settlement};

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
    let outcome = inner
        .store
        .settle_and_claim(settlement, request)
        .instrument(tracing::debug_span!(
            "outbox.claim",
            limit = request.limit()
        ))
        .await;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::message::MessageId;
    use crate::store::{Disposition, LeaseToken};

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
