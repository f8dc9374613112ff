//! [`TestRecorder`]: a `metrics` recorder that keeps counters, gauges and descriptions
//! in memory, for tests of what a relay or a store records.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// Keeps every counter and gauge by name and labels, and every described name.
/// Histograms are dropped.
///
/// Handles are registered with the recorder installed when they are made: relays take
/// theirs when constructed, so construct them inside
/// `metrics::with_local_recorder(&recorder, || ...)` and read the values afterwards.
#[derive(Debug, Default)]
pub struct TestRecorder {
    values: Mutex<HashMap<String, Arc<AtomicU64>>>,
    described: Mutex<HashSet<String>>,
}

impl TestRecorder {
    fn slot(&self, key: &Key) -> Arc<AtomicU64> {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        Arc::clone(self.lock_values().entry(name).or_default())
    }

    fn lock_values(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<AtomicU64>>> {
        self.values.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self, name: &str, labels: &str) -> Option<Arc<AtomicU64>> {
        self.lock_values()
            .get(&format!("{name}{{{labels}}}"))
            .cloned()
    }

    /// The counter `name` with `labels` (`"relay=a"`, several joined by commas in
    /// registration order), 0 when never registered.
    pub fn counter(&self, name: &str, labels: &str) -> u64 {
        self.read(name, labels)
            .map_or(0, |v| v.load(Ordering::Relaxed))
    }

    /// The gauge `name` with `labels`, `None` when never registered.
    pub fn gauge(&self, name: &str, labels: &str) -> Option<f64> {
        self.read(name, labels)
            .map(|v| f64::from_bits(v.load(Ordering::Relaxed)))
    }

    /// Whether `name` was described (given help text).
    pub fn is_described(&self, name: &str) -> bool {
        self.described
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(name)
    }

    fn describe(&self, key: KeyName) {
        self.described
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.as_str().to_owned());
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.describe(key);
    }
    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.describe(key);
    }
    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.describe(key);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.slot(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.slot(key))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
