//! The publisher suite against [`MemoryBroker`], the reference broker: proves the
//! suite's cases pass on a broker that keeps the contract.
//!
//! Run: `cargo test -p outbox-testkit --test publisher_conformance`
//!
//! [`MemoryBroker`]: outbox_testkit::MemoryBroker

use outbox_testkit::MemoryPublisherHarness;

async fn harness() -> Option<MemoryPublisherHarness> {
    Some(MemoryPublisherHarness)
}

outbox_testkit::publisher_suite!(harness);
