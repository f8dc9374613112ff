//! The relay's metrics: names, and the handles a relay registers when it is made.
//!
//! What both relays do (publish, retry, dead-letter, catch a panic, the commit to
//! publish latency) is counted under the polling relay's names
//! ([`outbox_core::relay::metrics`]), labelled `relay` with the slot's name, so one
//! dashboard and one alert serve both; what only this relay has (the slot's lag, its
//! reconnects) is named here, labelled `slot`.

use std::time::SystemTime;

use metrics::{counter, describe_counter, describe_gauge, gauge, Counter, Gauge, Unit};
use outbox_core::relay::metrics::{DEAD_LETTERED, DISPATCHED, PANICS, RETRIED};

/// Gauge, bytes: log between the server's current position and the slot's confirmed
/// position (label `slot`).
pub const SLOT_LAG_BYTES: &str = "outbox_wal_slot_lag_bytes";
/// Gauge, seconds: age of the oldest committed message the relay has read but not yet
/// settled, 0 when it is caught up (label `slot`).
pub const SLOT_LAG_SECONDS: &str = "outbox_wal_slot_lag_seconds";
/// Counter: stream sessions ended by an error and resumed (label `slot`).
pub const RECONNECTS: &str = "outbox_wal_reconnects_total";

/// Describe the metrics named in this crate (help text and unit) to the installed
/// `metrics` recorder; `outbox_core::monitor::describe_metrics` describes the shared
/// ones. Call both once after installing the recorder.
pub fn describe_metrics() {
    describe_gauge!(
        SLOT_LAG_BYTES,
        Unit::Bytes,
        "Log between the server's current position and the slot's confirmed position."
    );
    describe_gauge!(
        SLOT_LAG_SECONDS,
        Unit::Seconds,
        "Age of the oldest committed message read but not yet published or dead-lettered."
    );
    describe_counter!(
        RECONNECTS,
        Unit::Count,
        "Stream sessions ended by an error and resumed."
    );
}

/// One relay's handles, labelled with its slot. They are registered with the recorder
/// installed when the relay is made (as `outbox_core`'s relay does), so nothing is
/// looked up per message.
#[derive(Debug, Clone)]
pub(crate) struct Meters {
    lag_bytes: Gauge,
    lag_seconds: Gauge,
    /// The shared `outbox_messages_dispatched_total`: published and settled.
    pub(crate) dispatched: Counter,
    pub(crate) retried: Counter,
    pub(crate) dead_lettered: Counter,
    pub(crate) panics: Counter,
    pub(crate) reconnects: Counter,
}

impl Meters {
    pub(crate) fn new(slot: &str) -> Self {
        let slot = slot.to_owned();
        Meters {
            lag_bytes: gauge!(SLOT_LAG_BYTES, "slot" => slot.clone()),
            lag_seconds: gauge!(SLOT_LAG_SECONDS, "slot" => slot.clone()),
            dispatched: counter!(DISPATCHED, "relay" => slot.clone()),
            retried: counter!(RETRIED, "relay" => slot.clone()),
            dead_lettered: counter!(DEAD_LETTERED, "relay" => slot.clone()),
            panics: counter!(PANICS, "relay" => slot.clone()),
            reconnects: counter!(RECONNECTS, "slot" => slot),
        }
    }

    /// Set the bytes gauge when the slot's row was read (a standby sets only this).
    pub(crate) fn lag_bytes(&self, bytes: Option<u64>) {
        if let Some(bytes) = bytes {
            #[allow(clippy::cast_precision_loss)] // a gauge: f64 is what it takes
            self.lag_bytes.set(bytes as f64);
        }
    }

    /// Set both gauges: `bytes` as [`lag_bytes`](Self::lag_bytes), and the age of
    /// `oldest` (the oldest message read but not settled; none: caught up, 0 s).
    pub(crate) fn lag(&self, bytes: Option<u64>, oldest: Option<SystemTime>) {
        self.lag_bytes(bytes);
        let age = oldest
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .unwrap_or_default();
        self.lag_seconds.set(age.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_described() {
        let recorder = outbox_testkit::TestRecorder::default();
        metrics::with_local_recorder(&recorder, describe_metrics);
        for name in [SLOT_LAG_BYTES, SLOT_LAG_SECONDS, RECONNECTS] {
            assert!(recorder.is_described(name), "{name} has no description");
        }
    }
}
