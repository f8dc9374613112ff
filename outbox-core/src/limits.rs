//! What a message may hold: [`MessageLimits`], checked before anything is written and
//! again on rows other tools wrote.

use std::time::Duration;

#[cfg(feature = "serde")]
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::headers::Headers;
use crate::message::NewMessage;

/// Size limits checked before anything is written.
///
/// The defaults suit most brokers; lower `max_payload_bytes` to match yours (for example
/// NATS's default 1 MiB, SQS's 256 KiB).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(Serialize, Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct MessageLimits {
    /// Longest destination, in bytes. Default 255.
    pub max_destination_len: usize,
    /// Longest partition key, in bytes. Default 255.
    pub max_partition_key_len: usize,
    /// Largest payload, in bytes. Default 1 MiB.
    pub max_payload_bytes: usize,
    /// Most headers on one message. Default 64.
    pub max_headers: usize,
    /// Longest header name, in bytes. Default 128.
    pub max_header_name_len: usize,
    /// Longest header value, in bytes. Default 4096.
    pub max_header_value_len: usize,
}

impl Default for MessageLimits {
    fn default() -> Self {
        MessageLimits {
            max_destination_len: 255,
            max_partition_key_len: 255,
            max_payload_bytes: 1024 * 1024,
            max_headers: 64,
            max_header_name_len: 128,
            max_header_value_len: 4096,
        }
    }
}

impl MessageLimits {
    /// Set the largest payload accepted.
    #[must_use]
    pub fn with_max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Check a message against these limits; the error names the first violation.
    ///
    /// A message built with these same limits (the default path: a
    /// [`NewMessageBuilder`](crate::NewMessageBuilder) and a store both on the defaults) was checked when it was
    /// built and passes at once, so a message is validated once, not at build and again
    /// at enqueue.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) naming the first
    /// broken rule.
    pub fn check(&self, msg: &NewMessage) -> Result<()> {
        if msg.checked_with() == self {
            return Ok(());
        }
        self.check_fields(msg)
    }

    pub(crate) fn check_fields(&self, msg: &NewMessage) -> Result<()> {
        if msg.delay() > MAX_DELAY {
            return Err(Error::invalid_input(format!(
                "a delay of {:?} exceeds the limit of {MAX_DELAY:?}",
                msg.delay()
            )));
        }
        self.check_content(
            msg.destination(),
            msg.partition_key(),
            msg.payload().len(),
            msg.content_type(),
            msg.headers(),
        )
    }

    pub(crate) fn check_content(
        &self,
        destination: &str,
        partition_key: Option<&str>,
        payload_len: usize,
        content_type: Option<&str>,
        headers: &Headers,
    ) -> Result<()> {
        check_text("destination", destination, self.max_destination_len)?;
        if let Some(key) = partition_key {
            check_text("partition key", key, self.max_partition_key_len)?;
        }
        if payload_len > self.max_payload_bytes {
            return Err(Error::invalid_input(format!(
                "payload of {payload_len} bytes exceeds the limit of {} bytes",
                self.max_payload_bytes
            )));
        }
        if let Some(ct) = content_type {
            check_text("content type", ct, self.max_header_value_len)?;
        }
        self.check_headers(headers)
    }

    /// Check a header map against these limits.
    pub fn check_headers(&self, headers: &Headers) -> Result<()> {
        if headers.len() > self.max_headers {
            return Err(Error::invalid_input(format!(
                "{} headers exceed the limit of {}",
                headers.len(),
                self.max_headers
            )));
        }
        for (name, value) in headers.iter() {
            check_header_name(name, self.max_header_name_len)?;
            check_header_value(name, value, self.max_header_value_len)?;
        }
        Ok(())
    }
}

/// Longest delay a message may be enqueued with: about ten years. Every backend can
/// represent `now + MAX_DELAY`.
pub const MAX_DELAY: Duration = Duration::from_secs(3650 * 24 * 60 * 60);

/// A destination under the default limits (for filters naming one).
pub(crate) fn check_destination(destination: &str) -> Result<()> {
    check_text(
        "destination",
        destination,
        MessageLimits::default().max_destination_len,
    )
}

fn check_text(what: &str, value: &str, max: usize) -> Result<()> {
    if value.trim().is_empty() {
        return Err(Error::invalid_input(format!("{what} is empty")));
    }
    if value.len() > max {
        return Err(Error::invalid_input(format!(
            "{what} of {} bytes exceeds the limit of {max} bytes",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid_input(format!(
            "{what} {value:?} contains a control character"
        )));
    }
    Ok(())
}

/// Header names are HTTP tokens (RFC 9110 `tchar`), so they survive every broker's
/// header model (AMQP tables, NATS and Kafka headers).
fn check_header_name(name: &str, max: usize) -> Result<()> {
    let valid_char = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > max || !name.bytes().all(valid_char) {
        return Err(Error::invalid_input(format!(
            "header name {name:?} must be 1 to {max} token characters (letters, digits, !#$%&'*+-.^_`|~)"
        )));
    }
    Ok(())
}

fn check_header_value(name: &str, value: &str, max: usize) -> Result<()> {
    if value.len() > max {
        return Err(Error::invalid_input(format!(
            "header {name:?} value of {} bytes exceeds the limit of {max} bytes",
            value.len()
        )));
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(Error::invalid_input(format!(
            "header {name:?} value contains a control character"
        )));
    }
    Ok(())
}
