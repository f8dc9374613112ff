//! The outbox's settings: [`ToyOutboxConfig`].

use std::time::Duration;

use outbox_core::{Error, KeyOrder, MessageLimits, Result, Retention};

/// How a [`ToyOutbox`](crate::ToyOutbox) orders, keeps and bounds its messages.
#[derive(Debug, Clone, Default)]
pub struct ToyOutboxConfig {
    ordering: KeyOrder,
    retention: Retention,
    limits: MessageLimits,
}

impl ToyOutboxConfig {
    /// Keep per-key order or not.
    #[must_use]
    pub fn with_ordering(mut self, ordering: KeyOrder) -> Self {
        self.ordering = ordering;
        self
    }

    /// Delete or keep what was dispatched.
    #[must_use]
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// The limits enqueued messages are checked against.
    #[must_use]
    pub fn with_limits(mut self, limits: MessageLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The ordering.
    pub fn ordering(&self) -> KeyOrder {
        self.ordering
    }

    /// The retention.
    pub fn retention(&self) -> Retention {
        self.retention
    }

    /// The message limits.
    pub fn limits(&self) -> &MessageLimits {
        &self.limits
    }

    /// Check the settings, as every backend's config does before anything is made.
    ///
    /// # Errors
    /// [`ErrorKind::Config`](outbox_core::ErrorKind::Config) for a `Keep` window of zero.
    pub fn validate(&self) -> Result<()> {
        match self.retention {
            Retention::Keep { window } if window == Duration::ZERO => {
                Err(Error::config("a kept history needs a window above zero"))
            }
            _ => Ok(()),
        }
    }
}
