//! Consumed capacity and refused conditional writes, as DynamoDB reports them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::ConsumedCapacity;

/// Capacity units are kept in millionths, so the atomics stay integers.
const MICRO: f64 = 1_000_000.0;
/// One capacity unit as the counters hold it.
pub(crate) const UNIT: u64 = 1_000_000;

/// A counter of capacity units as DynamoDB reports them (`ReturnConsumedCapacity =
/// TOTAL`), kept in millionths so it stays an integer atomic.
#[derive(Debug, Default)]
pub struct CapacityCounter(AtomicU64);

impl CapacityCounter {
    /// Add what one request consumed (nothing when it reported nothing).
    pub fn add(&self, consumed: Option<&ConsumedCapacity>) {
        Metrics::add(&self.0, consumed);
    }

    /// The units counted so far.
    pub fn units(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)] // far below 2^53 millionths
        let units = self.0.load(Ordering::Relaxed) as f64 / MICRO;
        units
    }
}

/// Counters shared by a store and its clones.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) enqueue_units: AtomicU64,
    pub(crate) enqueued: AtomicU64,
    pub(crate) claim_read_units: AtomicU64,
    pub(crate) claim_write_units: AtomicU64,
    pub(crate) body_read_units: AtomicU64,
    pub(crate) claimed: AtomicU64,
    pub(crate) settle_units: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) bodies_renewed: AtomicU64,
    pub(crate) renewal_units: AtomicU64,
    pub(crate) sweep_budget_waits: AtomicU64,
    pub(crate) sweep_errors: AtomicU64,
    pub(crate) claim_errors: AtomicU64,
    pub(crate) settle_errors: AtomicU64,
    pub(crate) admin_units: AtomicU64,
    pub(crate) upkeep_units: AtomicU64,
    /// Shared with the store client's throttle counter.
    pub(crate) throttles: Arc<crate::throttles::Throttles>,
    /// Gauges of the sweeps: how long the oldest due message had waited, plus one
    /// (microseconds, 0 for none), and when the stalest shard's last completed pass
    /// began (0 for never).
    pub(crate) oldest_due_age_us: AtomicU64,
    pub(crate) swept_us: AtomicU64,
}

impl Metrics {
    pub(crate) fn add(slot: &AtomicU64, c: Option<&ConsumedCapacity>) {
        if let Some(units) = c.and_then(ConsumedCapacity::capacity_units) {
            let micro = (units.max(0.0) * MICRO).round();
            // Non-negative and far below u64::MAX for any real request.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            slot.fetch_add(micro as u64, Ordering::Relaxed);
        }
    }

    /// Add the capacity of a transaction (one entry per table) to `slot`.
    pub(crate) fn add_all(slot: &AtomicU64, capacity: &[ConsumedCapacity]) {
        for c in capacity {
            Self::add(slot, Some(c));
        }
    }

    pub(crate) fn enqueue(&self, capacity: &[ConsumedCapacity], messages: usize) {
        for c in capacity {
            Self::add(&self.enqueue_units, Some(c));
        }
        self.enqueued.fetch_add(
            u64::try_from(messages).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub(crate) fn snapshot(&self) -> OutboxMetrics {
        let units = |a: &AtomicU64| {
            // Precision loss past 2^53 millionths is irrelevant for a counter.
            #[allow(clippy::cast_precision_loss)]
            let v = a.load(Ordering::Relaxed) as f64 / MICRO;
            v
        };
        OutboxMetrics {
            enqueue_units: units(&self.enqueue_units),
            enqueued: self.enqueued.load(Ordering::Relaxed),
            claim_read_units: units(&self.claim_read_units),
            claim_write_units: units(&self.claim_write_units),
            body_read_units: units(&self.body_read_units),
            claimed: self.claimed.load(Ordering::Relaxed),
            settle_units: units(&self.settle_units),
            refused_writes: self.refused.load(Ordering::Relaxed),
            bodies_renewed: self.bodies_renewed.load(Ordering::Relaxed),
            body_renewal_units: units(&self.renewal_units),
            sweep_budget_waits: self.sweep_budget_waits.load(Ordering::Relaxed),
            body_sweep_errors: self.sweep_errors.load(Ordering::Relaxed),
            claim_errors: self.claim_errors.load(Ordering::Relaxed),
            settle_errors: self.settle_errors.load(Ordering::Relaxed),
            admin_units: units(&self.admin_units),
            upkeep_units: units(&self.upkeep_units),
            throttled: self.throttles.total.load(Ordering::Relaxed),
            enqueue_throttled: self.throttles.transactions.load(Ordering::Relaxed),
            oldest_due_age: match self.oldest_due_age_us.load(Ordering::Relaxed) {
                0 => None,
                age => Some(Duration::from_micros(age - 1)),
            },
            last_body_sweep: match self.swept_us.load(Ordering::Relaxed) {
                0 => None,
                swept => Some(crate::item::from_micros(swept)),
            },
        }
    }
}

/// What a [`DynamoOutbox`](crate::DynamoOutbox) and its clones consumed so far, from
/// the `ConsumedCapacity` DynamoDB returns with every request (every request the store
/// sends asks for it). A refused conditional write reports none, though it is billed. Capacity units are read
/// plus write units (transactions count double, as DynamoDB bills them).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct OutboxMetrics {
    /// Units consumed by enqueue transactions sent through
    /// [`DynamoOutbox::enqueue`](crate::DynamoOutbox::enqueue), your own writes included.
    pub enqueue_units: f64,
    /// Messages enqueued through [`DynamoOutbox::enqueue`](crate::DynamoOutbox::enqueue).
    pub enqueued: u64,
    /// Units read by claims to decide: due-index queries, order-marker queries, state
    /// item reads.
    pub claim_read_units: f64,
    /// Units written by claims' conditional updates of state items that succeeded.
    pub claim_write_units: f64,
    /// Units read by claims for the bodies of claimed messages (these grow with the
    /// payload: 0.5 unit per 4 KB, eventually consistent).
    pub body_read_units: f64,
    /// Messages claimed.
    pub claimed: u64,
    /// Units consumed by complete, fail, release and dead-lettering, and by the order
    /// markers they remove.
    pub settle_units: f64,
    /// Conditional writes DynamoDB refused: claims that lost a race, settles of lost
    /// leases, body renewals another renewer had already made. Each is billed (a body
    /// item's at its size) and shows as a failed request in CloudWatch.
    pub refused_writes: u64,
    /// Messages whose body items got their time to live pushed out by this store (by
    /// the body sweep, or by a claim, retry or release that found too little of it
    /// left; see the crate docs); renewals refused because another renewer had made
    /// them are not counted. Each renewal writes every body item, billed at its size.
    pub bodies_renewed: u64,
    /// Units consumed by body renewals and the sweep that finds them: `due` index
    /// queries, state item reads, body item writes (billed at the body's size) and the
    /// state item writes recording the new expiry. Refused renewals are billed too but
    /// not counted here: DynamoDB reports no capacity with a refused write.
    pub body_renewal_units: f64,
    /// Renewals of the body sweep that waited for its
    /// [`renewal_budget`](crate::DynamoOutboxConfig::with_renewal_budget) before
    /// writing. A steady rate means the sweep is held to the budget: fine while
    /// [`last_body_sweep`](Self::last_body_sweep) keeps moving, otherwise raise the
    /// budget (or `body_ttl`).
    pub sweep_budget_waits: u64,
    /// Requests of the body sweep that failed: a shard's `due` index query (the shard
    /// is tried again a minute later, from where its pass stood) or one message's
    /// renewal (logged; the pass goes on and the next pass looks at it again). Each is
    /// logged at `warn`. Rising while [`last_body_sweep`](Self::last_body_sweep) stops
    /// moving means bodies are not being renewed.
    pub body_sweep_errors: u64,
    /// Messages a claim could not take for a reason other than the claim write's
    /// condition: the write failed (a throttle past the SDK's retries, a timeout), or
    /// the body read after it did. Each is logged at `warn`; the claim returned the
    /// messages it did take. A message whose write may have landed is left to its
    /// lease (claimable again when it lapses, its attempt counted); one whose body read
    /// failed is released at once when that write succeeds.
    pub claim_errors: u64,
    /// Settles (complete, fail, release) whose request failed for a reason other than
    /// the fence. The call attempts every lease of the batch and then returns the
    /// error, so the relay retries it; a lease the first try applied is reported lost
    /// by the retry.
    pub settle_errors: u64,
    /// Units consumed by [`OutboxAdmin`](outbox_core::OutboxAdmin) calls: stats and
    /// dead-letter listings (index queries), requeue, discard and purge.
    pub admin_units: f64,
    /// Units consumed by the store's own upkeep: shard-lease rounds (heartbeat, lease
    /// reads and writes) and reads and writes of the table's shard count.
    pub upkeep_units: f64,
    /// Attempts of this store's requests that DynamoDB throttled, the ones the SDK
    /// retried successfully included (see
    /// [`DynamoOutbox::throttled`](crate::DynamoOutbox::throttled) for them by
    /// operation, index and reason). Any steady rate means a table or index is short of
    /// capacity (a hot `due` shard: raise the shard count) and claims and enqueues are
    /// slowed by the SDK's backoff.
    pub throttled: u64,
    /// Of [`throttled`](Self::throttled), the `TransactWriteItems` attempts: enqueues
    /// sent through [`DynamoOutbox::enqueue`](crate::DynamoOutbox::enqueue) (and the
    /// store's rare order-marker transactions). Alert on it: a throttled enqueue is
    /// your business write held back or, past the SDK's retries, failed. Enqueues you
    /// send with your own client are not seen here.
    pub enqueue_throttled: u64,
    /// Gauge, as of each shard's last sweep pass (refreshed once per
    /// [`body_sweep_every`](crate::DynamoOutboxConfig::with_body_sweep_every) per
    /// shard, not live): how long the oldest due (claimable, unclaimed) message of the
    /// shards this store sweeps had been waiting, the longest over them. `None` before
    /// the first sweep or when nothing was due. A message
    /// waiting longer than a sixteenth of
    /// [`body_ttl`](crate::DynamoOutboxConfig::with_body_ttl) has its body kept alive by
    /// sweeps alone: alert well before this reaches half of `body_ttl`, and take the
    /// maximum over relays (each sweeps the shards it owns).
    pub oldest_due_age: Option<Duration>,
    /// When the pass of this store's stalest swept shard began, over the shards it
    /// sweeps, counting completed passes only: a shard whose sweep keeps failing holds
    /// it back. `None` until every one of them completed a pass (with shard leases, a
    /// newly taken shard counts from its first pass). Bodies are safe while this is
    /// less than 7/16 of `body_ttl` ago; alert well before.
    pub last_body_sweep: Option<SystemTime>,
}
