//! Capacity consumed by the outbox and its relays, as DynamoDB reports it: every
//! request asks for `ReturnConsumedCapacity = TOTAL`.

use std::sync::atomic::{AtomicU64, Ordering};

use outbox_dynamodb::kit::CapacityCounter;

/// Counters shared by an outbox, its clones and the relays built on them.
#[derive(Debug, Default)]
pub(crate) struct Capacity {
    pub(crate) enqueue: CapacityCounter,
    pub(crate) enqueued: AtomicU64,
    pub(crate) part_reads: CapacityCounter,
    pub(crate) dead_letters: CapacityCounter,
    pub(crate) lease_writes: CapacityCounter,
    pub(crate) lease_reads: CapacityCounter,
    pub(crate) checkpoints: AtomicU64,
}

/// What an outbox and the relays over it consumed so far (clones share it).
///
/// A message costs its enqueue's write units (a `TransactWriteItems` bills twice a
/// plain write: two units per KB of each item); reading it from the stream costs
/// stream read request units, which DynamoDB bills apart from table capacity and does
/// not report per request. The relays add lease writes (heartbeats, renewals, one
/// checkpoint per read that held messages) and lease reads, per round rather than per
/// message.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct StreamOutboxMetrics {
    /// Messages enqueued.
    pub enqueued: u64,
    /// Write units of the enqueues (your own writes in the same transaction included).
    pub enqueue_units: f64,
    /// Read units of the later parts of split messages (part 0 comes with its record).
    pub part_read_units: f64,
    /// Write units of dead letters.
    pub dead_letter_units: f64,
    /// Write units of the lease table: heartbeats, takes, renewals, checkpoints.
    pub lease_write_units: f64,
    /// Read units of the lease table (one consistent scan per round).
    pub lease_read_units: f64,
    /// Checkpoints written.
    pub checkpoints: u64,
}

impl Capacity {
    pub(crate) fn snapshot(&self) -> StreamOutboxMetrics {
        StreamOutboxMetrics {
            enqueued: self.enqueued.load(Ordering::Relaxed),
            enqueue_units: self.enqueue.units(),
            part_read_units: self.part_reads.units(),
            dead_letter_units: self.dead_letters.units(),
            lease_write_units: self.lease_writes.units(),
            lease_read_units: self.lease_reads.units(),
            checkpoints: self.checkpoints.load(Ordering::Relaxed),
        }
    }
}
