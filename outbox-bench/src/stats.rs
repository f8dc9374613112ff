//! Medians, percentiles, and a rate with the CPU it cost.

use std::future::Future;
use std::time::{Duration, Instant};

use outbox_testkit::cpu::{self, Server};

/// The median of `values`: the middle one, the mean of the two middle ones for an
/// even count, NaN for none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The value whose `key` is the median of `values` (the upper of the two middle ones
/// for an even count), `None` for none: the median run, with its other figures.
pub fn median_by<T: Copy>(values: &[T], key: impl Fn(&T) -> f64) -> Option<T> {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| key(a).total_cmp(&key(b)));
    sorted.get(sorted.len() / 2).copied()
}

/// The nearest-rank percentile of a sorted, non-empty sample, `per_mille` in
/// thousandths (500: the median, 990: p99, 1000: the maximum).
///
/// # Panics
///
/// When `sorted` is empty.
pub fn percentile<T: Copy>(sorted: &[T], per_mille: usize) -> T {
    let rank = (sorted.len() * per_mille).div_ceil(1000).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

/// A duration in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

/// A rate (units per second) and the CPU each unit cost: this process (with the
/// children it waited for) and the server's processes, from [`outbox_testkit::cpu`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    /// Units (messages, transactions) per second.
    pub rate: f64,
    /// CPU microseconds per unit of this process.
    pub client_us: f64,
    /// CPU microseconds per unit of the server's processes.
    pub server_us: f64,
}

impl Figure {
    /// `units` in `elapsed`, having spent `spent`.
    pub fn of(units: u64, elapsed: Duration, spent: cpu::Spent) -> Figure {
        let (client_us, server_us) = spent.per(units);
        Figure {
            rate: units as f64 / elapsed.as_secs_f64(),
            client_us,
            server_us,
        }
    }

    /// Time `work`, which handles `units` things, and read the CPU of this process and
    /// of `server` around it.
    pub async fn measure<E>(
        units: u64,
        server: Server,
        work: impl Future<Output = Result<(), E>>,
    ) -> Result<Figure, E> {
        let before = cpu::sample(server);
        let started = Instant::now();
        work.await?;
        let elapsed = started.elapsed();
        Ok(Figure::of(units, elapsed, cpu::since(before)))
    }
}
