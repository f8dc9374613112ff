//! What an operator needs of a store: [`OutboxAdmin`] (stats, dead letters, purges).

use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::message::{Message, MessageId};

/// Most rows one listing, requeue, discard or purge call may touch.
pub const MAX_ADMIN_BATCH: usize = 10_000;

/// Counts for monitoring, exact at the moment they were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Messages waiting to be claimed, due now or scheduled later (including retries).
    pub pending: u64,
    /// Messages held by a live lease.
    pub in_flight: u64,
    /// Dead-lettered messages.
    pub dead: u64,
    /// Dispatched messages still kept under
    /// [`Retention::Keep`](crate::Retention::Keep).
    pub dispatched: u64,
    /// Age of the oldest undelivered (pending or in-flight) message, by `created_at`.
    /// Messages enqueued with a delay or waiting out a retry backoff count too, so a
    /// long delay raises this figure without anything being stuck.
    pub oldest_pending_age: Option<Duration>,
}

impl OutboxStats {
    /// Stats from their parts (for backends).
    pub fn new(
        pending: u64,
        in_flight: u64,
        dead: u64,
        dispatched: u64,
        oldest_pending_age: Option<Duration>,
    ) -> Self {
        OutboxStats {
            pending,
            in_flight,
            dead,
            dispatched,
            oldest_pending_age,
        }
    }
}

/// A dead-lettered message and when it died.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The message, with its `last_error` saying why it died.
    pub message: Message,
    /// When it was dead-lettered (storage clock).
    pub dead_at: SystemTime,
}

impl DeadLetter {
    /// A dead letter from its parts (for backends).
    pub fn new(message: Message, dead_at: SystemTime) -> Self {
        DeadLetter { message, dead_at }
    }
}

/// Which dead letters an operation applies to. The default matches every one.
///
/// ```
/// use std::time::Duration;
/// use outbox_core::DeadLetterFilter;
///
/// // Dead letters for one destination that died more than an hour ago.
/// let filter = DeadLetterFilter::default()
///     .with_destination("orders.created")?
///     .with_dead_for(Duration::from_secs(3600));
/// assert_eq!(filter.destination(), Some("orders.created"));
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterFilter {
    destination: Option<String>,
    dead_for: Option<Duration>,
}

impl DeadLetterFilter {
    /// Only dead letters for this destination (exact match; validated like a
    /// message's destination).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for an empty,
    /// oversize or control-character destination.
    pub fn with_destination(mut self, destination: impl Into<String>) -> Result<Self> {
        let destination = destination.into();
        crate::limits::check_destination(&destination)?;
        self.destination = Some(destination);
        Ok(self)
    }

    /// Only dead letters that died at least `age` ago (by the storage's clock).
    #[must_use]
    pub fn with_dead_for(mut self, age: Duration) -> Self {
        self.dead_for = Some(age);
        self
    }

    /// The destination matched, if any.
    pub fn destination(&self) -> Option<&str> {
        self.destination.as_deref()
    }

    /// The least age matched, if any.
    pub fn dead_for(&self) -> Option<Duration> {
        self.dead_for
    }

    /// Whether a dead letter matches, by `now` of the storage's clock (for backends that
    /// filter in process, and as the reference for those that filter in SQL).
    pub fn matches(&self, letter: &DeadLetter, now: SystemTime) -> bool {
        self.destination
            .as_deref()
            .is_none_or(|d| letter.message.destination == d)
            && self.dead_for.is_none_or(|age| {
                now.duration_since(letter.dead_at)
                    .is_ok_and(|dead_for| dead_for >= age)
            })
    }
}

/// A page of dead letters: those matching `filter`, in id order, after `after`, at most
/// `limit` (1 to [`MAX_ADMIN_BATCH`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterPage {
    filter: DeadLetterFilter,
    after: Option<MessageId>,
    limit: usize,
}

impl DeadLetterPage {
    /// The first page of up to `limit` dead letters matching `filter`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for a `limit`
    /// outside 1 to [`MAX_ADMIN_BATCH`].
    pub fn new(filter: DeadLetterFilter, limit: usize) -> Result<Self> {
        check_batch("dead-letter page", limit)?;
        Ok(DeadLetterPage {
            filter,
            after: None,
            limit,
        })
    }

    /// Start after this id (the last one of the previous page).
    #[must_use]
    pub fn after(mut self, id: MessageId) -> Self {
        self.after = Some(id);
        self
    }

    /// Which dead letters.
    pub fn filter(&self) -> &DeadLetterFilter {
        &self.filter
    }

    /// The id the page starts after.
    pub fn after_id(&self) -> Option<MessageId> {
        self.after
    }

    /// The most dead letters on the page.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// The dead letters a requeue or discard applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetterSelection {
    /// These ids (ids that are not dead letters are ignored), at most
    /// [`MAX_ADMIN_BATCH`].
    Ids(Vec<MessageId>),
    /// Up to `limit` (1 to [`MAX_ADMIN_BATCH`]) dead letters matching the filter,
    /// oldest id first.
    Matching {
        /// Which dead letters.
        filter: DeadLetterFilter,
        /// How many at most.
        limit: usize,
    },
}

impl DeadLetterSelection {
    /// Check the bounds; backends call this before touching storage.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for more than
    /// [`MAX_ADMIN_BATCH`] ids or a limit outside 1 to [`MAX_ADMIN_BATCH`].
    pub fn validate(&self) -> Result<()> {
        match self {
            DeadLetterSelection::Ids(ids) if ids.len() > MAX_ADMIN_BATCH => {
                Err(Error::invalid_input(format!(
                    "{} ids exceed the limit of {MAX_ADMIN_BATCH}",
                    ids.len()
                )))
            }
            DeadLetterSelection::Ids(_) => Ok(()),
            DeadLetterSelection::Matching { limit, .. } => check_batch("selection", *limit),
        }
    }
}

fn check_batch(what: &str, limit: usize) -> Result<()> {
    if limit == 0 || limit > MAX_ADMIN_BATCH {
        return Err(Error::invalid_input(format!(
            "{what} limit {limit} is outside 1..={MAX_ADMIN_BATCH}"
        )));
    }
    Ok(())
}

/// What an operator needs of an outbox: counts, dead letters, history purges.
///
/// # Contract
///
/// - [`stats`](Self::stats) counts exactly, as of one moment: pending (due now or
///   later), in flight (a live lease), dead, dispatched (kept history), and the age of
///   the oldest undelivered message.
/// - [`dead_letters`](Self::dead_letters) lists dead letters matching the page's
///   filter in id order after [`DeadLetterPage::after_id`]; a row whose content does
///   not decode is still listed (with what does decode), since that is often why it
///   died.
/// - [`requeue_dead`](Self::requeue_dead) makes the selected dead letters due at once
///   with their attempt count reset to 0; [`discard_dead`](Self::discard_dead) deletes
///   them. Both touch dead letters only and return how many they changed.
/// - [`purge_dispatched`](Self::purge_dispatched) deletes at most `limit` (capped at
///   [`MAX_ADMIN_BATCH`]) dispatched messages completed more than `older_than` ago
///   (strictly), never pending, in-flight or dead ones; it returns 0 under
///   [`Retention::Delete`](crate::Retention::Delete).
/// - Each call is bounded by its limit ([`MAX_ADMIN_BATCH`] at most), so no call holds
///   locks on a large part of the table.
#[async_trait]
pub trait OutboxAdmin: Send + Sync + fmt::Debug {
    /// Exact counts.
    async fn stats(&self) -> Result<OutboxStats>;

    /// A page of dead letters.
    async fn dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>>;

    /// Make dead letters due again with their attempt count reset; returns how many.
    async fn requeue_dead(&self, selection: &DeadLetterSelection) -> Result<u64>;

    /// Delete dead letters for good; returns how many.
    async fn discard_dead(&self, selection: &DeadLetterSelection) -> Result<u64>;

    /// Delete up to `limit` dispatched messages completed more than `older_than` ago;
    /// returns how many.
    async fn purge_dispatched(&self, older_than: Duration, limit: usize) -> Result<u64>;
}

/// `Arc<A>` is an admin when `A` is.
#[async_trait]
impl<A: OutboxAdmin + ?Sized> OutboxAdmin for std::sync::Arc<A> {
    async fn stats(&self) -> Result<OutboxStats> {
        (**self).stats().await
    }
    async fn dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>> {
        (**self).dead_letters(page).await
    }
    async fn requeue_dead(&self, selection: &DeadLetterSelection) -> Result<u64> {
        (**self).requeue_dead(selection).await
    }
    async fn discard_dead(&self, selection: &DeadLetterSelection) -> Result<u64> {
        (**self).discard_dead(selection).await
    }
    async fn purge_dispatched(&self, older_than: Duration, limit: usize) -> Result<u64> {
        (**self).purge_dispatched(older_than, limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::MessageParts;
    use crate::ErrorKind;

    fn letter(destination: &str, dead_at: SystemTime) -> DeadLetter {
        let message = Message::from(MessageParts {
            id: MessageId::new(),
            destination: destination.into(),
            partition_key: None,
            payload: Vec::new(),
            content_type: None,
            headers: crate::Headers::new(),
            created_at: dead_at,
            attempts: 1,
            last_error: Some("boom".into()),
        });
        DeadLetter::new(message, dead_at)
    }

    #[test]
    fn filters_match_destination_and_age() {
        let now = SystemTime::now();
        let hour = Duration::from_secs(3600);
        let old = letter("a", now - hour * 2);
        let young = letter("a", now - Duration::from_secs(1));
        let other = letter("b", now - hour * 2);
        let all = DeadLetterFilter::default();
        assert!([&old, &young, &other].iter().all(|l| all.matches(l, now)));
        let a_old = all
            .clone()
            .with_destination("a")
            .unwrap()
            .with_dead_for(hour);
        assert!(a_old.matches(&old, now));
        assert!(!a_old.matches(&young, now));
        assert!(!a_old.matches(&other, now));
        let exactly = all.with_dead_for(hour * 2);
        assert!(exactly.matches(&old, now), "the age bound is inclusive");
        let future = letter("a", now + hour);
        assert!(!exactly.matches(&future, now));
    }

    #[test]
    fn bounds_are_checked() {
        let f = DeadLetterFilter::default();
        assert!(DeadLetterPage::new(f.clone(), 0).is_err());
        assert!(DeadLetterPage::new(f.clone(), MAX_ADMIN_BATCH + 1).is_err());
        let page = DeadLetterPage::new(f.clone(), MAX_ADMIN_BATCH).unwrap();
        assert_eq!(page.limit(), MAX_ADMIN_BATCH);
        assert_eq!(page.after_id(), None);
        let id = MessageId::new();
        assert_eq!(page.after(id).after_id(), Some(id));
        for bad in [
            DeadLetterSelection::Ids(vec![MessageId::new(); MAX_ADMIN_BATCH + 1]),
            DeadLetterSelection::Matching {
                filter: f.clone(),
                limit: 0,
            },
            DeadLetterSelection::Matching {
                filter: f.clone(),
                limit: MAX_ADMIN_BATCH + 1,
            },
        ] {
            assert_eq!(bad.validate().unwrap_err().kind(), ErrorKind::InvalidInput);
        }
        DeadLetterSelection::Ids(vec![MessageId::new(); MAX_ADMIN_BATCH])
            .validate()
            .unwrap();
        DeadLetterSelection::Matching {
            filter: f.clone(),
            limit: 1,
        }
        .validate()
        .unwrap();
        assert!(f.clone().with_destination("").is_err());
        assert!(f.with_destination("a\nb").is_err());
    }
}
