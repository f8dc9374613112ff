//! The rules every backend applies the same way: lease bounds, lock order, the checks
//! before an enqueue, bounded error text and identifier names.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::limits::MessageLimits;
use crate::message::{MessageId, NewMessage};
use crate::store::{MAX_ERROR_LEN, MAX_LEASE, MIN_LEASE};

/// Check a lease duration is within [`MIN_LEASE`](crate::store::MIN_LEASE)`..=`[`MAX_LEASE`](crate::store::MAX_LEASE).
///
/// # Errors
/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when out of bounds.
pub fn validate_lease(lease: Duration) -> Result<()> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(Error::invalid_input(format!(
            "lease of {lease:?} is outside {MIN_LEASE:?}..={MAX_LEASE:?}"
        )));
    }
    Ok(())
}

/// `items` sorted by message id: the order in which every batch statement should lock
/// the rows it touches, so two concurrent batches sharing rows (a complete and a
/// release of the same leases, say) wait for each other instead of deadlocking.
pub fn in_id_order<T>(items: &[T], id: impl Fn(&T) -> MessageId) -> Vec<&T> {
    let mut sorted: Vec<&T> = items.iter().collect();
    sorted.sort_by_key(|item| id(item));
    sorted
}

/// Check a batch before enqueueing it, as every backend's `enqueue` must: each message
/// against `limits` (a message built under other limits may break them), and no id
/// given twice. Call it before sending anything, so a refused batch writes nothing.
///
/// # Errors
/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for the first message
/// over the limits; [`Error::repeated_in_batch`] naming ids given more than once.
pub fn check_enqueue(messages: &[NewMessage], limits: &MessageLimits) -> Result<()> {
    for message in messages {
        limits.check(message)?;
    }
    if messages.len() > 1 {
        let mut seen = std::collections::HashSet::with_capacity(messages.len());
        let mut repeated: Vec<MessageId> = messages
            .iter()
            .map(NewMessage::id)
            .filter(|id| !seen.insert(*id))
            .collect();
        if !repeated.is_empty() {
            repeated.sort();
            repeated.dedup();
            return Err(Error::repeated_in_batch(repeated));
        }
    }
    Ok(())
}

/// `text` cut to at most [`MAX_ERROR_LEN`](crate::store::MAX_ERROR_LEN) bytes on a character boundary: the bound
/// every [`Failure`](crate::Failure) applies, for backends that record reasons of their own (a
/// dead-lettered poison row's, say).
pub fn bounded_error(mut text: String) -> String {
    if text.len() > MAX_ERROR_LEN {
        let mut cut = MAX_ERROR_LEN;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

/// Check a SQL identifier (schema, table, channel) against the portable rule
/// `^[a-z_][a-z0-9_]*$`, at most `max_len` bytes (63 on PostgreSQL, 128 on SQL Server).
///
/// Backends still quote identifiers; this rule makes quoting a formality, since no
/// accepted name contains a quote, a dot or a space.
///
/// # Errors
/// [`ErrorKind::Config`](crate::ErrorKind::Config) naming `what` when `name` breaks it.
pub fn validate_identifier(what: &str, name: &str, max_len: usize) -> Result<()> {
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
    let rest_ok = bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if first_ok && rest_ok && name.len() <= max_len {
        Ok(())
    } else {
        Err(Error::config(format!(
            "{what} name {name:?} must be 1 to {max_len} bytes of a-z, 0-9 and _, not \
             starting with a digit"
        )))
    }
}
