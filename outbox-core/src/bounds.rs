//! The bounds of the store contract and the rules that apply them, in one module that
//! the contract (`store`), the message model and the backend kit all import, so every
//! import in the crate runs downward: lease bounds, claim size, attempts, error text,
//! lock order and identifier names. Re-exported from [`store`](crate::store) (the
//! constants) and [`backend`](crate::backend) (the rules).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::message::MessageId;

/// Longest lease a claim may ask for.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);
/// Shortest lease a claim may ask for: below the millisecond, storage clocks (and the
/// column types that keep the lease) cannot tell a lease from none.
pub const MIN_LEASE: Duration = Duration::from_millis(1);
/// Most messages one claim may ask for.
pub const MAX_CLAIM_BATCH: usize = 10_000;
/// Longest error text a [`Failure`](crate::store::Failure) carries, in bytes; longer
/// text is cut on a character boundary when the failure is made.
pub const MAX_ERROR_LEN: usize = 4096;
/// The most attempts a message can be counted: a claim never counts past it, and a
/// message that reaches it is dead-lettered by the claim instead of being published.
pub const MAX_ATTEMPTS: u32 = i32::MAX as u32;

/// Check a lease duration is within [`MIN_LEASE`]`..=`[`MAX_LEASE`].
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

/// `text` cut to at most [`MAX_ERROR_LEN`] bytes on a character boundary: the bound
/// every [`Failure`](crate::store::Failure) applies, for backends that record reasons of their own (a
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn id_order_sorts_whatever_the_input_order() {
        let ids: Vec<MessageId> = (0..50).map(|_| MessageId::new()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        let reversed: Vec<MessageId> = sorted.iter().rev().copied().collect();
        for input in [&ids, &reversed, &sorted] {
            let bound: Vec<MessageId> = in_id_order(input, |id| *id).into_iter().copied().collect();
            assert_eq!(bound, sorted);
        }
    }

    #[test]
    fn identifiers() {
        for ok in ["a", "_", "outbox", "obx_t_0123", &"a".repeat(63)] {
            validate_identifier("table", ok, 63).unwrap();
        }
        let long = "a".repeat(64);
        let bad = [
            "",
            "1abc",
            "Outbox",
            "has space",
            "semi;colon",
            "quote\"d",
            "dash-ed",
            "dot.ted",
            "é",
            &long,
        ];
        for name in bad {
            let err = validate_identifier("table", name, 63).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{name:?}");
            assert!(err.message().contains("table name"), "{err}");
        }
        validate_identifier("table", &long, 128).unwrap();
    }
}
