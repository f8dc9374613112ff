//! Exporting an outbox's state as gauges: [`StatsReporter`], and help text for every
//! metric this crate records ([`describe_metrics`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
use tokio::task::JoinHandle;

use crate::admin::{OutboxAdmin, OutboxStats};
use crate::error::Result;
use crate::relay::metrics as names;

/// Gauge: messages waiting to be claimed (due now or later).
pub const PENDING: &str = "outbox_pending_messages";
/// Gauge: messages held by a live lease.
pub const IN_FLIGHT: &str = "outbox_in_flight_messages";
/// Gauge: dead letters.
pub const DEAD: &str = "outbox_dead_letters";
/// Gauge: dispatched messages kept as history.
pub const DISPATCHED_KEPT: &str = "outbox_dispatched_kept_messages";
/// Gauge, seconds: age of the oldest undelivered message (0 when there is none).
pub const OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";
/// Counter: failed reads of the stats.
pub const STATS_ERRORS: &str = "outbox_stats_errors_total";

/// Describe every metric of this crate (help text and unit) to the installed `metrics`
/// recorder. Call once after installing the recorder; exporters such as Prometheus
/// print the text as `# HELP`.
pub fn describe_metrics() {
    describe_counter!(
        names::DISPATCHED,
        Unit::Count,
        "Messages published and completed."
    );
    describe_counter!(
        names::RETRIED,
        Unit::Count,
        "Failed attempts scheduled for retry."
    );
    describe_counter!(names::DEAD_LETTERED, Unit::Count, "Messages dead-lettered.");
    describe_counter!(
        names::LEASES_LOST,
        Unit::Count,
        "Settles rejected because the lease was gone; the publish may repeat elsewhere."
    );
    describe_counter!(
        names::RELEASED,
        Unit::Count,
        "Leases given back unattempted (shutdown, or too little lease left to publish)."
    );
    describe_counter!(
        names::STORE_ERRORS,
        Unit::Count,
        "Storage errors met by relays (claims and settles)."
    );
    describe_counter!(
        names::PANICS,
        Unit::Count,
        "Panics caught in a relay (a claim, a batch); the relay carried on."
    );
    describe_histogram!(
        names::CLAIM_SECONDS,
        Unit::Seconds,
        "Duration of claim calls."
    );
    describe_histogram!(
        names::COMMIT_TO_PUBLISH_SECONDS,
        Unit::Seconds,
        "From a message's creation (storage clock) to the broker accepting it."
    );
    describe_gauge!(PENDING, Unit::Count, "Messages waiting to be claimed.");
    describe_gauge!(IN_FLIGHT, Unit::Count, "Messages held by a live lease.");
    describe_gauge!(DEAD, Unit::Count, "Dead-lettered messages.");
    describe_gauge!(
        DISPATCHED_KEPT,
        Unit::Count,
        "Dispatched messages kept as history."
    );
    describe_gauge!(
        OLDEST_PENDING_AGE,
        Unit::Seconds,
        "Age of the oldest undelivered message; 0 when none."
    );
    describe_counter!(
        STATS_ERRORS,
        Unit::Count,
        "Failed reads of the outbox stats."
    );
}

/// Reads an outbox's [`OutboxStats`] every interval and sets them as gauges labelled
/// `outbox = <name>`.
///
/// One reporter per outbox is enough (the counts are the table's, not a process's).
/// Each read costs what the backend's `stats` costs: on the SQL backends a few index
/// scans, but on DynamoDB a read of every undelivered message's `due` index entry and
/// every dead letter (about 25,000 read units per call at a backlog of a million), so
/// there run one reporter per table, not one per instance, and consider a longer
/// [interval](Self::with_interval).
///
/// ```no_run
/// # use std::sync::Arc;
/// # use outbox_core::{OutboxAdmin, StatsReporter};
/// # async fn demo(admin: Arc<dyn OutboxAdmin>, shutdown: tokio_util::sync::CancellationToken) {
/// let reporter = StatsReporter::new(admin, "orders").spawn(shutdown.cancelled_owned());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct StatsReporter {
    admin: Arc<dyn OutboxAdmin>,
    name: String,
    interval: Duration,
}

impl StatsReporter {
    /// Report `admin`'s stats under the label `outbox = name`, every 15 s.
    pub fn new(admin: Arc<dyn OutboxAdmin>, name: impl Into<String>) -> Self {
        StatsReporter {
            admin,
            name: name.into(),
            interval: Duration::from_secs(15),
        }
    }

    /// Report every `interval` instead (at least 1 ms).
    #[must_use]
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Read the stats once and set the gauges.
    ///
    /// # Errors
    /// The store's error; the gauges keep their last values.
    pub async fn report_once(&self) -> Result<OutboxStats> {
        let stats = self.admin.stats().await?;
        let label = [("outbox", self.name.clone())];
        // Counts are far below 2^53, where f64 stops being exact.
        #[allow(clippy::cast_precision_loss)]
        let count = |n: u64| n as f64;
        metrics::gauge!(PENDING, &label).set(count(stats.pending));
        metrics::gauge!(IN_FLIGHT, &label).set(count(stats.in_flight));
        metrics::gauge!(DEAD, &label).set(count(stats.dead));
        metrics::gauge!(DISPATCHED_KEPT, &label).set(count(stats.dispatched));
        metrics::gauge!(OLDEST_PENDING_AGE, &label)
            .set(stats.oldest_pending_age.unwrap_or_default().as_secs_f64());
        Ok(stats)
    }

    /// Report every interval in a new task until `shutdown` resolves. Errors are logged
    /// with their causes and counted; the next tick tries again.
    pub fn spawn(self, shutdown: impl Future<Output = ()> + Send + 'static) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut shutdown = std::pin::pin!(shutdown);
            let mut tick = tokio::time::interval(self.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = &mut shutdown => break,
                    _ = tick.tick() => {}
                }
                if let Err(err) = self.report_once().await {
                    tracing::warn!(outbox = %self.name, error = %err.report(), "reading outbox stats failed");
                    metrics::counter!(STATS_ERRORS, "outbox" => self.name.clone()).increment(1);
                }
            }
        })
    }
}
