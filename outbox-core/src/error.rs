//! The one error type of the workspace.
//!
//! Every backend maps its driver errors into [`Error`] in one place (its `error.rs`), so
//! the relay and callers decide what to do next from [`Error::kind`] and
//! [`Error::is_retryable`] alone, whatever the database.

use std::fmt;

use crate::message::MessageId;

/// What went wrong, as far as a caller needs to know to decide what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Caller input was rejected before anything was written: an invalid identifier,
    /// an oversize payload, a bad header, a zero batch size.
    InvalidInput,
    /// A lease was no longer held: it expired and another claimer took the message, or
    /// the message was completed, failed or released by someone else. Nothing changed.
    LeaseLost,
    /// A row read from storage could not be decoded into a message.
    Decode,
    /// A uniqueness constraint or optimistic-concurrency check failed.
    Conflict,
    /// The storage or broker could not be reached, or the connection dropped.
    Unavailable,
    /// The operation timed out.
    Timeout,
    /// The storage refused the operation for a transient reason (serialization
    /// failure, deadlock, lock not available, throttling). Trying again may succeed.
    Contention,
    /// The schema is missing or at an unexpected version.
    Schema,
    /// A configuration value is invalid.
    Config,
    /// The broker did not take a message. Temporary by default (a nack, a full
    /// queue); mark it [`ErrorStatus::Permanent`] with [`Error::with_status`] when
    /// retrying cannot help.
    Publish,
    /// A store or publisher was used in a way its declared capabilities do not allow.
    Unsupported,
    /// Anything else reported by the storage driver.
    Storage,
    /// A task of the library panicked (a relay loop, a batch, a publisher). The panic's
    /// message is the error's message.
    Panicked,
}

impl ErrorKind {
    /// The status an error of this kind gets unless the constructor says otherwise.
    pub fn default_status(self) -> ErrorStatus {
        match self {
            ErrorKind::Unavailable
            | ErrorKind::Timeout
            | ErrorKind::Contention
            | ErrorKind::Publish => ErrorStatus::Temporary,
            _ => ErrorStatus::Permanent,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::LeaseLost => "lease lost",
            ErrorKind::Decode => "undecodable row",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timed out",
            ErrorKind::Contention => "contention",
            ErrorKind::Schema => "schema",
            ErrorKind::Config => "configuration",
            ErrorKind::Publish => "publish refused",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Storage => "storage",
            ErrorKind::Panicked => "panicked",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether retrying the same operation can succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorStatus {
    /// Retrying the same call unchanged will fail the same way.
    Permanent,
    /// Retrying later may succeed (connection drop, contention, timeout).
    Temporary,
}

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The workspace's error: a [`ErrorKind`], a [`ErrorStatus`], a message about this
/// layer, optionally the message ids concerned, and the underlying cause as
/// [`std::error::Error::source`].
///
/// `Display` prints this layer's message only; walk `source()` for the cause, or print
/// [`Error::report`] (as every log line of this workspace does) for the whole chain.
#[derive(thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    kind: ErrorKind,
    status: ErrorStatus,
    message: String,
    ids: Vec<MessageId>,
    #[source]
    source: Option<Source>,
}

/// An error and its whole chain of causes, `"kind: message: cause: cause"`, a cause
/// whose text its wrapper already printed left out; see [`Error::report`].
#[derive(Debug, Clone, Copy)]
pub struct Report<'a>(&'a Error);

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = std::error::Error::source(self.0);
        let mut previous = String::new();
        while let Some(cause) = source {
            // Wrappers often repeat their inner error's text ("error returned from
            // database: X", then X): print each text once.
            let text = cause.to_string();
            if !previous.contains(&text) {
                write!(f, ": {text}")?;
            }
            previous = text;
            source = cause.source();
        }
        Ok(())
    }
}

/// `ids` for a message: one named, or a count and the first five.
fn describe_ids(ids: &[MessageId]) -> String {
    const SHOWN: usize = 5;
    match ids {
        [one] => format!("message id {one}"),
        _ => {
            let shown: Vec<String> = ids.iter().take(SHOWN).map(ToString::to_string).collect();
            let more = if ids.len() > SHOWN { ", ..." } else { "" };
            format!("{} message ids ({}{more})", ids.len(), shown.join(", "))
        }
    }
}

impl Error {
    /// A new error of `kind` with its default status.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            status: kind.default_status(),
            message: message.into(),
            ids: Vec::new(),
            source: None,
        }
    }

    /// Shorthand for [`ErrorKind::InvalidInput`].
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidInput, message)
    }

    /// Shorthand for [`ErrorKind::Config`].
    pub fn config(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Config, message)
    }

    /// A [`ErrorKind::LeaseLost`] naming the messages whose leases were lost.
    pub fn lease_lost(ids: Vec<MessageId>) -> Self {
        let message = match ids.as_slice() {
            [one] => format!("lease on message {one} is no longer held"),
            many => format!("leases on {} messages are no longer held", many.len()),
        };
        Error::new(ErrorKind::LeaseLost, message).with_ids(ids)
    }

    /// A [`ErrorKind::Conflict`] for an enqueue whose batch holds ids that are already
    /// stored (named, ascending): nothing of the batch was written, and the caller's
    /// transaction is still usable.
    pub fn already_stored(mut ids: Vec<MessageId>) -> Self {
        ids.sort();
        let message = format!(
            "{} already stored; nothing of the batch was written and the transaction is \
             still usable",
            describe_ids(&ids)
        );
        Error::new(ErrorKind::Conflict, message).with_ids(ids)
    }

    /// A [`ErrorKind::Conflict`] for a batch naming some ids more than once (named,
    /// ascending): refused before anything is written.
    pub fn repeated_in_batch(mut ids: Vec<MessageId>) -> Self {
        ids.sort();
        let message = format!(
            "{} appear more than once in the batch; nothing was written",
            describe_ids(&ids)
        );
        Error::new(ErrorKind::Conflict, message).with_ids(ids)
    }

    /// Attach the underlying cause.
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Override the status (for example a storage error known to be transient).
    pub fn with_status(mut self, status: ErrorStatus) -> Self {
        self.status = status;
        self
    }

    /// Name the messages this error concerns.
    pub fn with_ids(mut self, ids: Vec<MessageId>) -> Self {
        self.ids = ids;
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether retrying can succeed.
    pub fn status(&self) -> ErrorStatus {
        self.status
    }

    /// `true` when retrying later may succeed.
    pub fn is_retryable(&self) -> bool {
        self.status == ErrorStatus::Temporary
    }

    /// The messages this error concerns, if it names any.
    pub fn ids(&self) -> &[MessageId] {
        &self.ids
    }

    /// This layer's description, without the cause.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error with its causes, for logs and stored error text: a database outage
    /// reads `unavailable: claim failed: error communicating with database: Connection
    /// refused`, not just `unavailable: claim failed`.
    pub fn report(&self) -> Report<'_> {
        Report(self)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind)
            .field("status", &self.status)
            .field("message", &self.message);
        if !self.ids.is_empty() {
            d.field("ids", &self.ids);
        }
        if let Some(source) = &self.source {
            d.field("source", source);
        }
        d.finish()
    }
}

/// The workspace's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn reports_print_a_repeated_cause_once() {
        #[derive(Debug)]
        struct Wrapper(std::io::Error);
        impl fmt::Display for Wrapper {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "error returned from database: {}", self.0)
            }
        }
        impl std::error::Error for Wrapper {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let inner = std::io::Error::other("no such table: t");
        let err = Error::new(ErrorKind::Schema, "claim failed").with_source(Wrapper(inner));
        assert_eq!(
            err.report().to_string(),
            "schema: claim failed: error returned from database: no such table: t"
        );
    }

    #[test]
    fn batch_conflicts_name_their_ids_in_order() {
        let mut ids: Vec<MessageId> = (0..7).map(|_| MessageId::new()).collect();
        let one = Error::already_stored(vec![ids[0]]);
        assert_eq!(one.kind(), ErrorKind::Conflict);
        assert_eq!(one.ids(), &[ids[0]]);
        assert!(one.message().starts_with(&format!("message id {}", ids[0])));
        assert!(one.message().contains("still usable"), "{one}");
        let reversed: Vec<MessageId> = ids.iter().rev().copied().collect();
        let many = Error::repeated_in_batch(reversed);
        ids.sort();
        assert_eq!(many.ids(), &ids[..], "ascending");
        assert!(many.message().starts_with("7 message ids ("), "{many}");
        assert!(many.message().contains(", ...)"), "{many}");
        let two = Error::already_stored(ids[..2].to_vec());
        assert!(two.message().starts_with("2 message ids ("), "{two}");
        assert!(!two.message().contains("..."), "{two}");
    }

    #[test]
    fn display_describes_this_layer_only() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let err = Error::new(ErrorKind::Unavailable, "claim failed").with_source(io);
        assert_eq!(err.to_string(), "unavailable: claim failed");
        assert_eq!(err.source().unwrap().to_string(), "reset by peer");
        assert!(err.is_retryable());
    }

    #[test]
    fn report_prints_the_whole_chain() {
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let middle = Error::new(ErrorKind::Storage, "pool timed out").with_source(inner);
        let outer = Error::new(ErrorKind::Unavailable, "claim failed").with_source(middle);
        assert_eq!(
            outer.report().to_string(),
            "unavailable: claim failed: storage: pool timed out: refused"
        );
        assert_eq!(Error::config("x").report().to_string(), "configuration: x");
        assert_eq!(ErrorKind::Panicked.to_string(), "panicked");
        assert!(!Error::new(ErrorKind::Panicked, "x").is_retryable());
    }

    #[test]
    fn default_statuses() {
        assert!(!Error::invalid_input("x").is_retryable());
        assert!(Error::new(ErrorKind::Contention, "x").is_retryable());
        assert!(!Error::lease_lost(vec![MessageId::new()]).is_retryable());
        let overridden = Error::new(ErrorKind::Storage, "x").with_status(ErrorStatus::Temporary);
        assert!(overridden.is_retryable());
    }

    #[test]
    fn lease_lost_names_ids() {
        let ids = vec![MessageId::new(), MessageId::new()];
        let err = Error::lease_lost(ids.clone());
        assert_eq!(err.kind(), ErrorKind::LeaseLost);
        assert_eq!(err.ids(), ids.as_slice());
    }
}
