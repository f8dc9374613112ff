//! Leases: what a claim hands out and every settle is fenced by.

use std::fmt;
use std::time::SystemTime;

use uuid::Uuid;

#[cfg(doc)]
use super::OutboxStore;
use crate::message::MessageId;

/// An opaque fencing token, fresh for every claim.
///
/// Complete, fail and release match on message id **and** token, so a relay whose lease
/// expired and whose message was claimed again cannot touch the new owner's claim.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseToken(Uuid);

impl LeaseToken {
    /// A fresh random token.
    pub fn new() -> Self {
        LeaseToken(Uuid::new_v4())
    }
    /// Wrap a token read from storage.
    pub fn from_uuid(uuid: Uuid) -> Self {
        LeaseToken(uuid)
    }
    /// The underlying UUID, for storage.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl Default for LeaseToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({})", self.0)
    }
}

/// A claim's hold on one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The message held.
    pub id: MessageId,
    /// The fencing token that must accompany complete, fail and release.
    pub token: LeaseToken,
    /// When the lease lapses by the storage's clock; after it, the message is claimable
    /// again.
    pub expires_at: SystemTime,
}

/// What [`OutboxStore::renew`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use = "lost leases mean another claimer owns those messages"]
pub struct Renewed {
    /// The leases extended, with their new expiry (same ids and tokens).
    pub leases: Vec<Lease>,
    /// Messages whose leases were no longer held: nothing was changed for them.
    pub lost: Vec<MessageId>,
}

impl Renewed {
    /// What a renewal of `leases` did, from the ids it extended (`renewed`) with their
    /// new expiry: those leases with that expiry, the others lost, in `leases`' order.
    pub fn reconcile(
        leases: &[Lease],
        renewed: impl IntoIterator<Item = (MessageId, SystemTime)>,
    ) -> Self {
        let expiry: std::collections::HashMap<MessageId, SystemTime> =
            renewed.into_iter().collect();
        let mut out = Renewed::default();
        for l in leases {
            match expiry.get(&l.id) {
                Some(at) => out.leases.push(Lease {
                    expires_at: *at,
                    ..*l
                }),
                None => out.lost.push(l.id),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn renewed_reconcile_keeps_order_and_new_expiry() {
        let old = SystemTime::UNIX_EPOCH;
        let later = old + Duration::from_secs(60);
        let leases: Vec<Lease> = (0..3)
            .map(|_| Lease {
                id: MessageId::new(),
                token: LeaseToken::new(),
                expires_at: old,
            })
            .collect();
        let r = Renewed::reconcile(&leases, [(leases[2].id, later), (leases[0].id, later)]);
        let held: Vec<_> = r
            .leases
            .iter()
            .map(|l| (l.id, l.token, l.expires_at))
            .collect();
        let expect = |l: &Lease| (l.id, l.token, later);
        assert_eq!(held, [expect(&leases[0]), expect(&leases[2])]);
        assert_eq!(r.lost, [leases[1].id]);
    }
}
