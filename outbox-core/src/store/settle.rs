//! What a settle sends and reports: [`Failure`], [`Disposition`], [`Settlement`],
//! [`Settled`], [`SettledAndClaimed`].

use std::time::Duration;

#[cfg(doc)]
use super::OutboxStore;
#[cfg(doc)]
use super::MAX_ERROR_LEN;
use super::{Claimed, Lease};
use crate::bounds::bounded_error;
use crate::error::{Error, Result};
use crate::message::MessageId;

/// What a failed attempt leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Make the message claimable again after this delay.
    Retry {
        /// Delay from now, by the storage's clock.
        after: Duration,
    },
    /// Give up: keep the message as a dead letter, listable and requeueable.
    DeadLetter,
}

/// A failed attempt to report through [`OutboxStore::fail`].
///
/// The error text is bounded once, here, to [`MAX_ERROR_LEN`] bytes, so every backend
/// stores the same text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    lease: Lease,
    error: String,
    disposition: Disposition,
}

impl Failure {
    /// A failed attempt under `lease`, recording `error` (cut to [`MAX_ERROR_LEN`]
    /// bytes on a character boundary) and leading to `disposition`.
    pub fn new(lease: Lease, error: impl Into<String>, disposition: Disposition) -> Self {
        Failure {
            lease,
            error: bounded_error(error.into()),
            disposition,
        }
    }

    /// The lease the attempt held.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The error to record as the message's `last_error`.
    pub fn error(&self) -> &str {
        &self.error
    }

    /// Retry or dead-letter.
    pub fn disposition(&self) -> Disposition {
        self.disposition
    }
}

/// The result of settling (completing, failing, releasing) a batch of leases.
///
/// Settling is fenced per message: leases that are still held are applied, leases that
/// are not are listed in `lost` and their messages are left untouched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use = "lost leases mean another claimer owns those messages"]
pub struct Settled {
    /// How many leases were applied.
    pub applied: usize,
    /// Messages whose leases were no longer held: nothing was changed for them.
    pub lost: Vec<MessageId>,
}

impl Settled {
    /// Work out which of `requested` were not among `applied`.
    pub fn reconcile(
        requested: impl IntoIterator<Item = MessageId>,
        applied: impl IntoIterator<Item = MessageId>,
    ) -> Self {
        let applied: std::collections::HashSet<MessageId> = applied.into_iter().collect();
        let lost: Vec<MessageId> = requested
            .into_iter()
            .filter(|id| !applied.contains(id))
            .collect();
        Settled {
            applied: applied.len(),
            lost,
        }
    }

    /// `Ok(applied)` when every lease was applied, otherwise
    /// [`ErrorKind::LeaseLost`](crate::ErrorKind::LeaseLost) naming the lost messages.
    pub fn into_result(self) -> Result<usize> {
        if self.lost.is_empty() {
            Ok(self.applied)
        } else {
            Err(Error::lease_lost(self.lost))
        }
    }
}

/// The leases to settle in one [`OutboxStore::settle_and_claim`] call: what a relay
/// finished with batch N, settled as by [`complete`](OutboxStore::complete),
/// [`fail`](OutboxStore::fail) and [`release`](OutboxStore::release).
#[derive(Debug, Clone, Copy, Default)]
pub struct Settlement<'a> {
    /// Leases to complete.
    pub complete: &'a [Lease],
    /// Failed attempts to record.
    pub fail: &'a [Failure],
    /// Leases to give back unattempted.
    pub release: &'a [Lease],
}

impl Settlement<'_> {
    /// Whether there is nothing to settle.
    pub fn is_empty(&self) -> bool {
        self.complete.is_empty() && self.fail.is_empty() && self.release.is_empty()
    }

    /// Every message this settlement names.
    pub fn ids(&self) -> impl Iterator<Item = MessageId> + '_ {
        self.complete
            .iter()
            .map(|l| l.id)
            .chain(self.fail.iter().map(|f| f.lease().id))
            .chain(self.release.iter().map(|l| l.id))
    }
}

/// What [`OutboxStore::settle_and_claim`] did: each part of the settlement, fenced as
/// by its own method, and the claim that followed.
#[derive(Debug)]
#[must_use = "lost leases mean another claimer owns those messages; claimed messages must be published"]
pub struct SettledAndClaimed {
    /// The completes.
    pub completed: Settled,
    /// The failures.
    pub failed: Settled,
    /// The releases.
    pub released: Settled,
    /// The claim, made after the settles applied. An error here means the settles did
    /// apply (as the fields above say) and only the claim failed.
    pub claimed: Result<Claimed>,
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::bounds::MAX_ERROR_LEN;
    use crate::store::LeaseToken;
    use crate::ErrorKind;

    #[test]
    fn failure_error_text_is_bounded_once() {
        let lease = Lease {
            id: MessageId::new(),
            token: LeaseToken::new(),
            expires_at: SystemTime::now(),
        };
        let long = "é".repeat(MAX_ERROR_LEN);
        let f = Failure::new(lease, long, Disposition::DeadLetter);
        assert!(f.error().len() <= MAX_ERROR_LEN && f.error().len() > MAX_ERROR_LEN - 2);
        assert!(f.error().chars().all(|c| c == 'é'));
        let exact = "x".repeat(MAX_ERROR_LEN);
        assert_eq!(
            Failure::new(lease, exact.clone(), Disposition::DeadLetter).error(),
            exact
        );
        assert_eq!(
            Failure::new(lease, "short", Disposition::DeadLetter).error(),
            "short"
        );
        assert_eq!(f.lease(), &lease);
        assert_eq!(f.disposition(), Disposition::DeadLetter);
    }

    #[test]
    fn reconcile_lists_lost() {
        let (a, b, c) = (MessageId::new(), MessageId::new(), MessageId::new());
        let s = Settled::reconcile([a, b, c], [b]);
        assert_eq!(s.applied, 1);
        assert_eq!(s.lost, vec![a, c]);
        let err = s.into_result().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LeaseLost);
        assert_eq!(err.ids(), &[a, c]);
        assert_eq!(Settled::reconcile([a], [a]).into_result().unwrap(), 1);
    }
}
