//! [`SqsPublisherConfig`]: how destinations become queues, what FIFO queues get as the
//! group of a message without a partition key, how many requests may be outstanding,
//! and the size limit checked before sending.

use std::time::Duration;

use outbox_core::{Error, Result};

/// The default bound on outstanding `SendMessageBatch` requests per publisher.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 16;
/// The largest `max_concurrent_requests` accepted.
pub const MAX_CONCURRENT_REQUESTS: usize = 1024;
/// The default wait for one SQS request (`SendMessageBatch`, `GetQueueUrl`), 3 s.
///
/// A publish call's requests to one FIFO queue run one after another, so a call of
/// `n` such requests can take `n` × this (more when a refused request is sent again
/// entry by entry); keep it well under the relay's `publish_timeout` (10 s by
/// default), or one slow request costs the whole call instead of its own messages.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// The default size limit, 256 KiB: the body plus every message attribute's name,
/// type and value, counted in bytes; also the limit of one `SendMessageBatch` request
/// (the sum of its messages). Queues created before 2025 with defaults take 256 KiB;
/// queues created since with defaults take 1 MiB, SQS's maximum. A queue's
/// `MaximumMessageSize` may be set lower, so this default is the size every queue
/// created with defaults takes; raise it to your queues' value to send more.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// The largest `max_message_bytes` accepted: SQS's maximum, 1 MiB.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// The smallest `max_message_bytes` accepted (SQS's own minimum for a queue's
/// `MaximumMessageSize`).
pub const MIN_MESSAGE_BYTES: usize = 1024;
/// The longest queue name SQS accepts, `.fifo` included.
pub const MAX_QUEUE_NAME_LEN: usize = 80;
/// The suffix that makes a queue FIFO.
pub const FIFO_SUFFIX: &str = ".fifo";
/// The longest `MessageGroupId` SQS accepts.
pub const MAX_GROUP_ID_LEN: usize = 128;

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Routing {
    /// One queue per destination: a message to destination `d` goes to the queue
    /// named `<prefix>d<suffix>`, whose URL is looked up with `GetQueueUrl` once and
    /// cached. The publisher never creates queues; a queue that does not exist makes
    /// the message [`Permanent`](outbox_core::PublishOutcome::Permanent).
    PerDestination {
        /// Put before the destination (empty by default).
        prefix: String,
        /// Put after the destination (empty by default; `.fifo` to send every
        /// destination to a FIFO queue).
        suffix: String,
    },
    /// Every message to this one queue URL, whatever its destination; the destination
    /// travels in the [`DESTINATION_ATTRIBUTE`](crate::DESTINATION_ATTRIBUTE) message
    /// attribute.
    SingleQueue {
        /// The queue URL (`https://sqs.<region>.amazonaws.com/<account>/<name>`).
        url: String,
    },
}

/// The `MessageGroupId` a message without a partition key gets on a FIFO queue.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum UnkeyedGroup {
    /// Its own message id: every unkeyed message is a group of its own, so SQS keeps
    /// no order among unkeyed messages and consumers take them in parallel (what a
    /// message without a key means in the outbox: no order promised). The default.
    #[default]
    MessageId,
    /// One fixed group for all of them: SQS delivers unkeyed messages in the order it
    /// received them, one group at a time, so consumers take them one by one.
    Fixed(String),
}

/// Settings of an [`SqsPublisher`](crate::SqsPublisher).
///
/// ```
/// use std::time::Duration;
/// use outbox_sqs::{SqsPublisherConfig, UnkeyedGroup};
///
/// let config = SqsPublisherConfig::new()
///     .with_queue_prefix("prod-")
///     .with_queue_suffix(".fifo")
///     .with_unkeyed_group(UnkeyedGroup::Fixed("unkeyed".into()))
///     .with_max_concurrent_requests(32)
///     .with_request_timeout(Duration::from_secs(5));
/// config.validate()?;
/// assert_eq!(config.queue_name_for("orders")?, "prod-orders.fifo");
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqsPublisherConfig {
    routing: Routing,
    unkeyed_group: UnkeyedGroup,
    max_concurrent_requests: usize,
    request_timeout: Duration,
    max_message_bytes: usize,
}

impl Default for SqsPublisherConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl SqsPublisherConfig {
    /// One queue per destination, named as the destination; every default.
    pub fn new() -> Self {
        SqsPublisherConfig {
            routing: Routing::PerDestination {
                prefix: String::new(),
                suffix: String::new(),
            },
            unkeyed_group: UnkeyedGroup::default(),
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }

    /// Send every message to the queue at `url`, whatever its destination.
    #[must_use]
    pub fn with_single_queue(mut self, url: impl Into<String>) -> Self {
        self.routing = Routing::SingleQueue { url: url.into() };
        self
    }

    /// Name the queue of destination `d` `<prefix>d<suffix>` (switches to
    /// [`Routing::PerDestination`], keeping its suffix).
    #[must_use]
    pub fn with_queue_prefix(mut self, prefix: impl Into<String>) -> Self {
        let suffix = match self.routing {
            Routing::PerDestination { suffix, .. } => suffix,
            Routing::SingleQueue { .. } => String::new(),
        };
        self.routing = Routing::PerDestination {
            prefix: prefix.into(),
            suffix,
        };
        self
    }

    /// Name the queue of destination `d` `<prefix>d<suffix>` (switches to
    /// [`Routing::PerDestination`], keeping its prefix). `.fifo` sends every
    /// destination to a FIFO queue.
    #[must_use]
    pub fn with_queue_suffix(mut self, suffix: impl Into<String>) -> Self {
        let prefix = match self.routing {
            Routing::PerDestination { prefix, .. } => prefix,
            Routing::SingleQueue { .. } => String::new(),
        };
        self.routing = Routing::PerDestination {
            prefix,
            suffix: suffix.into(),
        };
        self
    }

    /// The group of messages without a partition key on FIFO queues (default
    /// [`UnkeyedGroup::MessageId`]).
    #[must_use]
    pub fn with_unkeyed_group(mut self, group: UnkeyedGroup) -> Self {
        self.unkeyed_group = group;
        self
    }

    /// At most this many `SendMessageBatch` requests outstanding for the publisher,
    /// across all its concurrent calls (default [`DEFAULT_MAX_CONCURRENT_REQUESTS`], at
    /// most [`MAX_CONCURRENT_REQUESTS`]).
    #[must_use]
    pub fn with_max_concurrent_requests(mut self, max: usize) -> Self {
        self.max_concurrent_requests = max;
        self
    }

    /// How long one request may take before its messages are reported retryable
    /// (default [`DEFAULT_REQUEST_TIMEOUT`]). It bounds the SDK's own retries too.
    /// Requests to a FIFO queue are serial, so a call can take the number of its
    /// requests times this: keep it well under the relay's `publish_timeout`.
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The size limit checked before sending, per message and per request (default
    /// [`DEFAULT_MAX_MESSAGE_BYTES`]; between [`MIN_MESSAGE_BYTES`] and
    /// [`MAX_MESSAGE_BYTES`]). Set it to the queues' `MaximumMessageSize` when that is
    /// higher; a message SQS refuses for its size anyway is permanent.
    #[must_use]
    pub fn with_max_message_bytes(mut self, max: usize) -> Self {
        self.max_message_bytes = max;
        self
    }

    /// How destinations become queues.
    pub fn routing(&self) -> &Routing {
        &self.routing
    }

    /// The group of unkeyed messages on FIFO queues.
    pub fn unkeyed_group(&self) -> &UnkeyedGroup {
        &self.unkeyed_group
    }

    /// The bound on outstanding requests.
    pub fn max_concurrent_requests(&self) -> usize {
        self.max_concurrent_requests
    }

    /// The wait for one request.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The size limit per message and per request.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Check every setting.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a single-queue URL
    /// that is not `http(s)://`, a prefix or suffix holding characters no queue name
    /// may hold, a fixed unkeyed group that is not a valid `MessageGroupId`,
    /// `max_concurrent_requests` outside `1..=`[`MAX_CONCURRENT_REQUESTS`], a zero
    /// timeout, or `max_message_bytes` outside
    /// [`MIN_MESSAGE_BYTES`]`..=`[`MAX_MESSAGE_BYTES`].
    pub fn validate(&self) -> Result<()> {
        match &self.routing {
            Routing::SingleQueue { url } => {
                if !(url.starts_with("https://") || url.starts_with("http://"))
                    || url.chars().any(char::is_whitespace)
                {
                    return Err(Error::config(format!(
                        "the queue URL {url:?} is not an http(s) URL"
                    )));
                }
            }
            Routing::PerDestination { prefix, suffix } => {
                let suffix_core = suffix.strip_suffix(FIFO_SUFFIX).unwrap_or(suffix);
                for (what, part) in [("prefix", prefix.as_str()), ("suffix", suffix_core)] {
                    if let Some(c) = part.chars().find(|&c| !is_queue_name_char(c)) {
                        return Err(Error::config(format!(
                            "the queue {what} {part:?} holds {c:?}; queue names hold only \
                             letters, digits, '-' and '_' (and end in \".fifo\" for FIFO)"
                        )));
                    }
                }
            }
        }
        if let UnkeyedGroup::Fixed(group) = &self.unkeyed_group {
            check_group_id(group)
                .map_err(|why| Error::config(format!("the unkeyed group {group:?} {why}")))?;
        }
        if !(1..=MAX_CONCURRENT_REQUESTS).contains(&self.max_concurrent_requests) {
            return Err(Error::config(format!(
                "max_concurrent_requests is {}; it must be between 1 and \
                 {MAX_CONCURRENT_REQUESTS}",
                self.max_concurrent_requests
            )));
        }
        if self.request_timeout.is_zero() {
            return Err(Error::config("the request timeout must be above zero"));
        }
        if !(MIN_MESSAGE_BYTES..=MAX_MESSAGE_BYTES).contains(&self.max_message_bytes) {
            return Err(Error::config(format!(
                "max_message_bytes is {}; it must be between {MIN_MESSAGE_BYTES} and \
                 {MAX_MESSAGE_BYTES}",
                self.max_message_bytes
            )));
        }
        Ok(())
    }

    /// The name of the queue a message to `destination` goes to under
    /// [`Routing::PerDestination`]: `<prefix><destination><suffix>`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](outbox_core::ErrorKind::InvalidInput) when the name
    /// is not a valid queue name (empty, over [`MAX_QUEUE_NAME_LEN`] characters, a
    /// character other than letters, digits, `-` and `_` before an optional `.fifo`);
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) under
    /// [`Routing::SingleQueue`], which names no queue per destination.
    pub fn queue_name_for(&self, destination: &str) -> Result<String> {
        let Routing::PerDestination { prefix, suffix } = &self.routing else {
            return Err(Error::config(
                "a single-queue publisher has no queue name per destination",
            ));
        };
        let name = format!("{prefix}{destination}{suffix}");
        check_queue_name(&name).map_err(|why| {
            Error::invalid_input(format!(
                "destination {destination:?} gives the queue name {name:?}, which {why}"
            ))
        })?;
        Ok(name)
    }
}

fn is_queue_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// Why `name` is not a valid SQS queue name, if it is not.
pub(crate) fn check_queue_name(name: &str) -> std::result::Result<(), &'static str> {
    let core = name.strip_suffix(FIFO_SUFFIX).unwrap_or(name);
    if core.is_empty() {
        return Err("is empty");
    }
    if name.len() > MAX_QUEUE_NAME_LEN {
        return Err("is over 80 characters");
    }
    if !core.chars().all(is_queue_name_char) {
        return Err("holds a character other than letters, digits, '-' and '_' (before an optional \".fifo\")");
    }
    Ok(())
}

/// Why `id` is not a valid `MessageGroupId`, if it is not: 1 to 128 characters, each
/// a letter, a digit or ASCII punctuation.
pub(crate) fn check_group_id(id: &str) -> std::result::Result<(), &'static str> {
    if id.is_empty() {
        return Err("is empty");
    }
    if id.len() > MAX_GROUP_ID_LEN {
        return Err("is over 128 characters");
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c.is_ascii_punctuation())
    {
        return Err("holds a character other than ASCII letters, digits and punctuation");
    }
    Ok(())
}

/// Whether the queue at `url` (or named `name`) is FIFO: its name ends in `.fifo`.
pub(crate) fn is_fifo(url_or_name: &str) -> bool {
    url_or_name.trim_end_matches('/').ends_with(FIFO_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::ErrorKind;

    #[test]
    fn queue_names_map_from_destinations() {
        let plain = SqsPublisherConfig::new();
        assert_eq!(plain.queue_name_for("orders").unwrap(), "orders");
        let named = plain.with_queue_prefix("app-").with_queue_suffix(".fifo");
        assert_eq!(named.queue_name_for("orders").unwrap(), "app-orders.fifo");
        assert_eq!(
            named
                .clone()
                .with_queue_prefix("x_")
                .queue_name_for("a")
                .unwrap(),
            "x_a.fifo",
            "a new prefix keeps the suffix"
        );
        let long = "a".repeat(76);
        assert!(named.queue_name_for(&long).is_err(), "81 characters");
        assert!(SqsPublisherConfig::new()
            .queue_name_for(&"a".repeat(80))
            .is_ok());
        for bad in ["", "a.b", "a b", "orders.created", "é", "a/b"] {
            let err = SqsPublisherConfig::new().queue_name_for(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad:?}");
        }
        let single = SqsPublisherConfig::new().with_single_queue("http://h/1/q");
        assert_eq!(
            single.queue_name_for("a").unwrap_err().kind(),
            ErrorKind::Config
        );
    }

    #[test]
    fn fifo_is_told_by_the_name() {
        assert!(is_fifo("orders.fifo"));
        assert!(is_fifo("https://sqs.eu-west-1.amazonaws.com/1/orders.fifo"));
        assert!(is_fifo("http://127.0.0.1:4566/1/orders.fifo/"));
        assert!(!is_fifo("https://sqs.eu-west-1.amazonaws.com/1/orders"));
        assert!(!is_fifo("fifo"));
    }

    #[test]
    fn group_ids_are_checked() {
        assert!(check_group_id("order-42").is_ok());
        assert!(check_group_id("a!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~z").is_ok());
        assert!(check_group_id(&"k".repeat(128)).is_ok());
        for bad in ["", "a b", "é", "a\tb"] {
            assert!(check_group_id(bad).is_err(), "{bad:?}");
        }
        assert!(check_group_id(&"k".repeat(129)).is_err());
    }

    #[test]
    fn validate_checks_every_setting() {
        let ok = SqsPublisherConfig::new();
        ok.validate().unwrap();
        ok.clone()
            .with_single_queue("https://sqs.us-east-1.amazonaws.com/1/q")
            .validate()
            .unwrap();
        let bad = [
            ok.clone().with_single_queue("sqs://q"),
            ok.clone().with_single_queue("http://h/ q"),
            ok.clone().with_queue_prefix("a.b"),
            ok.clone().with_queue_suffix(".fif"),
            ok.clone()
                .with_unkeyed_group(UnkeyedGroup::Fixed(String::new())),
            ok.clone()
                .with_unkeyed_group(UnkeyedGroup::Fixed("a b".into())),
            ok.clone().with_max_concurrent_requests(0),
            ok.clone()
                .with_max_concurrent_requests(MAX_CONCURRENT_REQUESTS + 1),
            ok.clone().with_request_timeout(Duration::ZERO),
            ok.clone().with_max_message_bytes(MIN_MESSAGE_BYTES - 1),
            ok.clone().with_max_message_bytes(MAX_MESSAGE_BYTES + 1),
        ];
        for config in bad {
            assert_eq!(
                config.validate().unwrap_err().kind(),
                ErrorKind::Config,
                "{config:?}"
            );
        }
        ok.clone().with_queue_suffix(".fifo").validate().unwrap();
        ok.with_max_message_bytes(MAX_MESSAGE_BYTES)
            .validate()
            .unwrap();
    }
}
