//! [`TestRecorder`]: a `metrics` recorder that keeps counters, gauges, histogram sample
//! counts and descriptions in memory, for tests of what a relay or a store records.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

/// Keeps every counter and gauge by name and labels, the number of samples each
/// histogram got (not their values), and every described name.
///
/// Handles are registered with the recorder installed when they are made: relays take
/// theirs when constructed, so construct them inside
/// `metrics::with_local_recorder(&recorder, || ...)` and read the values afterwards.
#[derive(Debug, Default)]
pub struct TestRecorder {
    values: Mutex<HashMap<String, Arc<AtomicU64>>>,
    samples: Mutex<HashMap<String, Arc<SampleCount>>>,
    described: Mutex<HashSet<String>>,
}

/// A histogram that counts its samples.
#[derive(Debug, Default)]
struct SampleCount(AtomicU64);

impl HistogramFn for SampleCount {
    fn record(&self, _value: f64) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// `name{label=value,...}`, the key every map here uses.
fn key_text(key: &Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl TestRecorder {
    fn slot(&self, key: &Key) -> Arc<AtomicU64> {
        Arc::clone(self.lock_values().entry(key_text(key)).or_default())
    }

    fn lock_samples(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<SampleCount>>> {
        self.samples.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many samples the histogram `name` with `labels` got, 0 when never
    /// registered.
    pub fn samples(&self, name: &str, labels: &str) -> u64 {
        self.lock_samples()
            .get(&format!("{name}{{{labels}}}"))
            .map_or(0, |h| h.0.load(Ordering::Relaxed))
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
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::clone(
            self.lock_samples().entry(key_text(key)).or_default(),
        ))
    }
}
