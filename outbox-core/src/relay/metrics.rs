//! Metric names the relay reports through the [`metrics`] facade.
//!
//! Every series carries a `relay` label with [`RelayConfig::name`](super::RelayConfig).
//! Install any `metrics` recorder (Prometheus, StatsD, ...) to export them.

/// Counter: messages published and completed.
pub const DISPATCHED: &str = "outbox_messages_dispatched_total";
/// Counter: failed attempts scheduled for retry.
pub const RETRIED: &str = "outbox_messages_retried_total";
/// Counter: messages dead-lettered.
pub const DEAD_LETTERED: &str = "outbox_messages_dead_lettered_total";
/// Counter: settle calls that found the lease gone (the publish may repeat elsewhere).
pub const LEASES_LOST: &str = "outbox_leases_lost_total";
/// Counter: leases given back unattempted (shutdown).
pub const RELEASED: &str = "outbox_messages_released_total";
/// Counter: storage errors in the relay loop.
pub const STORE_ERRORS: &str = "outbox_store_errors_total";
/// Histogram, seconds: how long a claim call took.
pub const CLAIM_SECONDS: &str = "outbox_claim_duration_seconds";
/// Histogram, seconds: from the enqueuing commit to the broker accepting the message.
pub const COMMIT_TO_PUBLISH_SECONDS: &str = "outbox_commit_to_publish_seconds";
