//! The whole conformance suite against the in-memory reference store.

use outbox_testkit::MemoryHarness;

async fn harness() -> Option<MemoryHarness> {
    Some(MemoryHarness)
}

outbox_testkit::conformance_suite!(harness);
