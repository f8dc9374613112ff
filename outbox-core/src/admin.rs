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

/// Which dead letters an operation applies to. The default matches every one; each
/// condition set narrows it (all must hold).
///
/// ```
/// use std::time::Duration;
/// use outbox_core::{DeadLetterFilter, MessageId};
///
/// // Dead letters for one destination that died more than an hour ago.
/// let filter = DeadLetterFilter::default()
///     .with_destination("orders.created")?
///     .with_dead_for(Duration::from_secs(3600));
/// assert_eq!(filter.destination(), Some("orders.created"));
///
/// // One dead letter, by id (say, to show it).
/// let id = MessageId::new();
/// let one = DeadLetterFilter::default().with_ids([id])?;
/// assert_eq!(one.ids(), Some(&[id][..]));
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterFilter {
    destination: Option<String>,
    dead_for: Option<Duration>,
    /// Sorted, without repeats.
    ids: Option<Vec<MessageId>>,
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

    /// Only dead letters with one of these ids: at most [`MAX_ADMIN_BATCH`] distinct
    /// ids (repeats are dropped). An empty list matches no dead letter. Ids that are
    /// not dead letters match nothing, so listing by ids tells which of them are.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for more than
    /// [`MAX_ADMIN_BATCH`] distinct ids.
    pub fn with_ids(mut self, ids: impl IntoIterator<Item = MessageId>) -> Result<Self> {
        let mut ids: Vec<MessageId> = ids.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() > MAX_ADMIN_BATCH {
            return Err(Error::invalid_input(format!(
                "{} ids exceed the limit of {MAX_ADMIN_BATCH}",
                ids.len()
            )));
        }
        self.ids = Some(ids);
        Ok(self)
    }

    /// The destination matched, if any.
    pub fn destination(&self) -> Option<&str> {
        self.destination.as_deref()
    }

    /// The least age matched, if any.
    pub fn dead_for(&self) -> Option<Duration> {
        self.dead_for
    }

    /// The ids matched, ascending and without repeats, if the filter is by ids.
    pub fn ids(&self) -> Option<&[MessageId]> {
        self.ids.as_deref()
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
            && self
                .ids
                .as_deref()
                .is_none_or(|ids| ids.binary_search(&letter.message.id).is_ok())
    }
}

/// The order of a [`DeadLetterPage`]: by message id, the order paging follows.
///
/// Ids made by [`MessageId::new`] are UUIDv7, which sort by creation time (to the
/// millisecond), so for them ascending is oldest message first. That is the order
/// the messages were **enqueued** in, not the order they died in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DeadLetterOrder {
    /// Lowest id first (the default): the oldest message first for UUIDv7 ids.
    #[default]
    Ascending,
    /// Highest id first: the newest message first for UUIDv7 ids.
    Descending,
}

/// A page of dead letters: those matching `filter`, in id order (ascending unless
/// [`with_order`](Self::with_order) says otherwise), after `after` in that order, at
/// most `limit` (1 to [`MAX_ADMIN_BATCH`]).
///
/// ```
/// use outbox_core::{DeadLetterFilter, DeadLetterOrder, DeadLetterPage, MessageId};
///
/// // The 20 newest dead letters, then the 20 before them.
/// let first = DeadLetterPage::new(DeadLetterFilter::default(), 20)?
///     .with_order(DeadLetterOrder::Descending);
/// # let last_of_first = MessageId::new();
/// let next = first.clone().after(last_of_first);
/// assert_eq!(next.order(), DeadLetterOrder::Descending);
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterPage {
    filter: DeadLetterFilter,
    after: Option<MessageId>,
    limit: usize,
    order: DeadLetterOrder,
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
            order: DeadLetterOrder::Ascending,
        })
    }

    /// Start after this id in the page's order (the last one of the previous page):
    /// above it when ascending, below it when descending.
    #[must_use]
    pub fn after(mut self, id: MessageId) -> Self {
        self.after = Some(id);
        self
    }

    /// List in this order (default [`DeadLetterOrder::Ascending`]).
    #[must_use]
    pub fn with_order(mut self, order: DeadLetterOrder) -> Self {
        self.order = order;
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

    /// The order of the page.
    pub fn order(&self) -> DeadLetterOrder {
        self.order
    }

    /// Whether `id` lies past [`after_id`](Self::after_id) in the page's order (always,
    /// on a first page): for backends that page in process, and as the reference.
    pub fn is_past_cursor(&self, id: MessageId) -> bool {
        match (self.after, self.order) {
            (None, _) => true,
            (Some(after), DeadLetterOrder::Ascending) => id > after,
            (Some(after), DeadLetterOrder::Descending) => id < after,
        }
    }
}

/// The dead letters a requeue or discard applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetterSelection {
    /// These ids (ids that are not dead letters are ignored), at most
    /// [`MAX_ADMIN_BATCH`].
    Ids(Vec<MessageId>),
    /// Up to `limit` (1 to [`MAX_ADMIN_BATCH`]) dead letters matching the filter,
    /// lowest id first.
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
///   filter ([`DeadLetterFilter::matches`]) in the page's id order
///   ([`DeadLetterPage::order`]), past [`DeadLetterPage::after_id`] in that order
///   ([`DeadLetterPage::is_past_cursor`]), at most [`DeadLetterPage::limit`]; a row
///   whose content does not decode is still listed (with what does decode), since
///   that is often why it died.
/// - [`count_dead`](Self::count_dead) counts the dead letters a filter matches,
///   exactly, as of one moment: as many as paging through them with that filter would
///   list if nothing changed meanwhile.
/// - [`requeue_dead`](Self::requeue_dead) makes the selected dead letters due at once
///   with their attempt count reset to 0; [`discard_dead`](Self::discard_dead) deletes
///   them. Both touch dead letters only and return how many they changed. Every row
///   listed and counted as dead can be requeued, and a requeued message is claimable:
///   a dead letter that also carries a dispatched time (written by another tool) is
///   requeued whole, its dispatched time cleared, never reported requeued while it
///   stays out of every claim and count.
/// - [`purge_dispatched`](Self::purge_dispatched) deletes at most `limit` (capped at
///   [`MAX_ADMIN_BATCH`]) dispatched messages completed more than `older_than` ago
///   (strictly), never pending, in-flight or dead ones; it returns 0 under
///   [`Retention::Delete`](crate::Retention::Delete).
///   [`count_dispatched`](Self::count_dispatched) counts, exactly and as of one moment,
///   the messages those purges would delete in all (0 under `Retention::Delete`), and
///   changes nothing: a dry run.
/// - Each call that returns or changes rows is bounded by its limit
///   ([`MAX_ADMIN_BATCH`] at most), so no call holds locks on a large part of the
///   table. Counts lock nothing, but read every row they count.
#[async_trait]
pub trait OutboxAdmin: Send + Sync + fmt::Debug {
    /// Exact counts.
    async fn stats(&self) -> Result<OutboxStats>;

    /// A page of dead letters.
    async fn dead_letters(&self, page: &DeadLetterPage) -> Result<Vec<DeadLetter>>;

    /// How many dead letters match `filter`.
    async fn count_dead(&self, filter: &DeadLetterFilter) -> Result<u64>;

    /// Make dead letters due again with their attempt count reset; returns how many.
    async fn requeue_dead(&self, selection: &DeadLetterSelection) -> Result<u64>;

    /// Delete dead letters for good; returns how many.
    async fn discard_dead(&self, selection: &DeadLetterSelection) -> Result<u64>;

    /// Delete up to `limit` dispatched messages completed more than `older_than` ago;
    /// returns how many.
    async fn purge_dispatched(&self, older_than: Duration, limit: usize) -> Result<u64>;

    /// How many dispatched messages completed more than `older_than` ago are kept:
    /// what [`purge_dispatched`](Self::purge_dispatched) with that age would delete
    /// over all its batches. Changes nothing.
    async fn count_dispatched(&self, older_than: Duration) -> Result<u64>;
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
    async fn count_dead(&self, filter: &DeadLetterFilter) -> Result<u64> {
        (**self).count_dead(filter).await
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
    async fn count_dispatched(&self, older_than: Duration) -> Result<u64> {
        (**self).count_dispatched(older_than).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MessageParts;
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
    fn id_filters_match_listed_ids_only() {
        let now = SystemTime::now();
        let (a, b) = (letter("a", now), letter("a", now));
        let only_a = DeadLetterFilter::default()
            .with_ids([a.message.id, a.message.id])
            .unwrap();
        assert_eq!(only_a.ids(), Some(&[a.message.id][..]), "repeats dropped");
        assert!(only_a.matches(&a, now));
        assert!(!only_a.matches(&b, now));
        let none = DeadLetterFilter::default().with_ids([]).unwrap();
        assert!(!none.matches(&a, now), "an empty id list matches nothing");
        let both = DeadLetterFilter::default()
            .with_ids([b.message.id, a.message.id])
            .unwrap();
        assert!(both.ids().unwrap().is_sorted());
        assert!(both.matches(&a, now) && both.matches(&b, now));
        let other_destination = both.with_destination("b").unwrap();
        assert!(!other_destination.matches(&a, now), "conditions combine");
        let too_many = (0..=MAX_ADMIN_BATCH).map(|_| MessageId::new());
        let err = DeadLetterFilter::default().with_ids(too_many).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }

    #[test]
    fn pages_follow_their_order_past_the_cursor() {
        let mut ids: Vec<MessageId> = (0..3).map(|_| MessageId::new()).collect();
        ids.sort();
        let page = DeadLetterPage::new(DeadLetterFilter::default(), 10).unwrap();
        assert_eq!(page.order(), DeadLetterOrder::Ascending);
        assert!(ids.iter().all(|id| page.is_past_cursor(*id)));
        let up = page.clone().after(ids[1]);
        assert!(!up.is_past_cursor(ids[0]) && !up.is_past_cursor(ids[1]));
        assert!(up.is_past_cursor(ids[2]));
        let down = up.with_order(DeadLetterOrder::Descending);
        assert!(down.is_past_cursor(ids[0]));
        assert!(!down.is_past_cursor(ids[1]) && !down.is_past_cursor(ids[2]));
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
