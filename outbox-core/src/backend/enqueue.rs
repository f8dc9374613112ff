//! The check every backend's `enqueue` makes before it writes: [`check_enqueue`].

use crate::error::{Error, Result};
use crate::limits::MessageLimits;
use crate::message::{MessageId, NewMessage};

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
