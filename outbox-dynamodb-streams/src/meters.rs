//! The relay's metrics. What every relay does (publish, retry, dead-letter, catch a
//! panic, the commit-to-publish latency) is counted under the polling relay's names
//! ([`outbox_core::relay::metrics`]) labelled `relay` with the relay's name; what only
//! this relay has is named here.

use metrics::{counter, describe_counter, describe_gauge, gauge, Counter, Gauge, Unit};
use outbox_core::relay::metrics::{DEAD_LETTERED, DISPATCHED, PANICS, RETRIED};

/// Gauge, seconds: how far a shard's reader is behind, the age of the last record it
/// read (0 once a read comes back empty). Labels `relay`, `shard`.
pub const ITERATOR_AGE_SECONDS: &str = "outbox_dynamodb_stream_iterator_age_seconds";
/// Counter: stream records read, messages and skipped records alike (label `relay`).
pub const RECORDS_READ: &str = "outbox_dynamodb_stream_records_read_total";
/// Gauge: shard leases this worker holds (label `relay`).
pub const SHARDS_OWNED: &str = "outbox_dynamodb_stream_shards_owned";

/// Describe the metrics named in this crate (help text and unit) to the installed
/// `metrics` recorder; `outbox_core::monitor::describe_metrics` describes the shared
/// ones.
pub fn describe_metrics() {
    describe_gauge!(
        ITERATOR_AGE_SECONDS,
        Unit::Seconds,
        "Age of the last record a shard's reader read; 0 when it is caught up."
    );
    describe_counter!(RECORDS_READ, Unit::Count, "Stream records read.");
    describe_gauge!(SHARDS_OWNED, Unit::Count, "Shard leases this worker holds.");
}

/// One relay's handles, registered when it is made.
#[derive(Debug, Clone)]
pub(crate) struct Meters {
    relay: String,
    pub(crate) dispatched: Counter,
    pub(crate) retried: Counter,
    pub(crate) dead_lettered: Counter,
    pub(crate) panics: Counter,
    pub(crate) records_read: Counter,
    pub(crate) shards_owned: Gauge,
}

impl Meters {
    pub(crate) fn new(relay: &str) -> Self {
        let r = relay.to_owned();
        Meters {
            dispatched: counter!(DISPATCHED, "relay" => r.clone()),
            retried: counter!(RETRIED, "relay" => r.clone()),
            dead_lettered: counter!(DEAD_LETTERED, "relay" => r.clone()),
            panics: counter!(PANICS, "relay" => r.clone()),
            records_read: counter!(RECORDS_READ, "relay" => r.clone()),
            shards_owned: gauge!(SHARDS_OWNED, "relay" => r.clone()),
            relay: r,
        }
    }

    /// The iterator-age gauge of `shard`.
    pub(crate) fn iterator_age(&self, shard: &str) -> Gauge {
        gauge!(ITERATOR_AGE_SECONDS, "relay" => self.relay.clone(), "shard" => shard.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_described() {
        let recorder = outbox_testkit::TestRecorder::default();
        metrics::with_local_recorder(&recorder, describe_metrics);
        for name in [ITERATOR_AGE_SECONDS, RECORDS_READ, SHARDS_OWNED] {
            assert!(recorder.is_described(name), "{name} has no description");
        }
    }
}
