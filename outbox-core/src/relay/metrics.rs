//! Metric names the relay reports through the [`metrics`] facade.
//!
//! Every series carries a `relay` label with [`RelayConfig::name`](super::RelayConfig).
//! Install a `metrics` recorder (Prometheus, StatsD, ...) **before** creating relays:
//! a relay takes its metric handles when it is created. Call
//! [`describe_metrics`](crate::monitor::describe_metrics) once for help text and units.

use ::metrics::{Counter, Histogram};

use super::DispatchReport;

/// Counter: messages published and completed.
pub const DISPATCHED: &str = "outbox_messages_dispatched_total";
/// Counter: failed attempts scheduled for retry.
pub const RETRIED: &str = "outbox_messages_retried_total";
/// Counter: messages dead-lettered.
pub const DEAD_LETTERED: &str = "outbox_messages_dead_lettered_total";
/// Counter: messages whose lease was gone when the relay settled them (the publish may
/// repeat elsewhere).
pub const LEASES_LOST: &str = "outbox_leases_lost_total";
/// Counter: leases given back unattempted (shutdown, or too little lease left to
/// publish safely).
pub const RELEASED: &str = "outbox_messages_released_total";
/// Counter: storage errors in the relay (failed claims and settles).
pub const STORE_ERRORS: &str = "outbox_store_errors_total";
/// Counter: panics caught in the relay (in a claim, a publish, a batch).
pub const PANICS: &str = "outbox_relay_panics_total";
/// Histogram, seconds: how long a claim call took.
pub const CLAIM_SECONDS: &str = "outbox_claim_duration_seconds";
/// Histogram, seconds: from the message's `created_at` (the enqueuing transaction's
/// start, by the storage clock) to the broker accepting it, by the relay's clock. It
/// includes any enqueue delay and retry backoff, and clock skew between the two hosts.
pub const COMMIT_TO_PUBLISH_SECONDS: &str = "outbox_commit_to_publish_seconds";

/// The handles one relay records through, labelled once at creation.
#[derive(Debug, Clone)]
pub(crate) struct Handles {
    pub(crate) dispatched: Counter,
    pub(crate) retried: Counter,
    pub(crate) dead_lettered: Counter,
    pub(crate) leases_lost: Counter,
    pub(crate) released: Counter,
    pub(crate) store_errors: Counter,
    pub(crate) panics: Counter,
    pub(crate) claim_seconds: Histogram,
}

impl Handles {
    pub(crate) fn new(relay: &str) -> Self {
        let label = || ("relay", relay.to_owned());
        Handles {
            dispatched: ::metrics::counter!(DISPATCHED, &[label()]),
            retried: ::metrics::counter!(RETRIED, &[label()]),
            dead_lettered: ::metrics::counter!(DEAD_LETTERED, &[label()]),
            leases_lost: ::metrics::counter!(LEASES_LOST, &[label()]),
            released: ::metrics::counter!(RELEASED, &[label()]),
            store_errors: ::metrics::counter!(STORE_ERRORS, &[label()]),
            panics: ::metrics::counter!(PANICS, &[label()]),
            claim_seconds: ::metrics::histogram!(CLAIM_SECONDS, &[label()]),
        }
    }
}

impl Handles {
    /// Count what a report adds.
    pub(crate) fn add(&self, r: &DispatchReport) {
        self.dispatched.increment(r.dispatched);
        self.retried.increment(r.retried);
        self.dead_lettered.increment(r.dead_lettered);
        self.leases_lost.increment(r.leases_lost);
        self.released.increment(r.released);
        self.store_errors.increment(r.store_errors);
        self.panics.increment(r.panics);
    }
}
