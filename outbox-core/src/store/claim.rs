//! What a claim asks for and returns: [`ClaimRequest`], [`ClaimIds`], [`Claimed`].

use std::time::Duration;

use super::Lease;
#[cfg(doc)]
use super::{OutboxStore, MAX_LEASE, MIN_LEASE};
use crate::bounds::{in_id_order, validate_lease, MAX_CLAIM_BATCH};
use crate::error::{Error, Result};
use crate::message::{Message, MessageId};

/// A message returned by a claim, with the lease that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedMessage {
    /// The message.
    pub message: Message,
    /// The lease to settle it with.
    pub lease: Lease,
}

/// What one claim took: the messages to publish, and the rows it dead-lettered instead.
///
/// A claim that meets a row which cannot make a valid message dead-letters it on the
/// spot (see [`OutboxStore`]'s contract, "No row stops a claim"); those rows are listed
/// in [`dead_lettered`](Self::dead_lettered) so a relay counts them with its own dead
/// letters. Derefs to the claimed messages, so `claimed.len()`, `claimed.iter()` and
/// `for c in &claimed` read the messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use = "claimed messages must be published and settled"]
pub struct Claimed {
    /// The messages claimed, each with its lease: oldest availability first, then
    /// enqueue order.
    pub messages: Vec<ClaimedMessage>,
    /// How many rows the claim dead-lettered instead of returning, each with a
    /// `last_error` saying why (counting only dead-lettering that was written; a row's
    /// id may be what does not decode, so the store logs what it can of them).
    pub dead_lettered: usize,
}

impl Claimed {
    /// A claim of these messages that dead-lettered nothing.
    pub fn new(messages: Vec<ClaimedMessage>) -> Self {
        Claimed {
            messages,
            dead_lettered: 0,
        }
    }

    /// The same claim, having dead-lettered `count` rows.
    pub fn with_dead_lettered(mut self, count: usize) -> Self {
        self.dead_lettered = count;
        self
    }

    /// The claimed messages, without the dead-letter count.
    pub fn into_messages(self) -> Vec<ClaimedMessage> {
        self.messages
    }
}

impl std::ops::Deref for Claimed {
    type Target = [ClaimedMessage];

    fn deref(&self) -> &[ClaimedMessage] {
        &self.messages
    }
}

impl From<Vec<ClaimedMessage>> for Claimed {
    fn from(messages: Vec<ClaimedMessage>) -> Self {
        Claimed::new(messages)
    }
}

impl IntoIterator for Claimed {
    type Item = ClaimedMessage;
    type IntoIter = std::vec::IntoIter<ClaimedMessage>;

    fn into_iter(self) -> Self::IntoIter {
        self.messages.into_iter()
    }
}

impl<'a> IntoIterator for &'a Claimed {
    type Item = &'a ClaimedMessage;
    type IntoIter = std::slice::Iter<'a, ClaimedMessage>;

    fn into_iter(self) -> Self::IntoIter {
        self.messages.iter()
    }
}

/// A validated claim of due messages: at most [`limit`](Self::limit) of them, each
/// leased for [`lease`](Self::lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimRequest {
    limit: usize,
    lease: Duration,
}

impl ClaimRequest {
    /// Claim up to `limit` (1 to [`MAX_CLAIM_BATCH`]) messages, each leased for `lease`
    /// ([`MIN_LEASE`] to [`MAX_LEASE`]).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when out of bounds.
    pub fn new(limit: usize, lease: Duration) -> Result<Self> {
        if limit == 0 || limit > MAX_CLAIM_BATCH {
            return Err(Error::invalid_input(format!(
                "claim limit {limit} is outside 1..={MAX_CLAIM_BATCH}"
            )));
        }
        validate_lease(lease)?;
        Ok(ClaimRequest { limit, lease })
    }

    /// The most messages to claim.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// How long each lease lasts.
    pub fn lease(&self) -> Duration {
        self.lease
    }
}

/// A validated claim of specific messages, for dispatch right after commit: the ids in
/// ascending order without repeats (0 to [`MAX_CLAIM_BATCH`] of them), and the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimIds {
    ids: Vec<MessageId>,
    lease: Duration,
}

impl ClaimIds {
    /// Claim these ids, each leased for `lease` ([`MIN_LEASE`] to [`MAX_LEASE`]).
    /// Repeated ids count once.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for more than
    /// [`MAX_CLAIM_BATCH`] distinct ids or a lease out of bounds.
    pub fn new(ids: &[MessageId], lease: Duration) -> Result<Self> {
        validate_lease(lease)?;
        let ids = in_id_order(ids, |id| *id).into_iter().copied();
        let mut ids: Vec<MessageId> = ids.collect();
        ids.dedup();
        if ids.len() > MAX_CLAIM_BATCH {
            return Err(Error::invalid_input(format!(
                "{} ids exceed the claim limit of {MAX_CLAIM_BATCH}",
                ids.len()
            )));
        }
        Ok(ClaimIds { ids, lease })
    }

    /// The ids, ascending, without repeats.
    pub fn ids(&self) -> &[MessageId] {
        &self.ids
    }

    /// How long each lease lasts.
    pub fn lease(&self) -> Duration {
        self.lease
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounds::{MAX_LEASE, MIN_LEASE};
    use crate::ErrorKind;

    #[test]
    fn claim_request_bounds() {
        let ok = ClaimRequest::new(10, Duration::from_secs(30)).unwrap();
        assert_eq!((ok.limit(), ok.lease()), (10, Duration::from_secs(30)));
        ClaimRequest::new(1, MIN_LEASE).unwrap();
        ClaimRequest::new(MAX_CLAIM_BATCH, MAX_LEASE).unwrap();
        for (limit, lease) in [
            (0, Duration::from_secs(1)),
            (MAX_CLAIM_BATCH + 1, Duration::from_secs(1)),
            (1, Duration::ZERO),
            (1, MIN_LEASE - Duration::from_nanos(1)),
            (1, MAX_LEASE + Duration::from_nanos(1)),
        ] {
            let err = ClaimRequest::new(limit, lease).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{limit} {lease:?}");
        }
    }

    #[test]
    fn claim_ids_are_sorted_deduplicated_and_bounded() {
        let (a, b) = (MessageId::new(), MessageId::new());
        let claim = ClaimIds::new(&[b, a, b, a], Duration::from_secs(1)).unwrap();
        assert_eq!(claim.ids(), &[a, b]);
        assert!(ClaimIds::new(&[], Duration::from_secs(1))
            .unwrap()
            .ids()
            .is_empty());
        let many: Vec<MessageId> = (0..=MAX_CLAIM_BATCH).map(|_| MessageId::new()).collect();
        assert_eq!(
            ClaimIds::new(&many, Duration::from_secs(1))
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidInput
        );
        ClaimIds::new(&many[..MAX_CLAIM_BATCH], Duration::from_secs(1)).unwrap();
        let repeated = vec![a; MAX_CLAIM_BATCH + 5];
        assert_eq!(ClaimIds::new(&repeated, MIN_LEASE).unwrap().ids(), &[a]);
        assert!(ClaimIds::new(&[a], Duration::ZERO).is_err());
    }
}
