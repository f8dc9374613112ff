//! The dispatch every backend's [`OutboxAdmin`](crate::OutboxAdmin) does before its
//! statements: which dead letters a requeue or discard takes ([`dead_target`]), what
//! the change is ([`DeadChange`]), and how far a purge may go ([`purge_limit`]).

use crate::admin::{DeadLetterFilter, DeadLetterSelection, MAX_ADMIN_BATCH};
use crate::error::Result;
use crate::message::MessageId;
use crate::store::Retention;

/// How a dead-letter change alters the rows it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadChange {
    /// Make due again, attempts reset
    /// ([`OutboxAdmin::requeue_dead`](crate::OutboxAdmin::requeue_dead)).
    Requeue,
    /// Delete ([`OutboxAdmin::discard_dead`](crate::OutboxAdmin::discard_dead)).
    Discard,
}

impl DeadChange {
    /// What the change is doing, for errors: `"requeue dead letters"` or `"discard
    /// dead letters"`.
    pub fn what(self) -> &'static str {
        match self {
            DeadChange::Requeue => "requeue dead letters",
            DeadChange::Discard => "discard dead letters",
        }
    }
}

/// The dead letters a change takes, once [`dead_target`] has checked the selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadTarget<'a> {
    /// These ids, at least one, in id order without repeats: the order every batch
    /// locks its rows in, so overlapping calls do not deadlock.
    Ids(Vec<MessageId>),
    /// Up to `limit` (1 to [`MAX_ADMIN_BATCH`]) dead letters matching `filter`, lowest
    /// id first.
    Matching {
        /// Which dead letters.
        filter: &'a DeadLetterFilter,
        /// How many at most.
        limit: usize,
    },
}

/// The checked target of a requeue or discard of `selection`; `None` when it names no
/// ids, so nothing is to run.
///
/// # Errors
/// [`DeadLetterSelection::validate`]'s.
pub fn dead_target(selection: &DeadLetterSelection) -> Result<Option<DeadTarget<'_>>> {
    selection.validate()?;
    Ok(match selection {
        DeadLetterSelection::Ids(ids) if ids.is_empty() => None,
        DeadLetterSelection::Ids(ids) => {
            let mut ids = ids.clone();
            ids.sort_unstable();
            ids.dedup();
            Some(DeadTarget::Ids(ids))
        }
        DeadLetterSelection::Matching { filter, limit } => Some(DeadTarget::Matching {
            filter,
            limit: *limit,
        }),
    })
}

/// How many dispatched rows a
/// [`purge_dispatched`](crate::OutboxAdmin::purge_dispatched) of `limit` deletes at
/// most: `limit`, taken as [`MAX_ADMIN_BATCH`] above that; `None` (nothing to run) for
/// 0, or when the store keeps no dispatched rows ([`Retention::Delete`]).
pub fn purge_limit(limit: usize, retention: Retention) -> Option<usize> {
    if limit == 0 || retention == Retention::Delete {
        return None;
    }
    Some(limit.min(MAX_ADMIN_BATCH))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use std::time::Duration;

    #[test]
    fn targets_are_checked_sorted_and_deduplicated() {
        assert_eq!(
            dead_target(&DeadLetterSelection::Ids(vec![])).unwrap(),
            None
        );
        let (a, b) = (MessageId::new(), MessageId::new());
        let Some(DeadTarget::Ids(ids)) =
            dead_target(&DeadLetterSelection::Ids(vec![b, a, b])).unwrap()
        else {
            panic!("ids expected");
        };
        let mut sorted = vec![a, b];
        sorted.sort_unstable();
        assert_eq!(ids, sorted);
        let filter = DeadLetterFilter::default();
        let matching = DeadLetterSelection::Matching {
            filter: filter.clone(),
            limit: 3,
        };
        assert_eq!(
            dead_target(&matching).unwrap(),
            Some(DeadTarget::Matching {
                filter: &filter,
                limit: 3
            })
        );
        let over = DeadLetterSelection::Matching { filter, limit: 0 };
        assert_eq!(
            dead_target(&over).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(DeadChange::Discard.what(), "discard dead letters");
    }

    #[test]
    fn purges_are_bounded() {
        let keep = Retention::Keep {
            window: Duration::from_secs(1),
        };
        assert_eq!(purge_limit(0, keep), None);
        assert_eq!(purge_limit(5, Retention::Delete), None);
        assert_eq!(purge_limit(5, keep), Some(5));
        assert_eq!(purge_limit(usize::MAX, keep), Some(MAX_ADMIN_BATCH));
    }
}
